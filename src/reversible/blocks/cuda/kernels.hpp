// Our kernels of the CUDA built-in blocks (everything but the products):
// launchers that enqueue on `stream` and check the launch. The math is the
// CPU blocks' (reversible/blocks/cpu/*.hpp); every reduction runs in a fixed
// order (per-lane sums in index order, then a fixed butterfly; column sums
// over fixed row chunks, then the chunks in order), so results do not depend
// on scheduling.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace flatmem::blocks::cuda {

// y = LN(x) row by row (rows x width), with the row's mean and 1/std.
void layer_norm_forward(cudaStream_t stream, const float *x, std::int64_t rows, std::int64_t width,
                        const float *gamma, const float *beta, float eps, float *y, float *mean,
                        float *rstd);

// dx += the LayerNorm input gradient of dy (rows x width).
void layer_norm_backward(cudaStream_t stream, const float *x, const float *mean, const float *rstd,
                         const float *dy, std::int64_t rows, std::int64_t width, const float *gamma,
                         float *dx);

// Scratch floats column_sums / layer_norm_parameter_grads need for (rows, cols).
std::int64_t column_sum_scratch(std::int64_t rows, std::int64_t cols);

// out[c] += sum_r a[r * cols + c].
void column_sums(cudaStream_t stream, const float *a, std::int64_t rows, std::int64_t cols, float *out,
                 float *scratch);

// dgamma[c] += sum_r dy_rc xhat_rc, dbeta[c] += sum_r dy_rc.
void layer_norm_parameter_grads(cudaStream_t stream, const float *x, const float *mean, const float *rstd,
                                const float *dy, std::int64_t rows, std::int64_t width, float *dgamma,
                                float *dbeta, float *scratch);

// Each of `rows` rows of n: s = softmax(s), in place.
void softmax_rows(cudaStream_t stream, float *s, std::int64_t rows, std::int64_t n);

// dp = scale * p o (dp - rowsum(p o dp)), in place.
void softmax_backward_rows(cudaStream_t stream, const float *p, float *dp, std::int64_t rows,
                           std::int64_t n, float scale);

// g = GELU(u) (exact, erf form), n elements.
void gelu(cudaStream_t stream, const float *u, std::int64_t n, float *g);

// g = GELU(u); d *= GELU'(u).
void gelu_backward(cudaStream_t stream, const float *u, std::int64_t n, float *g, float *d);

// Between the token-row layout (batch * tokens rows of parts * width
// columns: part p, head h at columns p * width + h * head_dim ...) and the
// head layout (parts, batch, heads, tokens, head_dim), contiguous.
struct HeadLayout {
  std::int64_t parts = 1, batch = 1, heads = 1, tokens = 1, head_dim = 1;
};
void rows_to_heads(cudaStream_t stream, const HeadLayout &l, const float *rows, float *heads);
void heads_to_rows(cudaStream_t stream, const HeadLayout &l, const float *heads, float *rows);

}  // namespace flatmem::blocks::cuda
