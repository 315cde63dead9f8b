// The CUDA ring's own small kernels (src/contrastive/ring/cuda/): folding a
// block's partial (max, sum) states into running ones, the relayed column
// states and partial dk, the positives of a block, and the final stores.
// Every merge runs in the order the single-device kernels use (groups in
// order, from an empty state: empty (+) p == p exactly), so one rank of the
// ring reproduces the single-device results bit for bit.
#include "contrastive/cuda/kernels.hpp"
#include "contrastive/cuda/positive_dot.cuh"
#include "contrastive/cuda/tile_load.cuh"
#include "contrastive/cuda/tile_logits.cuh"

namespace flatmem::contrastive::cuda {
namespace {

constexpr int elementwise_threads = 256;

int elementwise_blocks(std::int64_t n) {
  const std::int64_t blocks = (n + elementwise_threads - 1) / elementwise_threads;
  return int(blocks < 1 ? 1 : blocks > 65535 ? 65535 : blocks);
}

#define FLATMEM_FOR_EACH(i, n) \
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); i += std::int64_t(gridDim.x) * blockDim.x)

__global__ void reset_states_kernel(MaxSum *states, std::int64_t n) {
  FLATMEM_FOR_EACH(i, n) states[i] = MaxSum{-__int_as_float(0x7f800000), 0.0f};
}

// running[i] (+)= row_partial[J][i], J = 0 .. groups - 1 in order.
__global__ void fold_row_partials_kernel(MaxSum *running, const MaxSum *row_partial, int groups,
                                         std::int64_t b) {
  FLATMEM_FOR_EACH(i, b) {
    float m = running[i].max, s = running[i].sum;
    for (int g = 0; g < groups; ++g) merge_state(m, s, row_partial[g * b + i].max, row_partial[g * b + i].sum);
    running[i] = MaxSum{m, s};
  }
}

// fresh[j] = col_partial[0][j] (+) col_partial[1][j] (+) ... in order.
__global__ void merge_col_partials_kernel(MaxSum *fresh, const MaxSum *col_partial, int groups,
                                          std::int64_t c) {
  FLATMEM_FOR_EACH(j, c) {
    float m = col_partial[j].max, s = col_partial[j].sum;
    for (int g = 1; g < groups; ++g) merge_state(m, s, col_partial[g * c + j].max, col_partial[g * c + j].sum);
    fresh[j] = MaxSum{m, s};
  }
}

__global__ void merge_states_kernel(MaxSum *into, const MaxSum *from, std::int64_t n) {
  FLATMEM_FOR_EACH(i, n) {
    float m = into[i].max, s = into[i].sum;
    merge_state(m, s, from[i].max, from[i].sum);
    into[i] = MaxSum{m, s};
  }
}

constexpr int positive_warps = 8;

__global__ void __launch_bounds__(positive_warps * 32) block_positives_kernel(BlockPositiveParams p) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const float scale = read_scale(p.scale);
  for (std::int64_t i = std::int64_t(blockIdx.x) * positive_warps + warp; i < p.q.rows;
       i += std::int64_t(gridDim.x) * positive_warps) {
    const std::int64_t y = (p.labels ? p.labels[i] : p.rows_offset + i) - p.col_offset;
    if (y < 0 || y >= p.k.rows) continue;  // another block holds it (uniform per warp)
    const float dot = positive_dot(p.q, i, p.k, y, p.op, p.tf32_positive, lane);
    if (lane == 0) p.positive[i] = scale * dot;
  }
}

__global__ void add_floats_kernel(float *into, const float *from, std::int64_t n) {
  FLATMEM_FOR_EACH(i, n) into[i] += from[i];
}

__global__ void store_accumulator_kernel(const float *acc, std::int64_t rows, std::int64_t d,
                                         void *out, std::int64_t out_ld, OutType out_type) {
  FLATMEM_FOR_EACH(i, rows * d) store_output(out, (i / d) * out_ld + i % d, out_type, acc[i]);
}

__global__ void store_scalar_kernel(float *out, float value) { *out = value; }

#undef FLATMEM_FOR_EACH

}  // namespace

cudaError_t launch_reset_states(MaxSum *states, std::int64_t n, cudaStream_t stream) {
  reset_states_kernel<<<elementwise_blocks(n), elementwise_threads, 0, stream>>>(states, n);
  return cudaGetLastError();
}

cudaError_t launch_fold_row_partials(MaxSum *running, const MaxSum *row_partial, int groups,
                                     std::int64_t b, cudaStream_t stream) {
  fold_row_partials_kernel<<<elementwise_blocks(b), elementwise_threads, 0, stream>>>(running, row_partial,
                                                                                       groups, b);
  return cudaGetLastError();
}

cudaError_t launch_merge_col_partials(MaxSum *fresh, const MaxSum *col_partial, int groups,
                                      std::int64_t c, cudaStream_t stream) {
  merge_col_partials_kernel<<<elementwise_blocks(c), elementwise_threads, 0, stream>>>(fresh, col_partial,
                                                                                        groups, c);
  return cudaGetLastError();
}

cudaError_t launch_merge_states(MaxSum *into, const MaxSum *from, std::int64_t n, cudaStream_t stream) {
  merge_states_kernel<<<elementwise_blocks(n), elementwise_threads, 0, stream>>>(into, from, n);
  return cudaGetLastError();
}

cudaError_t launch_block_positives(const BlockPositiveParams &p, cudaStream_t stream) {
  const std::int64_t blocks = (p.q.rows + positive_warps - 1) / positive_warps;
  block_positives_kernel<<<int(blocks < 1 ? 1 : blocks > 65535 ? 65535 : blocks), positive_warps * 32, 0,
                           stream>>>(p);
  return cudaGetLastError();
}

cudaError_t launch_add_floats(float *into, const float *from, std::int64_t n, cudaStream_t stream) {
  add_floats_kernel<<<elementwise_blocks(n), elementwise_threads, 0, stream>>>(into, from, n);
  return cudaGetLastError();
}

cudaError_t launch_store_accumulator(const float *acc, std::int64_t rows, std::int64_t d, void *out,
                                     std::int64_t out_ld, OutType out_type, cudaStream_t stream) {
  store_accumulator_kernel<<<elementwise_blocks(rows * d), elementwise_threads, 0, stream>>>(
      acc, rows, d, out, out_ld, out_type);
  return cudaGetLastError();
}

cudaError_t launch_store_scalar(float *out, float value, cudaStream_t stream) {
  store_scalar_kernel<<<1, 1, 0, stream>>>(out, value);
  return cudaGetLastError();
}

}  // namespace flatmem::contrastive::cuda
