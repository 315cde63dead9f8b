# flatmem::blas -- a CBLAS providing cblas_sgemm. Default: OpenBLAS (Debian's
# libopenblas-dev). Any CBLAS works: set BLA_VENDOR (FindBLAS) to choose.
if(NOT DEFINED BLA_VENDOR)
  set(BLA_VENDOR OpenBLAS)
endif()
find_package(BLAS REQUIRED)
find_path(CBLAS_INCLUDE_DIR cblas.h PATH_SUFFIXES openblas x86_64-linux-gnu REQUIRED)
add_library(flatmem_blas INTERFACE)
target_link_libraries(flatmem_blas INTERFACE ${BLAS_LIBRARIES})
target_include_directories(flatmem_blas SYSTEM INTERFACE ${CBLAS_INCLUDE_DIR})
add_library(flatmem::blas ALIAS flatmem_blas)
set(FLATMEM_BLAS_DESCRIPTION "BLAS ${BLA_VENDOR}: ${BLAS_LIBRARIES}")
