// Forward: one tile walk folds every logit tile into running (max, sum) pairs
// for its rows and, for the symmetric loss, its columns; the b x c matrix never
// exists. LSE = max + log(sum); loss from LSE and the positive logits.
#include "contrastive/cpu/forward.hpp"

#include <cmath>
#include <limits>

#include "contrastive/cpu/tile_math.hpp"
#include "contrastive/cpu/tile_walk.hpp"

namespace flatmem::contrastive::cpu {
namespace {

// s * <q_i, k_y> in double, summed over the rows of each group.
void sum_positive_logits(ThreadPool &pool, const Plan &plan, const Inputs &in, double *group_sum) {
  pool.run(plan.groups, [&](std::int64_t g, int) {
    const Range rows = plan.row_group(g);
    double total = 0.0;
    for (std::int64_t i = rows.begin; i < rows.end; ++i) {
      const std::int64_t y = in.positive(i);
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
    group_sum[g] = total;
  });
}

// lse_i = max_i + log(sum_i); returns sum_i lse_i in double.
double finish_lse(const float *max, const double *sum, std::int64_t n, float *lse) {
  double total = 0.0;
  for (std::int64_t i = 0; i < n; ++i) {
    const double value = double(max[i]) + std::log(sum[i]);
    lse[i] = float(value);
    total += value;
  }
  return total;
}

}  // namespace

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
  const float minus_inf = -std::numeric_limits<float>::infinity();
  std::fill(buf.row_max, buf.row_max + plan.b, minus_inf);
  std::fill(buf.row_sum, buf.row_sum + plan.b, 0.0);
  if (symmetric) {
    std::fill(buf.col_max, buf.col_max + plan.c, minus_inf);
    std::fill(buf.col_sum, buf.col_sum + plan.c, 0.0);
  }

  walk_tiles(pool, plan, in, buf.threads,
             [&](std::int64_t, Range rows, Range cols, const Fp32Rows &q, const Fp32Rows &k,
                 const ThreadScratch &s) {
               tile_logits(q, k, rows.size(), cols.size(), plan.d, s.tile);
               fold_rows(s.tile, rows.size(), cols.size(), in.scale, buf.row_max + rows.begin,
                         buf.row_sum + rows.begin);
               if (symmetric)
                 fold_cols(s.tile, rows.size(), cols.size(), in.scale, buf.col_max + cols.begin,
                           buf.col_sum + cols.begin, s.col_scratch);
             });

  sum_positive_logits(pool, plan, in, buf.group_loss);
  double positive_total = 0.0;
  for (std::int64_t g = 0; g < plan.groups; ++g) positive_total += buf.group_loss[g];

  double lse_total = finish_lse(buf.row_max, buf.row_sum, plan.b, out.row_lse);
  if (symmetric) {
    lse_total += finish_lse(buf.col_max, buf.col_sum, plan.c, out.col_lse);
    // 1/2 (mean_i (row_lse_i - x_ii) + mean_j (col_lse_j - x_jj))
    *out.loss = float((lse_total - 2.0 * positive_total) / (2.0 * double(plan.b)));
  } else {
    *out.loss = float((lse_total - positive_total) / double(plan.b));
  }
}

}  // namespace flatmem::contrastive::cpu
