// Forward: one tile walk folds every logit tile into running (max, sum) pairs
// for its rows and, for the symmetric loss, its columns; the b x c matrix never
// exists. LSE = max + log(sum); the loss from LSE and the positive logits the
// same tiles computed (so that every term lse_i - x_{i,y_i} is >= 0).
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

// Positive column of each row of the tile, relative to the tile, or -1.
void tile_positives(const Inputs &in, Range rows, Range cols, std::int64_t *out) {
  for (std::int64_t i = rows.begin; i < rows.end; ++i) {
    const std::int64_t y = in.positive(i);
    out[i - rows.begin] = (y >= cols.begin && y < cols.end) ? y - cols.begin : -1;
  }
}

void fold_block(ThreadPool &pool, const Plan &plan, const Inputs &in, const LseStates &rows,
                const LseStates &cols, float *positive_logit,
                const std::vector<ThreadScratch> &scratch, const CachedTiles &cache) {
  walk_tiles(pool, plan, in, scratch,
             [&](std::int64_t, Range r, Range c, const TileRows &q, const TileRows &k,
                 const ThreadScratch &s, const TileProducts &engine) {
               float *const slot = cache.slot(r, c);
               float *const raw = slot ? slot : s.tile;
               tile_logits(engine, q, k, r.size(), c.size(), plan.d, raw, s.pack);
               tile_positives(in, r, c, s.positives);
               FoldTargets t;
               t.row_max = rows.max + r.begin;
               t.row_sum = rows.sum + r.begin;
               if (cols.max) {
                 t.col_max = cols.max + c.begin;
                 t.col_sum = cols.sum + c.begin;
               }
               t.positive_col = s.positives;
               t.positive_logit = positive_logit + r.begin;
               fold_tile(raw, r.size(), c.size(), in.scale, t, s.math);
             });
}

double sum_in_order(const double *values, std::int64_t n) {
  double total = 0.0;
  for (std::int64_t i = 0; i < n; ++i) total += values[i];
  return total;
}

double finish_terms(const LseStates &states, const float *positive_logit, std::int64_t n,
                    float *lse) {
  double total = 0.0;
  for (std::int64_t i = 0; i < n; ++i) {
    const double value = double(states.max[i]) + std::log(states.sum[i]);
    lse[i] = float(value);
    const double term = value - double(positive_logit[i]);
    total += term < 0.0 ? 0.0 : term;  // NaN stays NaN
  }
  return total;
}

float mean_loss(Loss loss, double term_total, std::int64_t global_rows) {
  // 1/2 (mean_i (row_lse_i - x_ii) + mean_j (col_lse_j - x_jj)), or mean_i l_i
  return float(term_total / (loss == Loss::symmetric ? 2.0 * double(global_rows) : double(global_rows)));
}

std::size_t forward_workspace_bytes(const Plan &plan, Loss loss, Dtype input, int threads) {
  WorkspaceCarver measure;
  carve_forward(measure, plan, loss, input, threads);
  return measure.bytes();
}

void forward(ThreadPool &pool, const Plan &plan, const Inputs &in, const ForwardOutputs &out,
             void *workspace, const CachedTiles &cache) {
  WorkspaceCarver carver(workspace);
  const ForwardBuffers buf = carve_forward(carver, plan, in.loss, in.q.dtype, pool.size());
  const bool symmetric = in.loss == Loss::symmetric;
  const LseStates rows{buf.row_max, buf.row_sum};
  const LseStates cols{buf.col_max, buf.col_sum};  // empty for InfoNCE
  rows.reset(plan.b);
  if (symmetric) cols.reset(plan.c);

  fold_block(pool, plan, in, rows, cols, buf.positive_logit, buf.threads, cache);

  double total = finish_terms(rows, buf.positive_logit, plan.b, out.row_lse);
  // symmetric: column j's positive is x_jj, row j's
  if (symmetric) total += finish_terms(cols, buf.positive_logit, plan.c, out.col_lse);
  *out.loss = mean_loss(in.loss, total, plan.b);
}

}  // namespace flatmem::contrastive::cpu
