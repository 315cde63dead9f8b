// The row-owned gradient pass shared by the softmax backward (backward_pass.cu)
// and the sigmoid loss (sigmoid_pass.cu): persistent CTAs, each owning whole
// row tiles of the output, walk all column tiles in order; per tile
//   raw = <rows_r, cols_c>          logit_tile (on chip)
//   Gt_rc = policy.entry(raw, ...)  element-wise, in registers
//   out_r += Gt_r * cols_tile       accumulate_product (tensor cores)
// and the output row tile is scaled by out_mult and rounded once, at the last
// column tile. The loss-specific part is the Policy (see row_pass below);
// everything here is the same for every loss.
//
// Params (a PassParams or SigmoidPassParams) provides: rows, cols (Matrix),
// slots, slot_pitch, out, out_ld, out_type (see PassParams in params.hpp).
#pragma once

#include "contrastive/cuda/params.hpp"
#include "contrastive/cuda/tile_logits.cuh"

namespace flatmem::contrastive::cuda {

constexpr int out_frags = chunk_out / 8;

// Shared memory of a pass: the logit stages (or, aliasing them, the transposed
// column chunk), the Gt tile, then `sums` doubles per warp for the block sums.
template <Operand op>
struct PassSmem {
  static constexpr int gt_pitch = smem_pitch<op>(tile_cols);
  static constexpr int kt_pitch = smem_pitch<op>(tile_cols);
  static constexpr int kt_bytes = chunk_out * kt_pitch;
  // The logit stages and the transposed column chunk are never live together.
  static constexpr int shared_bytes =
      LogitStages<op>::bytes > kt_bytes ? LogitStages<op>::bytes : kt_bytes;
  static constexpr int gt_offset = shared_bytes;
  static constexpr int sums_offset = gt_offset + tile_rows * gt_pitch;
  static constexpr int bytes(int sums) { return sums_offset + sums * warps * int(sizeof(double)); }
};

// out_r += Gt_r * cols_tile for the CTA's 64 rows, chunk by chunk over d.
template <Operand op, class Params>
__device__ void accumulate_product(const Params &p, char *gt, char *kt, float *slot,
                                   std::int64_t row0, std::int64_t col0, bool first, bool last,
                                   float out_mult) {
  using S = PassSmem<op>;
  const int warp = threadIdx.x >> 5, t = threadIdx.x & 3;
  const std::int64_t d = p.rows.cols;
  for (int f0 = 0; f0 < p.slot_pitch; f0 += chunk_out) {
    load_chunk_transposed<op, tile_cols, chunk_out>(kt, S::kt_pitch, p.cols, col0, f0);
    __syncthreads();
    float acc[out_frags][4];
#pragma unroll
    for (int n = 0; n < out_frags; ++n)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float2 v = first ? make_float2(0.0f, 0.0f)
                               : *reinterpret_cast<const float2 *>(
                                     slot + frag_row(2 * h) * p.slot_pitch + f0 + n * 8 + 2 * t);
        acc[n][2 * h] = v.x;
        acc[n][2 * h + 1] = v.y;
      }
    warp_gemm_nt<op, out_frags>(acc, gt + warp * 16 * S::gt_pitch, S::gt_pitch, kt, S::kt_pitch,
                                tile_cols);
#pragma unroll
    for (int n = 0; n < out_frags; ++n)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = frag_row(2 * h), f = f0 + n * 8 + 2 * t;
        if (last) {
          const std::int64_t row = row0 + r;
          if (row >= p.rows.rows) continue;
          for (int e = 0; e < 2; ++e)
            if (f + e < d) {
              const std::int64_t at = row * p.out_ld + f + e;
              if (p.out_accumulate)  // fp32: the ring's running dq
                static_cast<float *>(p.out)[at] += out_mult * acc[n][2 * h + e];
              else
                store_output(p.out, at, p.out_type, out_mult * acc[n][2 * h + e]);
            }
        } else {
          *reinterpret_cast<float2 *>(slot + r * p.slot_pitch + f) =
              make_float2(acc[n][2 * h], acc[n][2 * h + 1]);
        }
      }
    __syncthreads();  // kt is reloaded next; it also aliases the next tile's logit stages
  }
}

// Whether element (r, col) of a pass is a positive pair (PairIndex in
// params.hpp); *bad: its label lies outside [0, label_bound). row_label:
// labels[r], read by the caller once per row (of_row only).
template <class Params>
__device__ __forceinline__ bool positive_pair(const Params &p, std::int64_t r, std::int64_t col,
                                              std::int64_t row_label, bool *bad) {
  *bad = false;
  switch (p.label_side) {
    case LabelSide::of_row:
      *bad = row_label < 0 || row_label >= p.pairs.label_bound;
      return row_label == p.pairs.cols_offset + col;
    case LabelSide::of_col: {
      const std::int64_t y = p.labels[col];
      *bad = y < 0 || y >= p.pairs.label_bound;
      return y == p.pairs.rows_offset + r;
    }
    default: return p.pairs.rows_offset + r == p.pairs.cols_offset + col;
  }
}

// Block sums of the threads' values[i] in a fixed order (warp tree, then warps
// in order), *out[i] = sum (out[i] == nullptr: not stored). Every thread calls it.
template <int count>
__device__ void store_block_sums(double (&values)[count], double *sums_smem,
                                 double *const (&out)[count]) {
#pragma unroll
  for (int i = 0; i < count; ++i) {
    double v = values[i];
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    if ((threadIdx.x & 31) == 0) sums_smem[i * warps + (threadIdx.x >> 5)] = v;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
#pragma unroll
    for (int i = 0; i < count; ++i) {
      if (out[i] == nullptr) continue;
      double total = 0.0;
      for (int w = 0; w < warps; ++w) total += sums_smem[i * warps + w];
      *out[i] = total;
    }
  }
  __syncthreads();
}

// The pass. Policy (a per-thread object) supplies the loss:
//   begin_rows(row0)            before the row tile starting at row0 (its rows'
//                               state: labels, LSE of rows row0 + frag_row(0 / 2))
//   entry(raw, r, col, h) -> Gt of element (r, col), raw = <rows_r, cols_col> as
//                               the tile GEMM formed it; h = 0 / 1: the thread's
//                               row frag_row(0) / frag_row(2). Called only for
//                               r < rows.rows, col < cols.rows (others are 0).
//   end_tile()                  after each column tile's entries
//   end_rows(rt, sums_smem)     after the row tile rt (every thread, uniformly:
//                               may call store_block_sums)
// smem: the kernel's dynamic shared memory, PassSmem<op>::bytes(sums) bytes.
template <Operand op, class Params, class Policy>
__device__ __forceinline__ void row_pass(const Params &p, float out_mult, Policy &policy,
                                         char *smem) {
  using S = PassSmem<op>;
  using T = OperandTraits<op>;
  char *stages = smem, *kt = smem, *gt = smem + S::gt_offset;
  double *sums_smem = reinterpret_cast<double *>(smem + S::sums_offset);

  const std::int64_t rows_total = p.rows.rows, cols_total = p.cols.rows;
  const int row_tiles = int((rows_total + tile_rows - 1) / tile_rows);
  const int col_tiles = int((cols_total + tile_cols - 1) / tile_cols);
  float *slot = p.out ? p.slots + std::int64_t(blockIdx.x) * tile_rows * p.slot_pitch : nullptr;

  for (int rt = blockIdx.x; rt < row_tiles; rt += gridDim.x) {
    const std::int64_t row0 = std::int64_t(rt) * tile_rows;
    policy.begin_rows(row0);
    for (int ct = 0; ct < col_tiles; ++ct) {
      const std::int64_t col0 = std::int64_t(ct) * tile_cols;
      float x[tile_col_frags][4];
      logit_tile<op>(x, stages, p.rows, p.cols, row0, col0);
#pragma unroll
      for (int n = 0; n < tile_col_frags; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const std::int64_t r = row0 + frag_row(e), col = col0 + frag_col(n, e);
          // rows / columns past the matrix contribute nothing
          x[n][e] = r < rows_total && col < cols_total ? policy.entry(x[n][e], r, col, e >> 1)
                                                       : 0.0f;
        }
      policy.end_tile();
      if (!p.out) continue;
#pragma unroll
      for (int n = 0; n < tile_col_frags; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          reinterpret_cast<typename T::Element *>(gt + frag_row(e) * S::gt_pitch)[frag_col(n, e)] =
              T::from_float(x[n][e]);
      __syncthreads();  // Gt complete (the logit stages are already free)
      accumulate_product<op>(p, gt, kt, slot, row0, col0, ct == 0, ct == col_tiles - 1, out_mult);
    }
    policy.end_rows(rt, sums_smem);
  }
}

// Launches kernel<<<grid, threads, smem, stream>>>(p) after raising its
// dynamic shared memory limit to smem (the passes need more than 48 KiB).
template <typename Params>
cudaError_t launch_pass(void (*kernel)(Params), int smem, int grid, cudaStream_t stream,
                        const Params &p) {
  const cudaError_t status =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (status != cudaSuccess) return status;
  kernel<<<grid, threads, smem, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace flatmem::contrastive::cuda
