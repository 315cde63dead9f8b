// Row-major fp32 matrix products on cuBLASLt for the CUDA built-in blocks:
//   C[i] = alpha op(A[i]) op(B[i]) + beta C[i] (+ bias on every row of C),
//   i < batch, op(X) = X or X^T, every matrix row-major with its own leading
//   dimension (elements between rows) and batch stride (elements between items).
// The algorithm of a shape is chosen once per process (cuBLASLt's first
// heuristic for its descriptors and the operands' alignment) and reused, so
// a shape's results are the same bits on every call. Enqueued on `stream`;
// nothing synchronises.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace flatmem::blocks::cuda {

struct Operand {
  const float *data = nullptr;
  std::int64_t ld = 0;            // row-major leading dimension of the stored matrix
  bool transposed = false;        // op(X) = X^T: X is stored (k x m) for A, (n x k) for B
  std::int64_t batch_stride = 0;  // elements between batch items
};

struct Product {
  std::int64_t m = 0, n = 0, k = 0;  // op(A) is m x k, op(B) is k x n, C is m x n
  std::int64_t batch = 1;
  Operand a, b;
  float *c = nullptr;
  std::int64_t ldc = 0, c_batch_stride = 0;
  float alpha = 1.0f, beta = 0.0f;
  const float *bias = nullptr;  // n floats added to every row of C (batch 1 only)
};

// One unbatched product with a compact C (ldc = n): C = op(A) op(B) + bias
// (beta 0), or C += op(A) op(B) (beta 1, a weight gradient).
inline Product single_product(std::int64_t m, std::int64_t n, std::int64_t k, Operand a, Operand b, float *c,
                              const float *bias = nullptr, float beta = 0.0f) {
  Product p;
  p.m = m, p.n = n, p.k = k;
  p.a = a, p.b = b;
  p.c = c, p.ldc = n;
  p.bias = bias, p.beta = beta;
  return p;
}

// Per call: the device, math (TF32 or not) and cuBLASLt workspace (device
// memory that only this stream uses until the stream has passed the call).
struct MatmulContext {
  int device = 0;
  bool tf32 = false;
  cudaStream_t stream = nullptr;
  void *workspace = nullptr;
  std::size_t workspace_bytes = 0;
};

// Workspace bytes a MatmulContext should carry (cuBLASLt's recommendation
// for Hopper-class GPUs).
inline constexpr std::size_t matmul_workspace_bytes = std::size_t(32) << 20;
// cublasLtMatmul's workspace pointer must be aligned to this many bytes (else
// CUBLAS_STATUS_INVALID_VALUE); matmul() checks it.
inline constexpr std::size_t matmul_workspace_alignment = 256;

void matmul(const MatmulContext &context, const Product &p);

// The parameter gradients of a linear layer out = input W + b over `rows`
// rows: dW (in x out) += input^T dy, db (out) += the column sums of dy.
// `columns` is column_sum_scratch(rows, out) floats (kernels.hpp).
void linear_parameter_grads(const MatmulContext &context, const float *input, const float *dy, std::int64_t rows,
                            std::int64_t in, std::int64_t out, float *dW, float *db, float *columns);

}  // namespace flatmem::blocks::cuda
