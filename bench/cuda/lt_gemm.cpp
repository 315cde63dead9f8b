#include "lt_gemm.hpp"

#include <cstdio>

namespace bench {
namespace {

#define LT_CHECK(call)                                                                   \
  do {                                                                                   \
    cublasStatus_t s_ = (call);                                                          \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                   \
      std::printf("cuBLASLt: %s failed with status %d\n", #call, int(s_));               \
      return false;                                                                      \
    }                                                                                    \
  } while (0)

}  // namespace

LtGemm::LtGemm() {
  cublasLtCreate(&handle_);
  cudaMalloc(&workspace_, workspace_bytes_);
}

LtGemm::~LtGemm() {
  cudaFree(workspace_);
  cublasLtDestroy(handle_);
}

// Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: cuBLASLt
// gets the operands swapped, with the row-major leading dimensions.
bool LtGemm::run(Layout layout, std::int64_t m, std::int64_t n, std::int64_t k, const void *a,
                 const void *b, void *c, bool c_fp32, cudaStream_t stream) {
  // column-major problem: C' (n x m) = X (n x k) * Y (k x m) with X from b, Y from a
  cublasOperation_t op_x = CUBLAS_OP_N, op_y = CUBLAS_OP_N;
  std::int64_t x_rows = n, x_cols = k, y_rows = k, y_cols = m;  // stored shapes (column-major)
  switch (layout) {
    case Layout::nt: op_x = CUBLAS_OP_T, x_rows = k, x_cols = n; break;  // b: n x k row-major = k x n col
    case Layout::nn: break;                                              // b: k x n row-major = n x k col
    case Layout::tn: op_y = CUBLAS_OP_T, y_rows = m, y_cols = k; break;  // a: k x m row-major = m x k col
  }
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t lx = nullptr, ly = nullptr, lc = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  LT_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  LT_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_x, sizeof op_x));
  LT_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_y, sizeof op_y));
  LT_CHECK(cublasLtMatrixLayoutCreate(&lx, CUDA_R_16BF, x_rows, x_cols, x_rows));
  LT_CHECK(cublasLtMatrixLayoutCreate(&ly, CUDA_R_16BF, y_rows, y_cols, y_rows));
  LT_CHECK(cublasLtMatrixLayoutCreate(&lc, c_fp32 ? CUDA_R_32F : CUDA_R_16BF, n, m, n));
  LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                &workspace_bytes_, sizeof workspace_bytes_));
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  LT_CHECK(cublasLtMatmulAlgoGetHeuristic(handle_, desc, lx, ly, lc, lc, pref, 1, &heuristic, &found));
  if (found == 0) {
    std::printf("cuBLASLt: no algorithm for %lld x %lld x %lld\n", (long long)m, (long long)n, (long long)k);
    return false;
  }
  const float one = 1.0f, zero = 0.0f;
  LT_CHECK(cublasLtMatmul(handle_, desc, &one, b, lx, a, ly, &zero, c, lc, c, lc, &heuristic.algo, workspace_,
                          workspace_bytes_, stream));
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(lc);
  cublasLtMatrixLayoutDestroy(ly);
  cublasLtMatrixLayoutDestroy(lx);
  cublasLtMatmulDescDestroy(desc);
  return true;
}

}  // namespace bench
