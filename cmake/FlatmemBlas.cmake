# flatmem::blas -- the CBLAS sgemm behind the CPU tile products.
#
# flatmem runs its own threads (one sgemm call per tile, the tiles in parallel),
# so it wants a single-threaded BLAS that no other code in the process can
# reconfigure. FLATMEM_BLAS chooses:
#   SERIAL_STATIC  Debian's single-threaded OpenBLAS archive (libopenblas-serial-dev),
#                  linked privately into libflatmem with its symbols hidden: no
#                  clash with the host's BLAS and no global thread setting to fight.
#                  Measured here: backward 2.3x faster than calling the threaded
#                  libopenblas.so from flatmem's threads.
#   SYSTEM         whatever FindBLAS finds (BLA_VENDOR selects); correct with any
#                  CBLAS, slower when that BLAS threads each call itself.
#   AUTO           (default) SERIAL_STATIC when the archive exists, else SYSTEM.
set(FLATMEM_BLAS AUTO CACHE STRING "AUTO|SERIAL_STATIC|SYSTEM")
set_property(CACHE FLATMEM_BLAS PROPERTY STRINGS AUTO SERIAL_STATIC SYSTEM)

set(_arch_dir ${CMAKE_LIBRARY_ARCHITECTURE})
if(NOT _arch_dir)
  set(_arch_dir x86_64-linux-gnu)
endif()
find_file(FLATMEM_SERIAL_OPENBLAS_ARCHIVE libopenblas.a
          PATHS /usr/lib/${_arch_dir}/openblas-serial NO_DEFAULT_PATH)
find_path(FLATMEM_SERIAL_CBLAS_INCLUDE_DIR cblas.h
          PATHS /usr/include/${_arch_dir}/openblas-serial NO_DEFAULT_PATH)

add_library(flatmem_blas INTERFACE)
if(FLATMEM_BLAS STREQUAL "SERIAL_STATIC" OR
   (FLATMEM_BLAS STREQUAL "AUTO" AND FLATMEM_SERIAL_OPENBLAS_ARCHIVE AND FLATMEM_SERIAL_CBLAS_INCLUDE_DIR))
  if(NOT FLATMEM_SERIAL_OPENBLAS_ARCHIVE OR NOT FLATMEM_SERIAL_CBLAS_INCLUDE_DIR)
    message(FATAL_ERROR "FLATMEM_BLAS=SERIAL_STATIC needs Debian's libopenblas-serial-dev")
  endif()
  target_link_libraries(flatmem_blas INTERFACE ${FLATMEM_SERIAL_OPENBLAS_ARCHIVE} "-Wl,--exclude-libs,ALL")
  target_include_directories(flatmem_blas SYSTEM INTERFACE ${FLATMEM_SERIAL_CBLAS_INCLUDE_DIR})
  set(FLATMEM_BLAS_DESCRIPTION "single-threaded OpenBLAS linked privately (${FLATMEM_SERIAL_OPENBLAS_ARCHIVE})")
elseif(FLATMEM_BLAS MATCHES "^(AUTO|SYSTEM)$")
  if(NOT DEFINED BLA_VENDOR)
    set(BLA_VENDOR OpenBLAS)
  endif()
  find_package(BLAS REQUIRED)
  find_path(CBLAS_INCLUDE_DIR cblas.h PATH_SUFFIXES openblas x86_64-linux-gnu REQUIRED)
  target_link_libraries(flatmem_blas INTERFACE ${BLAS_LIBRARIES})
  target_include_directories(flatmem_blas SYSTEM INTERFACE ${CBLAS_INCLUDE_DIR})
  set(FLATMEM_BLAS_DESCRIPTION "system BLAS ${BLA_VENDOR}: ${BLAS_LIBRARIES} (install libopenblas-serial-dev for the faster private serial OpenBLAS)")
else()
  message(FATAL_ERROR "FLATMEM_BLAS must be AUTO, SERIAL_STATIC or SYSTEM, not '${FLATMEM_BLAS}'")
endif()
add_library(flatmem::blas ALIAS flatmem_blas)
