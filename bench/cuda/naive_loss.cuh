// The materialised symmetric loss the benchmark compares against: the whole
// b x b logit matrix in fp32 (cuBLASLt), row and column log-sum-exp kernels,
// G = (P + Q - 2I) s g / (2b) written as a b x b bf16 matrix, then dq = G k and
// dk = G^T q with cuBLASLt. Memory: 6 b^2 bytes beyond inputs and outputs.
// The materialised sigmoid (SigLIP) loss likewise: the b x b fp32 logits,
// one element-wise kernel for the loss terms and G = -z sigmoid(v) s / b in
// bf16 (x = s raw + t, v = -z x, z = +1 on the diagonal), then the same two
// GEMMs. Memory: 6 b^2 bytes, plus one float per 256 elements for the loss.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace bench {

void row_lse(const float *logits, std::int64_t b, float scale, float *lse, cudaStream_t stream);
void col_lse(const float *logits, std::int64_t b, float scale, float *lse, cudaStream_t stream);
void gradient_matrix(const float *logits, std::int64_t b, float scale, const float *row_lse,
                     const float *col_lse, __nv_bfloat16 *g, cudaStream_t stream);
// loss_partial: blocks_for(b * b) floats, one per block of 256 elements.
void sigmoid_gradient_matrix(const float *logits, std::int64_t b, float scale, float bias,
                             __nv_bfloat16 *g, float *loss_partial, cudaStream_t stream);
std::int64_t sigmoid_partials(std::int64_t b);
void fill_features(__nv_bfloat16 *x, std::int64_t rows, std::int64_t d, std::uint32_t seed,
                   cudaStream_t stream);

}  // namespace bench
