// Backward: every logit tile is recomputed once; one element-wise pass turns it
// into s * G (both directions of the symmetric loss at once) and two GEMMs
// feed dq_I += (sG) K_J and dk_J += (sG)^T Q_I. With the forward this is
// 8 b^2 d FLOPs for the symmetric loss. dL/ds = sum_ij G_ij <q_i, k_j>.
#include <algorithm>

#include "contrastive/cpu/blocks.hpp"
#include "contrastive/cpu/forward.hpp"
#include "contrastive/cpu/tile_math.hpp"
#include "contrastive/cpu/tile_walk.hpp"

namespace flatmem::contrastive::cpu {
Accumulator accumulator_for(const MatrixView &out, float *workspace_acc) {
  if (out.data == nullptr) return {};
  if (out.dtype == Dtype::f32) return {out.row<float>(0), out.row_stride};
  return {workspace_acc, out.cols};
}

const Dtype *dtype_if_requested(const MatrixView &m) { return m.data ? &m.dtype : nullptr; }

void Accumulator::zero(std::int64_t rows, std::int64_t cols) const {
  for (std::int64_t r = 0; r < rows; ++r) std::fill(row(r), row(r) + cols, 0.0f);
}

void store_gradient(const Accumulator &a, const MatrixView &out) {
  if (out.data == nullptr) return;
  for (std::int64_t r = 0; r < out.rows; ++r) {
    const float *src = a.row(r);
    if (out.dtype == Dtype::f32) {
      if (out.row<float>(r) != src) std::copy(src, src + out.cols, out.row<float>(r));
      continue;
    }
    auto *dst = out.row<std::uint16_t>(r);
    for (std::int64_t j = 0; j < out.cols; ++j)
      dst[j] = out.dtype == Dtype::bf16 ? f32_to_bf16(src[j]) : f32_to_f16(src[j]);
  }
}

GradientCoefficients gradient_coefficients(Loss loss, float dloss, std::int64_t global_rows) {
  // InfoNCE: G = (P - Y) / B.  Symmetric: G = (P + Q - 2 I) / (2B). Times g = dloss.
  const bool symmetric = loss == Loss::symmetric;
  const double b = double(global_rows);
  GradientCoefficients c;
  c.row = float(dloss / (symmetric ? 2.0 * b : b));
  c.col = symmetric ? c.row : 0.0f;
  c.positive = float(dloss / b);
  return c;
}

void gradient_block(ThreadPool &pool, const Plan &plan, const Inputs &in, const float *row_lse,
                    const float *col_lse, const GradientCoefficients &coef,
                    const Accumulator &dq, const Accumulator &dk,
                    const std::vector<ThreadScratch> &scratch, double *group_ds,
                    const CachedTiles &cache) {
  walk_tiles(pool, plan, in, scratch,
             [&](std::int64_t row_group, Range rows, Range cols, const TileRows &q,
                 const TileRows &k, const ThreadScratch &s, const TileProducts &engine) {
               const float *raw = cache.slot(rows, cols);  // the forward's tile, or recompute
               if (raw == nullptr) {
                 tile_logits(engine, q, k, rows.size(), cols.size(), plan.d, s.tile, s.pack);
                 raw = s.tile;
               }
               tile_positives(in, rows, cols, s.positives);
               GradientTerms terms;
               terms.row_lse = row_lse + rows.begin;
               terms.col_lse = col_lse ? col_lse + cols.begin : nullptr;
               terms.row_coef = coef.row;
               terms.col_coef = coef.col;
               terms.positive_coef = coef.positive;
               terms.positive_col = s.positives;
               group_ds[row_group] += gradient_tile(raw, s.tile, rows.size(), cols.size(),
                                                    in.scale, terms, s.math);
               if (dq.data)
                 accumulate_rows_times(engine, s.tile, k, rows.size(), cols.size(), plan.d,
                                       dq.row(rows.begin), dq.ld, s.pack);
               if (dk.data)
                 accumulate_cols_times(engine, s.tile, q, rows.size(), cols.size(), plan.d,
                                       dk.row(cols.begin), dk.ld, s.pack);
             });
}

std::size_t backward_workspace_bytes(const Plan &plan, Dtype input, const Dtype *dq_dtype,
                                     const Dtype *dk_dtype, int threads) {
  WorkspaceCarver measure;
  carve_backward(measure, plan, input, dq_dtype, dk_dtype, threads);
  return measure.bytes();
}

void backward(ThreadPool &pool, const Plan &plan, const Inputs &in, const BackwardArgs &args,
              void *workspace, const CachedTiles &cache) {
  WorkspaceCarver carver(workspace);
  const BackwardBuffers buf = carve_backward(carver, plan, in.q.dtype, dtype_if_requested(args.dq),
                                             dtype_if_requested(args.dk), pool.size());
  const Accumulator dq = accumulator_for(args.dq, buf.dq_acc);
  const Accumulator dk = accumulator_for(args.dk, buf.dk_acc);
  if (dq.data) dq.zero(plan.b, plan.d);
  if (dk.data) dk.zero(plan.c, plan.d);
  std::fill(buf.group_ds, buf.group_ds + plan.groups, 0.0);

  const bool symmetric = in.loss == Loss::symmetric;
  gradient_block(pool, plan, in, args.row_lse, symmetric ? args.col_lse : nullptr,
                 gradient_coefficients(in.loss, args.dloss, plan.b), dq, dk, buf.threads,
                 buf.group_ds, cache);

  store_gradient(dq, args.dq);
  store_gradient(dk, args.dk);
  if (args.dscale) *args.dscale = float(sum_in_order(buf.group_ds, plan.groups));
}

}  // namespace flatmem::contrastive::cpu
