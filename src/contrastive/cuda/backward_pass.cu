// Backward: one pass per gradient matrix, each a persistent kernel whose CTAs
// own whole row tiles of the output.
//
// dq pass (rows = q, cols = k):  dq_i = s g/N sum_j Gt_ij k_j
// dk pass (rows = k, cols = q):  dk_j = s g/N sum_i Gt_ij q_i   (the dq formula on G^T)
// with Gt = N G / g recomputed tile by tile from the forward's LSE vectors:
//   InfoNCE:   Gt_ij = exp(x_ij - row_lse_i) - [j = y_i]                 (N = b)
//   Symmetric: Gt_ij = exp(x_ij - row_lse_i) + exp(x_ij - col_lse_j) - 2 [i = j]  (N = 2b)
// and ds = g/N sum_ij Gt_ij <q_i, k_j> from whichever pass runs first.
//
// Why two passes and not one walk feeding dq and dk at once: a tile's
// contributions go to BM rows of dq and BN rows of dk, d features each; for
// d = 512..768 neither fits on chip for a whole row or column of tiles, so a
// single walk must read-modify-write at least one of them in global memory
// from many CTAs, which needs float atomics (order-dependent bits) or a
// cross-CTA ordering protocol. Two passes keep every output row owned by one
// CTA, accumulated in a fixed column order: deterministic with no atomics and
// no inter-CTA waiting, for 2 b c d more FLOPs (10 b c d in all with the
// forward, against 8 for a fused walk).
//
// Per tile (64 rows x 128 columns): logit_tile recomputes raw = <a_r, b_c>
// on chip; Gt is formed in registers, rounded to the operand type in shared
// memory (Gt lies in [-2, 2], so bf16/fp16 keep 8/11 significant bits, and
// no tiny P underflows the way G = Gt g / N could); then
// out_r += Gt * cols_tile runs over d in chunks of 64 features against a
// transposed copy of the column tile. The running sum of a row tile lives in
// the CTA's own fp32 slot in the workspace (64 x d floats, L2-resident), is
// read-modified-written by that CTA only, and is scaled by s g / N and
// rounded to the output type once, at the last column tile.
#include "contrastive/cuda/kernels.hpp"
#include "contrastive/cuda/tile_logits.cuh"

namespace flatmem::contrastive::cuda {
namespace {

constexpr int out_frags = chunk_out / 8;

template <Operand op>
struct PassSmem {
  static constexpr int gt_pitch = smem_pitch<op>(tile_cols);
  static constexpr int kt_pitch = smem_pitch<op>(tile_cols);
  static constexpr int kt_bytes = chunk_out * kt_pitch;
  // The logit stages and the transposed column chunk are never live together.
  static constexpr int shared_bytes =
      LogitStages<op>::bytes > kt_bytes ? LogitStages<op>::bytes : kt_bytes;
  static constexpr int gt_offset = shared_bytes;
  static constexpr int ds_offset = gt_offset + tile_rows * gt_pitch;
  static constexpr int bytes = ds_offset + warps * int(sizeof(double));
};

struct RowInfo {
  float lse = 0.0f;
  std::int64_t label = 0;
};

// Gt of one element (see the file comment); NaN for an out-of-range label.
__device__ __forceinline__ float gradient_entry(const PassParams &p, float logit, std::int64_t r,
                                                std::int64_t col, const RowInfo &row) {
  float gt = 0.0f;
  if (p.lse_rows) gt += exp2f((logit - row.lse) * log2e);
  if (p.lse_cols) gt += exp2f((logit - p.lse_cols[col]) * log2e);
  bool positive = r == col;
  if (p.label_side == LabelSide::of_row) {
    if (row.label < 0 || row.label >= p.cols.rows) return __int_as_float(0x7fc00000);
    positive = row.label == col;
  } else if (p.label_side == LabelSide::of_col) {
    const std::int64_t y = p.labels[col];
    if (y < 0 || y >= p.rows.rows) return __int_as_float(0x7fc00000);
    positive = y == r;
  }
  return positive ? gt - p.positive_weight : gt;
}

// out_r += Gt_r * cols_tile for the CTA's 64 rows, chunk by chunk over d.
template <Operand op>
__device__ void accumulate_product(const PassParams &p, char *gt, char *kt, float *slot,
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
            if (f + e < d)
              store_output(p.out, row * p.out_ld + f + e, p.out_type, out_mult * acc[n][2 * h + e]);
        } else {
          *reinterpret_cast<float2 *>(slot + r * p.slot_pitch + f) =
              make_float2(acc[n][2 * h], acc[n][2 * h + 1]);
        }
      }
    __syncthreads();  // kt is reloaded next; it also aliases the next tile's logit stages
  }
}

// Block sum of the threads' ds terms in a fixed order (warp tree, then warps in order).
__device__ void store_ds_partial(double value, double *ds_smem, double *out) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) value += __shfl_xor_sync(0xffffffffu, value, offset);
  if ((threadIdx.x & 31) == 0) ds_smem[threadIdx.x >> 5] = value;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0.0;
    for (int w = 0; w < warps; ++w) total += ds_smem[w];
    *out = total;
  }
  __syncthreads();
}

template <Operand op>
__global__ void __launch_bounds__(threads) backward_pass_kernel(PassParams p) {
  using S = PassSmem<op>;
  using T = OperandTraits<op>;
  extern __shared__ __align__(16) char smem[];
  char *stages = smem, *kt = smem, *gt = smem + S::gt_offset;
  double *ds_smem = reinterpret_cast<double *>(smem + S::ds_offset);

  const std::int64_t rows_total = p.rows.rows, cols_total = p.cols.rows;
  const int row_tiles = int((rows_total + tile_rows - 1) / tile_rows);
  const int col_tiles = int((cols_total + tile_cols - 1) / tile_cols);
  const float scale = read_scale(p.scale);
  const float g = p.dloss ? *p.dloss : 1.0f;
  const float out_mult = float(double(scale) * double(g) * p.inv_n);
  float *slot = p.out ? p.slots + std::int64_t(blockIdx.x) * tile_rows * p.slot_pitch : nullptr;

  for (int rt = blockIdx.x; rt < row_tiles; rt += gridDim.x) {
    const std::int64_t row0 = std::int64_t(rt) * tile_rows;
    RowInfo row_info[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const std::int64_t r = row0 + frag_row(2 * h);
      if (r < rows_total) {
        if (p.lse_rows) row_info[h].lse = p.lse_rows[r];
        if (p.label_side == LabelSide::of_row) row_info[h].label = p.labels[r];
      }
    }
    double ds = 0.0;
    for (int ct = 0; ct < col_tiles; ++ct) {
      const std::int64_t col0 = std::int64_t(ct) * tile_cols;
      float x[tile_col_frags][4];
      logit_tile<op>(x, stages, p.rows, p.cols, row0, col0);
      float ds_tile = 0.0f;
#pragma unroll
      for (int n = 0; n < tile_col_frags; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const std::int64_t r = row0 + frag_row(e), col = col0 + frag_col(n, e);
          float entry = 0.0f;  // rows / columns past the matrix contribute nothing
          if (r < rows_total && col < cols_total) {
            entry = gradient_entry(p, scale * x[n][e], r, col, row_info[e >> 1]);
            ds_tile = fmaf(entry, x[n][e], ds_tile);
          }
          x[n][e] = entry;
        }
      ds += ds_tile;
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
    if (p.ds_partial) store_ds_partial(ds, ds_smem, p.ds_partial + rt);
  }
}

}  // namespace

template <Operand op>
int backward_pass_smem_bytes() {
  return PassSmem<op>::bytes;
}

template <Operand op>
cudaError_t launch_backward_pass(const PassParams &p, int grid, cudaStream_t stream) {
  const int smem = backward_pass_smem_bytes<op>();
  cudaError_t status = cudaFuncSetAttribute(backward_pass_kernel<op>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (status != cudaSuccess) return status;
  backward_pass_kernel<op><<<grid, threads, smem, stream>>>(p);
  return cudaGetLastError();
}

#define FLATMEM_INSTANTIATE(op)                                                              \
  template int backward_pass_smem_bytes<op>();                                               \
  template cudaError_t launch_backward_pass<op>(const PassParams &, int, cudaStream_t);
FLATMEM_INSTANTIATE(Operand::bf16)
FLATMEM_INSTANTIATE(Operand::f16)
FLATMEM_INSTANTIATE(Operand::tf32)
FLATMEM_INSTANTIATE(Operand::f32x3)
#undef FLATMEM_INSTANTIATE

}  // namespace flatmem::contrastive::cuda
