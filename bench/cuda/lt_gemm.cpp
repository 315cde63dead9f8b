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

void LtGemm::release(Plan &p) {
  if (p.lc) cublasLtMatrixLayoutDestroy(p.lc);
  if (p.ly) cublasLtMatrixLayoutDestroy(p.ly);
  if (p.lx) cublasLtMatrixLayoutDestroy(p.lx);
  if (p.desc) cublasLtMatmulDescDestroy(p.desc);
}

LtGemm::~LtGemm() {
  for (auto &entry : plans_) release(entry.second);
  cudaFree(workspace_);
  cublasLtDestroy(handle_);
}

// Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: cuBLASLt
// gets the operands swapped, with the row-major leading dimensions.
const LtGemm::Plan *LtGemm::plan(Layout layout, std::int64_t m, std::int64_t n, std::int64_t k, bool c_fp32) {
  const Key key{int(layout), m, n, k, c_fp32};
  if (auto found = plans_.find(key); found != plans_.end()) return &found->second;
  // column-major problem: C' (n x m) = X (n x k) * Y (k x m) with X from b, Y from a
  cublasOperation_t op_x = CUBLAS_OP_N, op_y = CUBLAS_OP_N;
  std::int64_t x_rows = n, x_cols = k, y_rows = k, y_cols = m;  // stored shapes (column-major)
  switch (layout) {
    case Layout::nt: op_x = CUBLAS_OP_T, x_rows = k, x_cols = n; break;  // b: n x k row-major = k x n col
    case Layout::nn: break;                                              // b: k x n row-major = n x k col
    case Layout::tn: op_y = CUBLAS_OP_T, y_rows = m, y_cols = k; break;  // a: k x m row-major = m x k col
  }
  Plan p;
  cublasLtMatmulPreference_t pref = nullptr;
  const auto made = [&]() -> bool {
    LT_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    LT_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_x, sizeof op_x));
    LT_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_y, sizeof op_y));
    LT_CHECK(cublasLtMatrixLayoutCreate(&p.lx, CUDA_R_16BF, x_rows, x_cols, x_rows));
    LT_CHECK(cublasLtMatrixLayoutCreate(&p.ly, CUDA_R_16BF, y_rows, y_cols, y_rows));
    LT_CHECK(cublasLtMatrixLayoutCreate(&p.lc, c_fp32 ? CUDA_R_32F : CUDA_R_16BF, n, m, n));
    LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                  &workspace_bytes_, sizeof workspace_bytes_));
    cublasLtMatmulHeuristicResult_t heuristic{};
    int found = 0;
    LT_CHECK(cublasLtMatmulAlgoGetHeuristic(handle_, p.desc, p.lx, p.ly, p.lc, p.lc, pref, 1, &heuristic, &found));
    if (found == 0) {
      std::printf("cuBLASLt: no algorithm for %lld x %lld x %lld\n", (long long)m, (long long)n, (long long)k);
      return false;
    }
    p.algo = heuristic.algo;
    return true;
  };
  const bool ok = made();
  if (pref) cublasLtMatmulPreferenceDestroy(pref);
  if (!ok) {
    release(p);
    return nullptr;
  }
  return &plans_.emplace(key, p).first->second;
}

bool LtGemm::run(Layout layout, std::int64_t m, std::int64_t n, std::int64_t k, const void *a,
                 const void *b, void *c, bool c_fp32, cudaStream_t stream) {
  const Plan *p = plan(layout, m, n, k, c_fp32);
  if (p == nullptr) return false;
  const float one = 1.0f, zero = 0.0f;
  LT_CHECK(cublasLtMatmul(handle_, p->desc, &one, b, p->lx, a, p->ly, &zero, c, p->lc, c, p->lc, &p->algo,
                          workspace_, workspace_bytes_, stream));
  return true;
}

}  // namespace bench
