# Install rules of the Python wheel (FLATMEM_PYTHON_WHEEL=ON; pyproject.toml sets it and
# scikit-build-core installs into the wheel's platlib folder). Instead of lib/ and include/:
#   flatmem/libflatmem.so.1        the library (its SONAME, libflatmem.so.${FLATMEM_ABI_VERSION}), one
#                                  file (a wheel holds no symlinks, so no libflatmem.so.0.2.0 + links:
#                                  the VERSION property is dropped)
#   flatmem/_capi*.so, capi.py     the SWIG extension (bindings/python/CMakeLists.txt)
#   flatmem_jax/libflatmem_jax.so  the XLA FFI plugin (bindings/jax/CMakeLists.txt), when the
#                                  building interpreter has jaxlib (FLATMEM_PYTHON_JAX)
# The Python sources come from pyproject.toml's wheel.packages.
find_package(Python3 REQUIRED COMPONENTS Interpreter Development.Module)  # scikit-build-core's
set_property(TARGET flatmem PROPERTY VERSION)
install(TARGETS flatmem LIBRARY DESTINATION flatmem NAMELINK_SKIP)

add_subdirectory(bindings/python)

# The JAX plugin needs jaxlib's XLA FFI headers at build time (pip's isolated build gets
# jaxlib from pyproject.toml's build requirements). AUTO: build it when jaxlib imports.
set(FLATMEM_PYTHON_JAX AUTO CACHE STRING "AUTO|ON|OFF: the JAX plugin in the wheel")
set_property(CACHE FLATMEM_PYTHON_JAX PROPERTY STRINGS AUTO ON OFF)
if(NOT FLATMEM_PYTHON_JAX MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "FLATMEM_PYTHON_JAX must be AUTO, ON or OFF, not '${FLATMEM_PYTHON_JAX}'")
endif()
set(FLATMEM_WHEEL_HAS_JAX OFF)
if(NOT FLATMEM_PYTHON_JAX STREQUAL "OFF")
  execute_process(COMMAND ${Python3_EXECUTABLE} -c "import jaxlib"
                  RESULT_VARIABLE _jaxlib_rc OUTPUT_QUIET ERROR_QUIET)
  if(_jaxlib_rc EQUAL 0)
    set(FLATMEM_WHEEL_HAS_JAX ON)
  elseif(FLATMEM_PYTHON_JAX STREQUAL "ON")
    message(FATAL_ERROR "FLATMEM_PYTHON_JAX=ON but ${Python3_EXECUTABLE} cannot import jaxlib")
  else()
    message(WARNING "the wheel has no JAX plugin: ${Python3_EXECUTABLE} cannot import jaxlib "
                    "(flatmem.jax will say so when imported)")
  endif()
endif()
if(FLATMEM_WHEEL_HAS_JAX)
  set(FLATMEM_JAX_WITH_CUDA ${FLATMEM_HAVE_CUDA})
  set(FLATMEM_JAX_INSTALL_DIR flatmem_jax)
  set(FLATMEM_JAX_RPATH "$ORIGIN/../flatmem")
  add_subdirectory(bindings/jax)
endif()
message(STATUS "flatmem wheel: SWIG extension, JAX plugin ${FLATMEM_WHEEL_HAS_JAX}, CUDA ${FLATMEM_HAVE_CUDA}")
