#include "naive_loss.cuh"

namespace bench {
namespace {

constexpr float log2e = 1.4426950408889634f;

__global__ void row_lse_kernel(const float *x, std::int64_t b, float s, float *lse) {
  __shared__ float red[256];
  const float *row = x + blockIdx.x * b;
  float m = -INFINITY;
  for (std::int64_t j = threadIdx.x; j < b; j += blockDim.x) m = fmaxf(m, s * row[j]);
  red[threadIdx.x] = m;
  __syncthreads();
  for (int h = 128; h > 0; h >>= 1) {
    if (threadIdx.x < h) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + h]);
    __syncthreads();
  }
  m = red[0];
  __syncthreads();
  float sum = 0.0f;
  for (std::int64_t j = threadIdx.x; j < b; j += blockDim.x) sum += exp2f((s * row[j] - m) * log2e);
  red[threadIdx.x] = sum;
  __syncthreads();
  for (int h = 128; h > 0; h >>= 1) {
    if (threadIdx.x < h) red[threadIdx.x] += red[threadIdx.x + h];
    __syncthreads();
  }
  if (threadIdx.x == 0) lse[blockIdx.x] = m + logf(red[0]);
}

__global__ void col_lse_kernel(const float *x, std::int64_t b, float s, float *lse) {
  const std::int64_t j = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= b) return;
  float m = -INFINITY, sum = 0.0f;
  for (std::int64_t i = 0; i < b; ++i) {
    const float v = s * x[i * b + j];
    if (v > m) {
      sum = sum * exp2f((m - v) * log2e) + 1.0f;
      m = v;
    } else {
      sum += exp2f((v - m) * log2e);
    }
  }
  lse[j] = m + logf(sum);
}

__global__ void gradient_kernel(const float *x, std::int64_t b, float s, const float *rl, const float *cl,
                                __nv_bfloat16 *g) {
  const std::int64_t n = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= b * b) return;
  const std::int64_t i = n / b, j = n % b;
  const float v = s * x[n];
  const float gt = exp2f((v - rl[i]) * log2e) + exp2f((v - cl[j]) * log2e) - (i == j ? 2.0f : 0.0f);
  g[n] = __float2bfloat16_rn(gt * s / (2.0f * float(b)));
}

__global__ void sigmoid_kernel(const float *x, std::int64_t b, float s, float t, __nv_bfloat16 *g,
                               float *loss_partial) {
  __shared__ float red[256];
  const std::int64_t n = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  float term = 0.0f;
  if (n < b * b) {
    const bool positive = n / b == n % b;
    const float logit = s * x[n] + t, v = positive ? -logit : logit;
    const float e = expf(-fabsf(v));
    term = fmaxf(v, 0.0f) + log1pf(e);
    const float sig = (v >= 0.0f ? 1.0f : e) / (1.0f + e);
    g[n] = __float2bfloat16_rn((positive ? -sig : sig) * s / float(b));
  }
  red[threadIdx.x] = term;
  __syncthreads();
  for (int h = 128; h > 0; h >>= 1) {
    if (threadIdx.x < h) red[threadIdx.x] += red[threadIdx.x + h];
    __syncthreads();
  }
  if (threadIdx.x == 0) loss_partial[blockIdx.x] = red[0];
}

__global__ void fill_kernel(__nv_bfloat16 *x, std::int64_t n, std::uint32_t seed, float amplitude) {
  const std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  std::uint32_t h = std::uint32_t(i) * 2654435761u ^ seed;
  h ^= h >> 15;
  h *= 2246822519u;
  h ^= h >> 13;
  x[i] = __float2bfloat16_rn(amplitude * (float(h & 0xffffff) / 16777216.0f - 0.5f));
}

unsigned blocks(std::int64_t n, int threads) { return unsigned((n + threads - 1) / threads); }

}  // namespace

void row_lse(const float *x, std::int64_t b, float s, float *lse, cudaStream_t stream) {
  row_lse_kernel<<<unsigned(b), 256, 0, stream>>>(x, b, s, lse);
}
void col_lse(const float *x, std::int64_t b, float s, float *lse, cudaStream_t stream) {
  col_lse_kernel<<<blocks(b, 256), 256, 0, stream>>>(x, b, s, lse);
}
void gradient_matrix(const float *x, std::int64_t b, float s, const float *rl, const float *cl,
                     __nv_bfloat16 *g, cudaStream_t stream) {
  gradient_kernel<<<blocks(b * b, 256), 256, 0, stream>>>(x, b, s, rl, cl, g);
}
std::int64_t sigmoid_partials(std::int64_t b) { return std::int64_t(blocks(b * b, 256)); }
void sigmoid_gradient_matrix(const float *x, std::int64_t b, float s, float t, __nv_bfloat16 *g,
                             float *loss_partial, cudaStream_t stream) {
  sigmoid_kernel<<<blocks(b * b, 256), 256, 0, stream>>>(x, b, s, t, g, loss_partial);
}
void fill_features(__nv_bfloat16 *x, std::int64_t rows, std::int64_t d, std::uint32_t seed, cudaStream_t stream) {
  // uniform in [-a/2, a/2) with a = sqrt(12 / d): rows of about unit norm
  fill_kernel<<<blocks(rows * d, 256), 256, 0, stream>>>(x, rows * d, seed, sqrtf(12.0f / float(d)));
}

}  // namespace bench
