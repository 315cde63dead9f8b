// A minimal cuBLASLt GEMM for the benchmark's baselines, in row-major terms:
//   C (m x n) = A (m x k) * B^T      (B given as n x k, row-major)   [nt]
//   C (m x n) = A (m x k) * B        (B given as k x n, row-major)   [nn]
//   C (m x n) = A^T * B              (A given as k x m, B as k x n)  [tn]
// bf16 inputs, fp32 accumulation, output bf16 or fp32; cuBLASLt's first
// heuristic algorithm with a 32 MiB workspace. The descriptors and the
// algorithm are made once per shape and kept, so that back-to-back calls at
// small shapes time the GPU, not the host's descriptor set-up.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <tuple>

namespace bench {

enum class Layout { nt, nn, tn };

class LtGemm {
 public:
  LtGemm();
  ~LtGemm();
  // Returns false (after printing why) when cuBLASLt has no algorithm.
  bool run(Layout layout, std::int64_t m, std::int64_t n, std::int64_t k, const void *a, const void *b,
           void *c, bool c_fp32, cudaStream_t stream);

  LtGemm(const LtGemm &) = delete;
  LtGemm &operator=(const LtGemm &) = delete;

 private:
  // One shape's descriptors, column-major: C' (n x m) = op(X) op(Y).
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t lx = nullptr, ly = nullptr, lc = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  using Key = std::tuple<int, std::int64_t, std::int64_t, std::int64_t, bool>;
  // The plan of a shape, made on first use; null (after printing why) when cuBLASLt refuses it.
  static void release(Plan &p);
  const Plan *plan(Layout layout, std::int64_t m, std::int64_t n, std::int64_t k, bool c_fp32);

  cublasLtHandle_t handle_ = nullptr;
  std::map<Key, Plan> plans_;
  void *workspace_ = nullptr;
  std::size_t workspace_bytes_ = std::size_t(32) << 20;
};

}  // namespace bench
