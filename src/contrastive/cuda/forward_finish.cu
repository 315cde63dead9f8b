// Forward, step 2 of 2: merge the partial states and form the loss.
//   row_lse_i = LSE over J of row_partial[J][i]      (J = 0..P_c-1, in order)
//   col_lse_j = LSE over I of col_partial[I][j]      (symmetric)
//   x_{i,y_i} = s <q_i, k_{y_i}>                     (one warp per row)
//   InfoNCE:   L = (1/b)  sum_i (row_lse_i - x_{i,y_i})
//   Symmetric: L = (1/2b) sum_i (row_lse_i + col_lse_i - 2 x_ii)
// Sums run in double: per warp in row order, per CTA in warp order, then
// final_sums.cu adds the CTAs' partials in CTA order. The grid size is a
// function of b alone, so the result is the same bits on every run.
//
// The positive logit uses the tiles' precision (positive_dot.cuh). In the ring
// it comes precomputed from the block that holds the positive column
// (p.positive); the merged states are then the running row states and this
// rank's relayed column states (one group each).
#include "contrastive/cuda/kernels.hpp"
#include "contrastive/cuda/positive_dot.cuh"
#include "contrastive/cuda/tile_logits.cuh"

namespace flatmem::contrastive::cuda {
namespace {

constexpr int finish_threads = 256;
constexpr int finish_warps = finish_threads / 32;

// LSE of the `count` partial states parts[0], parts[stride], ... in order.
__device__ double merged_lse(const MaxSum *parts, std::int64_t stride, int count) {
  float m = parts[0].max, s = parts[0].sum;
  for (int g = 1; g < count; ++g) merge_state(m, s, parts[g * stride].max, parts[g * stride].sum);
  return double(m) + log(double(s));
}

__global__ void __launch_bounds__(finish_threads)
    forward_finish_kernel(ForwardFinishParams p, Operand op) {
  __shared__ double warp_totals[finish_warps];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const std::int64_t b = p.q.rows, c = p.k.rows;
  const float scale = read_scale(p.scale);
  double total = 0.0;  // lane 0's running sum of its rows' terms
  for (std::int64_t i = std::int64_t(blockIdx.x) * finish_warps + warp; i < b;
       i += std::int64_t(gridDim.x) * finish_warps) {
    double positive;
    if (p.positive) {  // the ring formed it in the block that holds column y_i
      if (lane != 0) continue;
      positive = double(p.positive[i]);
    } else {
      const std::int64_t y = p.labels ? p.labels[i] : i;
      const bool valid = y >= 0 && y < c;  // an out-of-range label makes the loss NaN
      const float dot = valid ? positive_dot(p.q, i, p.k, y, op, p.tf32_positive, lane) : 0.0f;
      if (lane != 0) continue;  // lane 0's value (a fixed summation order) is the one used
      positive = valid ? double(scale * dot) : __longlong_as_double(0x7ff8000000000000ll);
    }
    const double row_lse = merged_lse(p.row_partial + i, b, p.col_groups);
    p.row_lse[i] = float(row_lse);
    total += row_lse - positive;
    if (p.symmetric) {  // c = b: column i pairs with row i
      const double col_lse = merged_lse(p.col_partial + i, c, p.row_groups);
      p.col_lse[i] = float(col_lse);
      total += col_lse - positive;
    }
  }
  if (lane == 0) warp_totals[warp] = total;
  __syncthreads();
  if (threadIdx.x == 0) {
    double block_total = 0.0;
    for (int w = 0; w < finish_warps; ++w) block_total += warp_totals[w];
    p.loss_partial[blockIdx.x] = block_total;
  }
}

}  // namespace

cudaError_t launch_forward_finish(const ForwardFinishParams &p, Operand op, int blocks,
                                  cudaStream_t stream) {
  forward_finish_kernel<<<blocks, finish_threads, 0, stream>>>(p, op);
  return cudaGetLastError();
}

}  // namespace flatmem::contrastive::cuda
