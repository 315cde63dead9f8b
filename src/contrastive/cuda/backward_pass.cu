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
// rounded to the output type once, at the last column tile. The pass itself
// (tile walk, Gt tile, product, slots) is row_pass.cuh, shared with the
// sigmoid loss; this file is the softmax's Gt and ds.
#include "contrastive/cuda/kernels.hpp"
#include "contrastive/cuda/row_pass.cuh"

namespace flatmem::contrastive::cuda {
namespace {

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
  bool bad;
  const bool positive = positive_pair(p, r, col, row.label, &bad);
  if (bad) return __int_as_float(0x7fc00000);
  return positive ? gt - p.positive_weight : gt;
}

// The softmax policy of row_pass (row_pass.cuh): Gt from the saved LSE
// vectors, ds = sum Gt raw (per tile in fp32, per row tile in double).
struct SoftmaxEntries {
  const PassParams &p;
  float scale;
  RowInfo row_info[2];
  float ds_tile = 0.0f;
  double ds = 0.0;

  __device__ SoftmaxEntries(const PassParams &params, float s) : p(params), scale(s) {}

  __device__ void begin_rows(std::int64_t row0) {
    ds = 0.0;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const std::int64_t r = row0 + frag_row(2 * h);
      row_info[h] = RowInfo{};
      if (r < p.rows.rows) {
        if (p.lse_rows) row_info[h].lse = p.lse_rows[r];
        if (p.label_side == LabelSide::of_row) row_info[h].label = p.labels[r];
      }
    }
  }

  __device__ float entry(float raw, std::int64_t r, std::int64_t col, int h) {
    const float gt = gradient_entry(p, scale * raw, r, col, row_info[h]);
    ds_tile = fmaf(gt, raw, ds_tile);
    return gt;
  }

  __device__ void end_tile() {
    ds += ds_tile;
    ds_tile = 0.0f;
  }

  __device__ void end_rows(int rt, double *sums_smem) {
    if (!p.ds_partial) return;
    double values[1] = {ds};
    double *const out[1] = {p.ds_partial + rt};
    store_block_sums<1>(values, sums_smem, out);
  }
};

constexpr int softmax_sums = 1;  // ds

template <Operand op>
__global__ void __launch_bounds__(threads) backward_pass_kernel(PassParams p) {
  extern __shared__ __align__(16) char smem[];
  const float scale = read_scale(p.scale);
  const float g = p.dloss ? *p.dloss : 1.0f;
  const float out_mult = float(double(scale) * double(g) * p.inv_n);
  SoftmaxEntries entries(p, scale);
  row_pass<op>(p, out_mult, entries, smem);
}

}  // namespace

template <Operand op>
int backward_pass_smem_bytes() {
  return PassSmem<op>::bytes(softmax_sums);
}

template <Operand op>
cudaError_t launch_backward_pass(const PassParams &p, int grid, cudaStream_t stream) {
  return launch_pass(backward_pass_kernel<op>, backward_pass_smem_bytes<op>(), grid, stream, p);
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
