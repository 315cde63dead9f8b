#include "reversible/blocks/cuda/kernels.hpp"

#include <algorithm>

#include "core/cuda/device.hpp"

namespace flatmem::blocks::cuda {
namespace {

using flatmem::cuda::check_launch;

constexpr int warp = 32;
constexpr int row_warps = 8;            // rows (one per warp) per block of the row kernels
constexpr long long max_blocks = 1 << 16;  // grid-stride beyond this

unsigned blocks_for(long long items, long long per_block) {
  return unsigned(std::clamp<long long>((items + per_block - 1) / per_block, 1, max_blocks));
}

__device__ float warp_sum(float v) {
  for (int offset = warp / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ float warp_max(float v) {
  for (int offset = warp / 2; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// The warp's first row and the stride between its rows (grid-stride).
struct WarpRows {
  long long first, stride;
  int lane;
};
__device__ WarpRows warp_rows() {
  return {(long long)blockIdx.x * row_warps + threadIdx.x / warp, (long long)gridDim.x * row_warps,
          int(threadIdx.x % warp)};
}

__global__ void layer_norm_forward_kernel(const float *__restrict__ x, long long rows, long long width,
                                          const float *__restrict__ gamma, const float *__restrict__ beta,
                                          float eps, float *__restrict__ y, float *__restrict__ mean,
                                          float *__restrict__ rstd) {
  const WarpRows w = warp_rows();
  for (long long r = w.first; r < rows; r += w.stride) {
    const float *xr = x + r * width;
    float sum = 0.0f;
    for (long long c = w.lane; c < width; c += warp) sum += xr[c];
    const float mu = warp_sum(sum) / float(width);
    float squares = 0.0f;
    for (long long c = w.lane; c < width; c += warp) {
      const float d = xr[c] - mu;
      squares += d * d;
    }
    const float rs = 1.0f / sqrtf(warp_sum(squares) / float(width) + eps);
    float *yr = y + r * width;
    for (long long c = w.lane; c < width; c += warp) yr[c] = (xr[c] - mu) * rs * gamma[c] + beta[c];
    if (w.lane == 0) {
      mean[r] = mu;
      rstd[r] = rs;
    }
  }
}

__global__ void layer_norm_backward_kernel(const float *__restrict__ x, const float *__restrict__ mean,
                                           const float *__restrict__ rstd, const float *__restrict__ dy,
                                           long long rows, long long width, const float *__restrict__ gamma,
                                           float *__restrict__ dx) {
  const WarpRows w = warp_rows();
  for (long long r = w.first; r < rows; r += w.stride) {
    const float *xr = x + r * width, *dyr = dy + r * width;
    const float mu = mean[r], rs = rstd[r];
    float sum_g = 0.0f, sum_gx = 0.0f;
    for (long long c = w.lane; c < width; c += warp) {
      const float g = dyr[c] * gamma[c];
      sum_g += g;
      sum_gx += g * ((xr[c] - mu) * rs);
    }
    const float mean_g = warp_sum(sum_g) / float(width), mean_gx = warp_sum(sum_gx) / float(width);
    float *dxr = dx + r * width;
    for (long long c = w.lane; c < width; c += warp) {
      const float xhat = (xr[c] - mu) * rs;
      dxr[c] += rs * (dyr[c] * gamma[c] - mean_g - xhat * mean_gx);
    }
  }
}

// --- column sums: fixed chunks of rows, then the chunks in order --------------------

constexpr int column_tile = 32, column_lanes = 8;
constexpr long long max_chunks = 4096;

long long chunk_rows_for(long long rows) {
  return std::max<long long>(256, (rows + max_chunks - 1) / max_chunks);
}
long long chunks_for(long long rows) { return (rows + chunk_rows_for(rows) - 1) / chunk_rows_for(rows); }

// partial0[chunk * cols + c] = sum over the chunk's rows of dy_rc (LayerNorm:
// of dy_rc xhat_rc, and partial1 of dy_rc).
template <bool LayerNorm>
__global__ void column_partials_kernel(const float *__restrict__ dy, const float *__restrict__ x,
                                       const float *__restrict__ mean, const float *__restrict__ rstd,
                                       long long rows, long long cols, long long chunk_rows,
                                       float *__restrict__ partial0, float *__restrict__ partial1) {
  __shared__ float sums0[column_lanes][column_tile + 1], sums1[column_lanes][column_tile + 1];
  const long long chunk = blockIdx.x, begin = chunk * chunk_rows;
  const long long end = begin + chunk_rows < rows ? begin + chunk_rows : rows;
  for (long long tile = blockIdx.y; tile * column_tile < cols; tile += gridDim.y) {
    const long long c = tile * column_tile + threadIdx.x;
    float v0 = 0.0f, v1 = 0.0f;
    if (c < cols)
      for (long long r = begin + threadIdx.y; r < end; r += column_lanes) {
        const float d = dy[r * cols + c];
        if (LayerNorm) {
          v0 += d * ((x[r * cols + c] - mean[r]) * rstd[r]);
          v1 += d;
        } else {
          v0 += d;
        }
      }
    sums0[threadIdx.y][threadIdx.x] = v0;
    sums1[threadIdx.y][threadIdx.x] = v1;
    __syncthreads();
    if (threadIdx.y == 0 && c < cols) {
      float t0 = 0.0f, t1 = 0.0f;
      for (int i = 0; i < column_lanes; ++i) {
        t0 += sums0[i][threadIdx.x];
        t1 += sums1[i][threadIdx.x];
      }
      partial0[chunk * cols + c] = t0;
      if (LayerNorm) partial1[chunk * cols + c] = t1;
    }
    __syncthreads();
  }
}

__global__ void column_finish_kernel(const float *__restrict__ partial, long long chunks, long long cols,
                                     float *__restrict__ out) {
  for (long long c = (long long)blockIdx.x * blockDim.x + threadIdx.x; c < cols;
       c += (long long)gridDim.x * blockDim.x) {
    float t = 0.0f;
    for (long long k = 0; k < chunks; ++k) t += partial[k * cols + c];
    out[c] += t;
  }
}

template <bool LayerNorm>
void column_reduce(cudaStream_t stream, const float *dy, const float *x, const float *mean, const float *rstd,
                   long long rows, long long cols, float *out0, float *out1, float *scratch) {
  const long long chunks = chunks_for(rows);
  float *partial0 = scratch, *partial1 = scratch + chunks * cols;
  const dim3 grid(unsigned(chunks), unsigned(std::min<long long>((cols + column_tile - 1) / column_tile, 65535)));
  column_partials_kernel<LayerNorm><<<grid, dim3(column_tile, column_lanes), 0, stream>>>(
      dy, x, mean, rstd, rows, cols, chunk_rows_for(rows), partial0, partial1);
  check_launch(cudaGetLastError(), "blocks: column sums");
  column_finish_kernel<<<blocks_for(cols, 256), 256, 0, stream>>>(partial0, chunks, cols, out0);
  if (LayerNorm) column_finish_kernel<<<blocks_for(cols, 256), 256, 0, stream>>>(partial1, chunks, cols, out1);
  check_launch(cudaGetLastError(), "blocks: column sums");
}

// --- softmax and GELU ----------------------------------------------------------------

__global__ void softmax_kernel(float *__restrict__ s, long long rows, long long n) {
  const WarpRows w = warp_rows();
  for (long long r = w.first; r < rows; r += w.stride) {
    float *row = s + r * n;
    float m = -INFINITY;
    for (long long c = w.lane; c < n; c += warp) m = fmaxf(m, row[c]);
    m = warp_max(m);
    float sum = 0.0f;
    for (long long c = w.lane; c < n; c += warp) {
      const float e = expf(row[c] - m);
      row[c] = e;
      sum += e;
    }
    const float inverse = 1.0f / warp_sum(sum);
    for (long long c = w.lane; c < n; c += warp) row[c] *= inverse;
  }
}

__global__ void softmax_backward_kernel(const float *__restrict__ p, float *__restrict__ dp, long long rows,
                                        long long n, float scale) {
  const WarpRows w = warp_rows();
  for (long long r = w.first; r < rows; r += w.stride) {
    const float *pr = p + r * n;
    float *dr = dp + r * n;
    float dot = 0.0f;
    for (long long c = w.lane; c < n; c += warp) dot += pr[c] * dr[c];
    dot = warp_sum(dot);
    for (long long c = w.lane; c < n; c += warp) dr[c] = scale * pr[c] * (dr[c] - dot);
  }
}

// GELU(u) = u Phi(u), GELU'(u) = Phi(u) + u phi(u); normcdff keeps Phi
// accurate relative to itself in the negative tail.
__global__ void gelu_kernel(const float *__restrict__ u, long long n, float *__restrict__ g,
                            float *__restrict__ d) {
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x) {
    const float v = u[i], cdf = normcdff(v);
    g[i] = v * cdf;
    if (d != nullptr) d[i] *= cdf + v * (expf(-0.5f * v * v) * 0.39894228040143268f);
  }
}

// --- head layout -----------------------------------------------------------------------

template <bool ToHeads>
__global__ void permute_heads_kernel(HeadLayout l, const float *__restrict__ from, float *__restrict__ to) {
  const long long d = l.head_dim, T = l.tokens, H = l.heads, B = l.batch;
  const long long width = H * d, row_length = l.parts * width;
  const long long total = l.parts * B * H * T * d;
  for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total;
       e += (long long)gridDim.x * blockDim.x) {
    const long long j = e % d, t = e / d % T, h = e / (d * T) % H, b = e / (d * T * H) % B;
    const long long part = e / (d * T * H * B);
    const long long row_index = (b * T + t) * row_length + part * width + h * d + j;
    if (ToHeads)
      to[e] = from[row_index];
    else
      to[row_index] = from[e];
  }
}

}  // namespace

void layer_norm_forward(cudaStream_t stream, const float *x, std::int64_t rows, std::int64_t width,
                        const float *gamma, const float *beta, float eps, float *y, float *mean, float *rstd) {
  layer_norm_forward_kernel<<<blocks_for(rows, row_warps), row_warps * warp, 0, stream>>>(
      x, rows, width, gamma, beta, eps, y, mean, rstd);
  check_launch(cudaGetLastError(), "blocks: LayerNorm");
}

void layer_norm_backward(cudaStream_t stream, const float *x, const float *mean, const float *rstd,
                         const float *dy, std::int64_t rows, std::int64_t width, const float *gamma, float *dx) {
  layer_norm_backward_kernel<<<blocks_for(rows, row_warps), row_warps * warp, 0, stream>>>(
      x, mean, rstd, dy, rows, width, gamma, dx);
  check_launch(cudaGetLastError(), "blocks: LayerNorm backward");
}

std::int64_t column_sum_scratch(std::int64_t rows, std::int64_t cols) { return 2 * chunks_for(rows) * cols; }

void column_sums(cudaStream_t stream, const float *a, std::int64_t rows, std::int64_t cols, float *out,
                 float *scratch) {
  column_reduce<false>(stream, a, nullptr, nullptr, nullptr, rows, cols, out, nullptr, scratch);
}

void layer_norm_parameter_grads(cudaStream_t stream, const float *x, const float *mean, const float *rstd,
                                const float *dy, std::int64_t rows, std::int64_t width, float *dgamma,
                                float *dbeta, float *scratch) {
  column_reduce<true>(stream, dy, x, mean, rstd, rows, width, dgamma, dbeta, scratch);
}

void softmax_rows(cudaStream_t stream, float *s, std::int64_t rows, std::int64_t n) {
  softmax_kernel<<<blocks_for(rows, row_warps), row_warps * warp, 0, stream>>>(s, rows, n);
  check_launch(cudaGetLastError(), "blocks: softmax");
}

void softmax_backward_rows(cudaStream_t stream, const float *p, float *dp, std::int64_t rows, std::int64_t n,
                           float scale) {
  softmax_backward_kernel<<<blocks_for(rows, row_warps), row_warps * warp, 0, stream>>>(p, dp, rows, n, scale);
  check_launch(cudaGetLastError(), "blocks: softmax backward");
}

void gelu(cudaStream_t stream, const float *u, std::int64_t n, float *g) {
  gelu_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(u, n, g, nullptr);
  check_launch(cudaGetLastError(), "blocks: GELU");
}

void gelu_backward(cudaStream_t stream, const float *u, std::int64_t n, float *g, float *d) {
  gelu_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(u, n, g, d);
  check_launch(cudaGetLastError(), "blocks: GELU backward");
}

void rows_to_heads(cudaStream_t stream, const HeadLayout &l, const float *rows, float *heads) {
  const long long total = l.parts * l.batch * l.heads * l.tokens * l.head_dim;
  permute_heads_kernel<true><<<blocks_for(total, 256), 256, 0, stream>>>(l, rows, heads);
  check_launch(cudaGetLastError(), "blocks: head layout");
}

void heads_to_rows(cudaStream_t stream, const HeadLayout &l, const float *heads, float *rows) {
  const long long total = l.parts * l.batch * l.heads * l.tokens * l.head_dim;
  permute_heads_kernel<false><<<blocks_for(total, 256), 256, 0, stream>>>(l, heads, rows);
  check_launch(cudaGetLastError(), "blocks: head layout");
}

}  // namespace flatmem::blocks::cuda
