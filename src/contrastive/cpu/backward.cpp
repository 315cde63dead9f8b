// Backward: every logit tile is recomputed once; one element-wise pass turns it
// into s * G (both directions of the symmetric loss at once) and two GEMMs
// feed dq_I += (sG) K_J and dk_J += (sG)^T Q_I. With the forward this is
// 8 b^2 d FLOPs for the symmetric loss. dL/ds = sum_ij G_ij <q_i, k_j>.
#include <algorithm>

#include "contrastive/cpu/forward.hpp"
#include "contrastive/cpu/tile_math.hpp"
#include "contrastive/cpu/tile_walk.hpp"

namespace flatmem::contrastive::cpu {
namespace {

// The fp32 matrix gradients accumulate into: the output itself when it is
// fp32, else the workspace accumulator (ld = d).
struct Accumulator {
  float *data = nullptr;
  std::int64_t ld = 0;
  float *row(std::int64_t r) const { return data + r * ld; }
};

Accumulator accumulator_for(const MatrixView &out, float *workspace_acc) {
  if (out.data == nullptr) return {};
  if (out.dtype == Dtype::f32) return {out.row<float>(0), out.row_stride};
  return {workspace_acc, out.cols};
}

void zero(const Accumulator &a, std::int64_t rows, std::int64_t cols) {
  for (std::int64_t r = 0; r < rows; ++r) std::fill(a.row(r), a.row(r) + cols, 0.0f);
}

// Rounds the fp32 accumulator into a 16-bit output, once.
void store_rounded(const Accumulator &a, const MatrixView &out) {
  if (out.data == nullptr || out.dtype == Dtype::f32) return;
  for (std::int64_t r = 0; r < out.rows; ++r) {
    auto *dst = out.row<std::uint16_t>(r);
    const float *src = a.row(r);
    for (std::int64_t j = 0; j < out.cols; ++j)
      dst[j] = out.dtype == Dtype::bf16 ? f32_to_bf16(src[j]) : f32_to_f16(src[j]);
  }
}

const Dtype *dtype_if_requested(const MatrixView &m) { return m.data ? &m.dtype : nullptr; }

}  // namespace

std::size_t backward_workspace_bytes(const Plan &plan, Dtype input, const Dtype *dq_dtype,
                                     const Dtype *dk_dtype, int threads) {
  WorkspaceCarver measure;
  carve_backward(measure, plan, input, dq_dtype, dk_dtype, threads);
  return measure.bytes();
}

void backward(ThreadPool &pool, const Plan &plan, const Inputs &in, const BackwardArgs &args,
              void *workspace) {
  WorkspaceCarver carver(workspace);
  const BackwardBuffers buf = carve_backward(carver, plan, in.q.dtype, dtype_if_requested(args.dq),
                                             dtype_if_requested(args.dk), pool.size());
  const Accumulator dq = accumulator_for(args.dq, buf.dq_acc);
  const Accumulator dk = accumulator_for(args.dk, buf.dk_acc);
  if (dq.data) zero(dq, plan.b, plan.d);
  if (dk.data) zero(dk, plan.c, plan.d);
  std::fill(buf.group_ds, buf.group_ds + plan.groups, 0.0);

  // InfoNCE: G = (P - Y) / b.  Symmetric: G = (P + Q - 2 I) / (2b). Times g = dloss.
  const bool symmetric = in.loss == Loss::symmetric;
  const double b = double(plan.b);
  const float row_coef = float(args.dloss / (symmetric ? 2.0 * b : b));
  const float col_coef = symmetric ? row_coef : 0.0f;
  const float positive_coef = float(args.dloss / b);

  walk_tiles(pool, plan, in, buf.threads,
             [&](std::int64_t row_group, Range rows, Range cols, const Fp32Rows &q,
                 const Fp32Rows &k, const ThreadScratch &s) {
               tile_logits(q, k, rows.size(), cols.size(), plan.d, s.tile);
               for (std::int64_t i = rows.begin; i < rows.end; ++i) {
                 const std::int64_t y = in.positive(i);
                 s.positives[i - rows.begin] = (y >= cols.begin && y < cols.end) ? y - cols.begin : -1;
               }
               buf.group_ds[row_group] += gradient_tile(
                   s.tile, rows.size(), cols.size(), in.scale, args.row_lse + rows.begin,
                   symmetric ? args.col_lse + cols.begin : nullptr, row_coef, col_coef,
                   s.positives, positive_coef);
               if (dq.data)
                 accumulate_rows_times(s.tile, k, rows.size(), cols.size(), plan.d,
                                       dq.row(rows.begin), dq.ld);
               if (dk.data)
                 accumulate_cols_times(s.tile, q, rows.size(), cols.size(), plan.d,
                                       dk.row(cols.begin), dk.ld);
             });

  store_rounded(dq, args.dq);
  store_rounded(dk, args.dk);
  if (args.dscale) {
    double ds = 0.0;
    for (std::int64_t g = 0; g < plan.groups; ++g) ds += buf.group_ds[g];
    *args.dscale = float(ds);
  }
}

}  // namespace flatmem::contrastive::cpu
