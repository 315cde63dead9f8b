// The sigmoid (SigLIP) loss on CUDA: the CUDA twin of cpu/sigmoid.cpp, on the
// row-owned pass of the softmax backward (row_pass.cuh).
//
// Per 64 x 128 tile: raw = <rows_r, cols_c> on the tensor cores (logit_tile),
// then element-wise in registers, with the safe formulas of flatmem.h and
// cpu/sigmoid_math.cpp:
//   x = s raw + t,  v = -z x,  e = exp(-|v|)          (z = +1 at the positive)
//   loss term  softplus(v) = max(v, 0) + log1p(e)      (the two added in double)
//   Gt = -z sigmoid(v),  sigmoid(v) = 1 / (1 + e) (v >= 0), e / (1 + e) (v < 0)
// (expf within 2 ulp, log1pf within 1 ulp, IEEE division: the per-term error
// the header's bounds allow), and the row tile's sums of softplus(v), Gt raw
// and Gt in double per thread, added per row tile in a fixed order
// (store_block_sums) into one partial per row tile; final_sums.cu adds the
// partials in a fixed order: loss = sum / b, ds = g / b sum, dt = g / b sum.
// Then, when the pass has an output, out_r += Gt_r * cols_tile (Gt rounded
// to the operand type in shared memory) and out = s g / b * that, rounded
// once.
//
// Passes (backend.cpp): dq = s G k from the row pass (rows = q, cols = k),
// dk = s G^T q from the column pass (rows = k, cols = q: every quantity read
// through G^T; the positive of (row j, column i) is labels[i] == j). Chosen
// over one walk with float atomics into dq and dk for the reason the softmax
// backward gives (backward_pass.cu): each output row is owned by one CTA and
// accumulated in a fixed column order, so the results are the same bits on
// every run, with no atomics and no inter-CTA waiting. What it costs: the
// column pass recomputes the logits, 2 b c d FLOPs more. value_and_grad with
// dq and dk: 8 b c d FLOPs (two logit products, two gradient products)
// against 6 b c d for the CPU's single walk; dq or dk alone, or only the
// scalars: 4 b c d (2 b c d for the scalars alone); forward: 2 b c d.
//
// The loss, ds and dt sums come from whichever pass runs first; a column pass
// that is not the first computes no sums (and no log1p).
#include "contrastive/cuda/kernels.hpp"
#include "contrastive/cuda/row_pass.cuh"

namespace flatmem::contrastive::cuda {
namespace {

constexpr int sigmoid_sums = 3;  // loss, ds, dt

__device__ __forceinline__ float quiet_nan() { return __int_as_float(0x7fc00000); }

// t from its device scalar; a value the CPU path would refuse (not finite)
// becomes NaN so that every output shows it (as read_scale does for s).
__device__ __forceinline__ float read_bias(const float *bias) {
  const float t = *bias;
  return fabsf(t) <= 3.402823466e38f ? t : quiet_nan();
}

struct SigmoidEntries {
  const SigmoidPassParams &p;
  float scale, bias;
  std::int64_t label[2] = {0, 0};
  double loss = 0.0, ds = 0.0, dt = 0.0;

  __device__ SigmoidEntries(const SigmoidPassParams &params, float s, float t)
      : p(params), scale(s), bias(t) {}

  __device__ void begin_rows(std::int64_t row0) {
    loss = ds = dt = 0.0;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const std::int64_t r = row0 + frag_row(2 * h);
      label[h] = p.label_side == LabelSide::of_row && r < p.rows.rows ? p.labels[r] : 0;
    }
  }

  // Gt of element (r, col); an out-of-range label (the host cannot check
  // device values) makes the element, and so the loss and gradients, NaN.
  __device__ float entry(float raw, std::int64_t r, std::int64_t col, int h) {
    bool bad;
    const bool positive = positive_pair(p, r, col, label[h], &bad);
    const float logit = bad ? quiet_nan() : fmaf(scale, raw, bias);
    const float v = positive ? -logit : logit;
    const float e = expf(-fabsf(v));  // in [0, 1]; NaN propagates through e
    if (p.loss_partial) loss += double(fmaxf(v, 0.0f)) + double(log1pf(e));
    const float sig = (v >= 0.0f ? 1.0f : e) / (1.0f + e);
    const float gt = positive ? -sig : sig;
    if (p.ds_partial) ds = fma(double(gt), double(raw), ds);
    if (p.dt_partial) dt += double(gt);
    return gt;
  }

  __device__ void end_tile() {}

  __device__ void end_rows(int rt, double *sums_smem) {
    if (!p.loss_partial && !p.ds_partial && !p.dt_partial) return;
    double values[sigmoid_sums] = {loss, ds, dt};
    double *const out[sigmoid_sums] = {p.loss_partial ? p.loss_partial + rt : nullptr,
                                       p.ds_partial ? p.ds_partial + rt : nullptr,
                                       p.dt_partial ? p.dt_partial + rt : nullptr};
    store_block_sums<sigmoid_sums>(values, sums_smem, out);
  }
};

template <Operand op>
__global__ void __launch_bounds__(threads) sigmoid_pass_kernel(SigmoidPassParams p) {
  extern __shared__ __align__(16) char smem[];
  const float scale = read_scale(p.scale);
  const float g = p.dloss ? *p.dloss : 1.0f;
  const float out_mult = float(double(scale) * double(g) * p.inv_n);
  SigmoidEntries entries(p, scale, read_bias(p.bias));
  row_pass<op>(p, out_mult, entries, smem);
}

}  // namespace

template <Operand op>
int sigmoid_pass_smem_bytes() {
  return PassSmem<op>::bytes(sigmoid_sums);
}

template <Operand op>
cudaError_t launch_sigmoid_pass(const SigmoidPassParams &p, int grid, cudaStream_t stream) {
  return launch_pass(sigmoid_pass_kernel<op>, sigmoid_pass_smem_bytes<op>(), grid, stream, p);
}

#define FLATMEM_INSTANTIATE(op)                                                              \
  template int sigmoid_pass_smem_bytes<op>();                                                \
  template cudaError_t launch_sigmoid_pass<op>(const SigmoidPassParams &, int, cudaStream_t);
FLATMEM_INSTANTIATE(Operand::bf16)
FLATMEM_INSTANTIATE(Operand::f16)
FLATMEM_INSTANTIATE(Operand::tf32)
FLATMEM_INSTANTIATE(Operand::f32x3)
#undef FLATMEM_INSTANTIATE

}  // namespace flatmem::contrastive::cuda
