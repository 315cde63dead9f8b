// Forward: one tile walk folds every logit tile into running (max, sum) pairs
// for its rows and, for the symmetric loss, its columns; the b x c matrix never
// exists. LSE = max + log(sum); loss from LSE and the positive logits.
#include "contrastive/cpu/forward.hpp"

#include <cmath>
#include <limits>

#include "contrastive/cpu/blocks.hpp"
#include "contrastive/cpu/tile_math.hpp"
#include "contrastive/cpu/tile_walk.hpp"

namespace flatmem::contrastive::cpu {

void LseStates::reset(std::int64_t n) const {
  std::fill(max, max + n, -std::numeric_limits<float>::infinity());
  std::fill(sum, sum + n, 0.0);
}

void fold_block(ThreadPool &pool, const Plan &plan, const Inputs &in, const LseStates &rows,
                const LseStates &cols, const std::vector<ThreadScratch> &scratch) {
  walk_tiles(pool, plan, in, scratch,
             [&](std::int64_t, Range r, Range c, const Fp32Rows &q, const Fp32Rows &k,
                 const ThreadScratch &s) {
               tile_logits(q, k, r.size(), c.size(), plan.d, s.tile);
               fold_rows(s.tile, r.size(), c.size(), in.scale, rows.max + r.begin,
                         rows.sum + r.begin);
               if (cols.max)
                 fold_cols(s.tile, r.size(), c.size(), in.scale, cols.max + c.begin,
                           cols.sum + c.begin, s.col_scratch);
             });
}

void add_positive_logits(ThreadPool &pool, const Plan &plan, const Inputs &in, double *group_sum) {
  pool.run(plan.groups, [&](std::int64_t g, int) {
    const Range rows = plan.row_group(g);
    double total = 0.0;
    for (std::int64_t i = rows.begin; i < rows.end; ++i) {
      const std::int64_t y = in.positive(i);
      if (y < 0 || y >= plan.c) continue;  // in another rank's column block
      double dot = 0.0;
      for (std::int64_t t = 0; t < plan.d; ++t) {
        const auto element = [&](const MatrixView &m, std::int64_t r) -> double {
          switch (m.dtype) {
            case Dtype::bf16: return bf16_to_f32(m.row<const std::uint16_t>(r)[t]);
            case Dtype::f16: return f16_to_f32(m.row<const std::uint16_t>(r)[t]);
            default: return m.row<const float>(r)[t];
          }
        };
        dot += element(in.q, i) * element(in.k, y);
      }
      total += double(in.scale) * dot;
    }
    group_sum[g] += total;
  });
}

double sum_in_order(const double *values, std::int64_t n) {
  double total = 0.0;
  for (std::int64_t i = 0; i < n; ++i) total += values[i];
  return total;
}

double finish_lse(const LseStates &states, std::int64_t n, float *lse) {
  double total = 0.0;
  for (std::int64_t i = 0; i < n; ++i) {
    const double value = double(states.max[i]) + std::log(states.sum[i]);
    lse[i] = float(value);
    total += value;
  }
  return total;
}

double loss_numerator(Loss loss, double lse_total, double positive_total) {
  // symmetric: the positive x_ii is subtracted once for row i and once for column i
  return loss == Loss::symmetric ? lse_total - 2.0 * positive_total : lse_total - positive_total;
}

float mean_loss(Loss loss, double numerator, std::int64_t global_rows) {
  // 1/2 (mean_i (row_lse_i - x_ii) + mean_j (col_lse_j - x_jj)), or mean_i l_i
  return float(numerator / (loss == Loss::symmetric ? 2.0 * double(global_rows) : double(global_rows)));
}

std::size_t forward_workspace_bytes(const Plan &plan, Loss loss, Dtype input, int threads) {
  WorkspaceCarver measure;
  carve_forward(measure, plan, loss, input, threads);
  return measure.bytes();
}

void forward(ThreadPool &pool, const Plan &plan, const Inputs &in, const ForwardOutputs &out,
             void *workspace) {
  WorkspaceCarver carver(workspace);
  const ForwardBuffers buf = carve_forward(carver, plan, in.loss, in.q.dtype, pool.size());
  const bool symmetric = in.loss == Loss::symmetric;
  const LseStates rows{buf.row_max, buf.row_sum};
  const LseStates cols{buf.col_max, buf.col_sum};  // empty for InfoNCE
  rows.reset(plan.b);
  if (symmetric) cols.reset(plan.c);

  fold_block(pool, plan, in, rows, cols, buf.threads);

  std::fill(buf.group_loss, buf.group_loss + plan.groups, 0.0);
  add_positive_logits(pool, plan, in, buf.group_loss);
  const double positive_total = sum_in_order(buf.group_loss, plan.groups);

  double lse_total = finish_lse(rows, plan.b, out.row_lse);
  if (symmetric) lse_total += finish_lse(cols, plan.c, out.col_lse);
  *out.loss = mean_loss(in.loss, loss_numerator(in.loss, lse_total, positive_total), plan.b);
}

}  // namespace flatmem::contrastive::cpu
