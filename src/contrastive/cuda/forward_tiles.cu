// Forward, step 1 of 2: the tile walk. Logits x_ij = s <q_i, k_j> are formed
// tile by tile on chip and folded into running log-sum-exp states
//     (m, S) <- (max(m, m_t), S e^{m - m'} + sum_j e^{x_ij - m'})
// for every row and, for the symmetric loss, every column. The b x c matrix
// never exists, not even in pieces in global memory.
//
// Work split (deterministic by construction): the row tiles are cut into P_r
// contiguous row groups, the column tiles into P_c column groups (P <= 16,
// fixed by the shapes alone). CTA (I, J) walks its rectangle row tile by row
// tile, columns in order, and is the only writer of
//   row_partial[J][rows of I]   its rows' state over the columns of J, and
//   col_partial[I][cols of J]   its columns' state over the rows of I,
// so there are no atomics and no races, and the order of every sum is fixed.
// forward_finish.cu merges the P partial states of each row / column in
// order J = 0..P_c-1 (I = 0..P_r-1) and adds the positive logits.
//
// Inside a tile, a row's 128 values sit in one warp (4 lanes of a quad): the
// row maximum is two quad shuffles; each lane keeps its own partial sum
// against the common running maximum and the quad adds them at the end.
// Columns span the 4 warps: per-warp maxima and sums go through shared
// memory and are combined in warp order.
#include "contrastive/cuda/kernels.hpp"
#include "contrastive/cuda/tile_logits.cuh"

namespace flatmem::contrastive::cuda {
namespace {

constexpr float minus_inf = -__builtin_huge_valf();

struct Span {
  int begin, end;
};
// Group g of `groups` over `count` items: contiguous, sizes differ by at most one.
__device__ __forceinline__ Span group_span(int g, int groups, int count) {
  return {int(std::int64_t(g) * count / groups), int(std::int64_t(g + 1) * count / groups)};
}

// Folds this tile's columns into col_partial (the CTA owns these entries).
__device__ void fold_columns(const float (&x)[tile_col_frags][4], float *col_max_smem,
                             float *col_sum_smem, MaxSum *col_partial, std::int64_t col0,
                             std::int64_t c, bool first) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  // 1. per-warp column maxima over the warp's 16 rows (lanes with equal t
  //    differ in g: xor 4, 8, 16)
#pragma unroll
  for (int n = 0; n < tile_col_frags; ++n)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float m = fmaxf(x[n][e], x[n][e + 2]);
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 4));
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 8));
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 16));
      if (lane < 4) col_max_smem[warp * tile_cols + frag_col(n, e)] = m;
    }
  __syncthreads();
  // 2. per-warp sums against the tile's column maximum
#pragma unroll
  for (int n = 0; n < tile_col_frags; ++n)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int col = frag_col(n, e);
      float m = col_max_smem[col];
#pragma unroll
      for (int w = 1; w < warps; ++w) m = fmaxf(m, col_max_smem[w * tile_cols + col]);
      float s = exp_shifted(x[n][e], m) + exp_shifted(x[n][e + 2], m);
      s += __shfl_xor_sync(0xffffffffu, s, 4);
      s += __shfl_xor_sync(0xffffffffu, s, 8);
      s += __shfl_xor_sync(0xffffffffu, s, 16);
      if (lane < 4) col_sum_smem[warp * tile_cols + col] = s;
    }
  __syncthreads();
  // 3. one thread per column: warps in order, then into the running state
  for (int col = threadIdx.x; col < tile_cols; col += threads) {
    if (col0 + col >= c) continue;
    float m = col_max_smem[col], s = col_sum_smem[col];
#pragma unroll
    for (int w = 1; w < warps; ++w) {
      const float mw = col_max_smem[w * tile_cols + col];
      const float sw = col_sum_smem[w * tile_cols + col];
      // the warp sums were taken against the common tile maximum: plain adds
      m = fmaxf(m, mw);
      s += sw;
    }
    MaxSum &state = col_partial[col0 + col];
    if (first) {
      state = {m, s};
    } else {
      float rm = state.max, rs = state.sum;
      merge_state(rm, rs, m, s);
      state = {rm, rs};
    }
  }
  // The next writes to col_*_smem come after the next tile's GEMM, which
  // synchronises the CTA first.
}

template <Operand op>
__global__ void __launch_bounds__(threads) forward_tiles_kernel(ForwardTileParams p) {
  extern __shared__ __align__(16) char smem[];
  char *stages = smem;
  float *col_max_smem = reinterpret_cast<float *>(smem + LogitStages<op>::bytes);
  float *col_sum_smem = col_max_smem + warps * tile_cols;

  const std::int64_t b = p.q.rows, c = p.k.rows;
  const int row_tiles = int((b + tile_rows - 1) / tile_rows);
  const int col_tiles = int((c + tile_cols - 1) / tile_cols);
  const int group_i = blockIdx.x / p.col_groups, group_j = blockIdx.x % p.col_groups;
  const Span rows = group_span(group_i, p.row_groups, row_tiles);
  const Span cols = group_span(group_j, p.col_groups, col_tiles);
  const float scale = read_scale(p.scale);
  MaxSum *col_partial = p.symmetric ? p.col_partial + std::int64_t(group_i) * c : nullptr;

  for (int rt = rows.begin; rt < rows.end; ++rt) {
    const std::int64_t row0 = std::int64_t(rt) * tile_rows;
    float row_max[2] = {minus_inf, minus_inf}, row_sum[2] = {0.0f, 0.0f};
    for (int ct = cols.begin; ct < cols.end; ++ct) {
      const std::int64_t col0 = std::int64_t(ct) * tile_cols;
      float x[tile_col_frags][4];
      logit_tile<op>(x, stages, p.q, p.k, row0, col0);
      // x = s * raw, with rows past b and columns past c masked to -inf
#pragma unroll
      for (int n = 0; n < tile_col_frags; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const bool valid = row0 + frag_row(e) < b && col0 + frag_col(n, e) < c;
          x[n][e] = valid ? scale * x[n][e] : minus_inf;
        }
      // rows: m' = max(m, max_j x_ij), S' = S e^{m - m'} + sum_j e^{x_ij - m'}
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float tile_max = minus_inf;
#pragma unroll
        for (int n = 0; n < tile_col_frags; ++n)
          tile_max = fmaxf(tile_max, fmaxf(x[n][2 * h], x[n][2 * h + 1]));
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
        const float new_max = fmaxf(row_max[h], tile_max);
        float sum = row_sum[h] * exp_shifted(row_max[h], new_max);
#pragma unroll
        for (int n = 0; n < tile_col_frags; ++n)
          sum += exp_shifted(x[n][2 * h], new_max) + exp_shifted(x[n][2 * h + 1], new_max);
        row_sum[h] = sum;
        row_max[h] = new_max;
      }
      if (p.symmetric)
        fold_columns(x, col_max_smem, col_sum_smem, col_partial, col0, c, rt == rows.begin);
    }
    // The quad's partial sums share the maximum: add them (same bits in all 4 lanes).
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float s = row_sum[h];
      s += __shfl_xor_sync(0xffffffffu, s, 1);
      s += __shfl_xor_sync(0xffffffffu, s, 2);
      const std::int64_t row = row0 + frag_row(2 * h);
      if ((threadIdx.x & 3) == 0 && row < b && cols.begin < cols.end)
        p.row_partial[std::int64_t(group_j) * b + row] = {row_max[h], s};
    }
  }
}

}  // namespace

template <Operand op>
int forward_tiles_smem_bytes() {
  return LogitStages<op>::bytes + 2 * warps * tile_cols * int(sizeof(float));
}

template <Operand op>
cudaError_t launch_forward_tiles(const ForwardTileParams &p, cudaStream_t stream) {
  const int smem = forward_tiles_smem_bytes<op>();
  cudaError_t status = cudaFuncSetAttribute(forward_tiles_kernel<op>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (status != cudaSuccess) return status;
  forward_tiles_kernel<op><<<p.row_groups * p.col_groups, threads, smem, stream>>>(p);
  return cudaGetLastError();
}

#define FLATMEM_INSTANTIATE(op)                                                              \
  template int forward_tiles_smem_bytes<op>();                                               \
  template cudaError_t launch_forward_tiles<op>(const ForwardTileParams &, cudaStream_t);
FLATMEM_INSTANTIATE(Operand::bf16)
FLATMEM_INSTANTIATE(Operand::f16)
FLATMEM_INSTANTIATE(Operand::tf32)
FLATMEM_INSTANTIATE(Operand::f32x3)
#undef FLATMEM_INSTANTIATE

}  // namespace flatmem::contrastive::cuda
