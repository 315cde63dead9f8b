# flatmem::blas -- the CBLAS sgemm behind the CPU tile products.
#
# flatmem runs its own threads (one sgemm call per tile, the tiles in parallel),
# so it wants a single-threaded BLAS that no other code in the process can
# reconfigure. FLATMEM_BLAS chooses:
#   PRIVATE_OPENBLAS  Debian's OpenBLAS archive (libopenblas-pthread-dev, pulled in by
#                  libopenblas-dev) linked privately into libflatmem with its symbols
#                  hidden. Being private, flatmem may set *its* copy to one thread per
#                  call (src/core/blas.cpp) without touching the host's BLAS. Measured
#                  here: backward 2.3x faster than calling a threaded libopenblas.so
#                  from flatmem's threads.
#                  Not the "serial" archive (libopenblas-serial-dev): Debian builds it
#                  without USE_LOCKING, so concurrent calls from several threads share
#                  its buffers and return wrong results (our determinism test caught it).
#   SYSTEM         whatever FindBLAS finds (BLA_VENDOR selects). It must be safe to
#                  call from several threads at once; it is slower when it also
#                  threads each call itself (set e.g. OPENBLAS_NUM_THREADS=1).
#   AUTO           (default) PRIVATE_OPENBLAS when the archive exists, else SYSTEM.
set(FLATMEM_BLAS AUTO CACHE STRING "AUTO|PRIVATE_OPENBLAS|SYSTEM")
set_property(CACHE FLATMEM_BLAS PROPERTY STRINGS AUTO PRIVATE_OPENBLAS SYSTEM)

set(_arch_dir ${CMAKE_LIBRARY_ARCHITECTURE})
if(NOT _arch_dir)
  set(_arch_dir x86_64-linux-gnu)
endif()
find_file(FLATMEM_OPENBLAS_ARCHIVE libopenblas.a
          PATHS /usr/lib/${_arch_dir}/openblas-pthread NO_DEFAULT_PATH)
find_path(FLATMEM_OPENBLAS_INCLUDE_DIR cblas.h
          PATHS /usr/include/${_arch_dir}/openblas-pthread NO_DEFAULT_PATH)

add_library(flatmem_blas INTERFACE)
if(FLATMEM_BLAS STREQUAL "PRIVATE_OPENBLAS" OR
   (FLATMEM_BLAS STREQUAL "AUTO" AND FLATMEM_OPENBLAS_ARCHIVE AND FLATMEM_OPENBLAS_INCLUDE_DIR))
  if(NOT FLATMEM_OPENBLAS_ARCHIVE OR NOT FLATMEM_OPENBLAS_INCLUDE_DIR)
    message(FATAL_ERROR "FLATMEM_BLAS=PRIVATE_OPENBLAS needs Debian's libopenblas-pthread-dev")
  endif()
  target_link_libraries(flatmem_blas INTERFACE ${FLATMEM_OPENBLAS_ARCHIVE} Threads::Threads
                                               "-Wl,--exclude-libs,ALL")
  target_include_directories(flatmem_blas SYSTEM INTERFACE ${FLATMEM_OPENBLAS_INCLUDE_DIR})
  target_compile_definitions(flatmem_blas INTERFACE FLATMEM_PRIVATE_OPENBLAS)
  set(FLATMEM_BLAS_DESCRIPTION "OpenBLAS linked privately, one thread per call (${FLATMEM_OPENBLAS_ARCHIVE})")
elseif(FLATMEM_BLAS MATCHES "^(AUTO|SYSTEM)$")
  if(NOT DEFINED BLA_VENDOR)
    set(BLA_VENDOR OpenBLAS)
  endif()
  find_package(BLAS REQUIRED)
  find_path(CBLAS_INCLUDE_DIR cblas.h PATH_SUFFIXES openblas x86_64-linux-gnu REQUIRED)
  target_link_libraries(flatmem_blas INTERFACE ${BLAS_LIBRARIES})
  target_include_directories(flatmem_blas SYSTEM INTERFACE ${CBLAS_INCLUDE_DIR})
  set(FLATMEM_BLAS_DESCRIPTION "system BLAS ${BLA_VENDOR}: ${BLAS_LIBRARIES} (install libopenblas-pthread-dev for the faster private OpenBLAS)")
else()
  message(FATAL_ERROR "FLATMEM_BLAS must be AUTO, PRIVATE_OPENBLAS or SYSTEM, not '${FLATMEM_BLAS}'")
endif()
add_library(flatmem::blas ALIAS flatmem_blas)
