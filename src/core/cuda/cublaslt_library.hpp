// cuBLASLt, opened at run time like NCCL (comm/nccl/nccl_library.hpp):
// libflatmem is not linked against it, so a CUDA build still loads and runs
// its CPU parts (and its CUDA kernels that need no GEMM) where cuBLASLt is
// absent. The first CUDA built-in block call opens, in this order:
//   1. $FLATMEM_CUBLASLT_LIBRARY (a path or a file name), when set and non-empty;
//   2. "libcublasLt.so.<major>" through the dynamic loader's search, <major>
//      being the cuBLAS major version of the headers flatmem was built with;
//   3. the library found when flatmem was configured (FLATMEM_CUBLASLT_CONFIGURED_PATH).
// The library's major version must equal the headers' (its enums and
// attribute layouts are what the headers say only within one major).
#pragma once

#include <cublasLt.h>

#include <string>

namespace flatmem::cuda::lt {

struct Api {
  decltype(&cublasLtGetVersion) GetVersion;
  decltype(&cublasLtGetStatusString) GetStatusString;
  decltype(&cublasLtCreate) Create;
  decltype(&cublasLtMatmulDescCreate) MatmulDescCreate;
  decltype(&cublasLtMatmulDescDestroy) MatmulDescDestroy;
  decltype(&cublasLtMatmulDescSetAttribute) MatmulDescSetAttribute;
  decltype(&cublasLtMatrixLayoutCreate) MatrixLayoutCreate;
  decltype(&cublasLtMatrixLayoutDestroy) MatrixLayoutDestroy;
  decltype(&cublasLtMatrixLayoutSetAttribute) MatrixLayoutSetAttribute;
  decltype(&cublasLtMatmulPreferenceCreate) MatmulPreferenceCreate;
  decltype(&cublasLtMatmulPreferenceDestroy) MatmulPreferenceDestroy;
  decltype(&cublasLtMatmulPreferenceSetAttribute) MatmulPreferenceSetAttribute;
  decltype(&cublasLtMatmulAlgoGetHeuristic) MatmulAlgoGetHeuristic;
  decltype(&cublasLtMatmul) Matmul;

  std::size_t version = 0;  // cublasLtGetVersion, e.g. 130100
  std::string where;        // the file that was opened
};

// The loaded library (opened once per process, never closed). Throws
// flatmem::Error UNSUPPORTED naming every place tried, the missing symbols or
// the version mismatch. Thread-safe.
const Api &api();

// Throws FLATMEM_STATUS_INTERNAL "<what>: cuBLASLt <status text>" unless status is SUCCESS.
void check(cublasStatus_t status, const char *what);

}  // namespace flatmem::cuda::lt
