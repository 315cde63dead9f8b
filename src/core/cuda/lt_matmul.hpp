// Row-major matrix products on cuBLASLt, shared by the CUDA built-in blocks
// (reversible/blocks/cuda/matmul.hpp: fp32) and the contrastive panel engine
// (contrastive/panels/cuda/: bf16 / fp16 / fp32 operands, fp32 results):
//   C[i] = alpha op(A[i]) op(B[i]) + beta C[i] (+ bias on every row of C),
//   i < batch, op(X) = X or X^T, every matrix row-major with its own leading
//   dimension (elements between rows) and batch stride (elements between
//   items). A and B have one element type (fp32, bf16 or fp16); C is fp32.
// The algorithm of a shape is chosen once per process (cuBLASLt's first
// heuristic for its descriptors, the operands' alignment and the workspace
// given) and reused, so a shape's results are the same bits on every call;
// its descriptors are built once with it, so a repeated shape (the panel
// engine's thousands of panels) costs one map lookup and cublasLtMatmul.
// `fixed_order` limits split-K to cuBLASLt's in-place and no-reduction
// schemes (partial sums added in a fixed sequence). Enqueued on the stream;
// nothing synchronises.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace flatmem::cuda::lt {

enum class Type { f32, bf16, f16 };

struct MatrixArg {
  const void *data = nullptr;
  Type type = Type::f32;
  std::int64_t ld = 0;            // row-major leading dimension of the stored matrix
  bool transposed = false;        // op(X) = X^T: X is stored (k x m) for A, (n x k) for B
  std::int64_t batch_stride = 0;  // elements between batch items
};

struct Gemm {
  std::int64_t m = 0, n = 0, k = 0;  // op(A) is m x k, op(B) is k x n, C is m x n
  std::int64_t batch = 1;
  MatrixArg a, b;  // a.type == b.type
  float *c = nullptr;
  std::int64_t ldc = 0, c_batch_stride = 0;
  float alpha = 1.0f, beta = 0.0f;
  const float *bias = nullptr;  // n floats added to every row of C (batch 1 only)
};

struct Context {
  int device = 0;
  bool tf32 = false;         // fp32 operands: TF32 tensor cores (else full fp32)
  bool fixed_order = false;  // split-K only as in-place / none (see above)
  cudaStream_t stream = nullptr;
  void *workspace = nullptr;  // workspace_alignment-aligned device memory for this stream
  std::size_t workspace_bytes = 0;
};

// cublasLtMatmul's workspace pointer must be aligned to this many bytes (else
// CUBLAS_STATUS_INVALID_VALUE); matmul() checks it.
inline constexpr std::size_t workspace_alignment = 256;

// Throws flatmem::Error: UNSUPPORTED when cuBLASLt cannot be opened or has no
// algorithm for the shape, INTERNAL naming the shape when the call fails.
void matmul(const Context &context, const Gemm &g);

}  // namespace flatmem::cuda::lt
