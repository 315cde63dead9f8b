// The CPU loss as block primitives: one (rows q, columns k) pair at a time.
// A single process runs each once over the whole problem (forward.cpp,
// backward.cpp); the ring (src/contrastive/ring/) runs them once per column
// block that passes through the rank, with Inputs::row_offset / col_offset
// placing the block in the global batch.
#pragma once

#include <vector>

#include "contrastive/cpu/buffers.hpp"
#include "contrastive/cpu/logit_cache.hpp"
#include "contrastive/plan.hpp"
#include "contrastive/problem.hpp"
#include "core/thread_pool.hpp"

namespace flatmem::contrastive::cpu {

// Running log-sum-exp states of n rows or columns: LSE = max + log(sum).
struct LseStates {
  float *max = nullptr;
  double *sum = nullptr;
  void reset(std::int64_t n) const;  // max = -inf, sum = 0 (empty)
};

// Folds every logit tile of in.q x in.k into `rows` (b states, running across
// blocks) and, when cols.max is set, into `cols` (c states). positive_logit
// (b) receives x_{i, y_i} for the rows whose positive column lies in in.k,
// the very value its tile fed into the row's sum; other entries are untouched.
// Tiles with a slot in `cache` are computed into it (and stay there for the
// backward), the others into the thread's scratch.
void fold_block(ThreadPool &pool, const Plan &plan, const Inputs &in, const LseStates &rows,
                const LseStates &cols, float *positive_logit,
                const std::vector<ThreadScratch> &scratch, const CachedTiles &cache = {});

// out[i - rows.begin] = the positive column of row i relative to the tile
// (rows x cols), or -1 when it lies outside.
void tile_positives(const Inputs &in, Range rows, Range cols, std::int64_t *out);

// Sum of values[0 .. n) in order, in double.
double sum_in_order(const double *values, std::int64_t n);

// lse_i = max_i + log(sum_i), written to lse in fp32; returns the sum of the
// loss terms l_i = lse_i - positive_logit_i in double, each clamped at 0: a
// term is >= 0 by construction (the positive is one of the summed logits) and
// is kept so against rounding. NaN propagates.
double finish_terms(const LseStates &states, const float *positive_logit, std::int64_t n,
                    float *lse);

// The loss from the sum of the row (and column) terms: their mean over
// global_rows (InfoNCE) or, symmetric, 1/2 (row mean + column mean).
float mean_loss(Loss loss, double term_total, std::int64_t global_rows);

// The fp32 matrix a gradient accumulates into (row r at data + r * ld).
struct Accumulator {
  float *data = nullptr;
  std::int64_t ld = 0;
  float *row(std::int64_t r) const { return data + r * ld; }
  void zero(std::int64_t rows, std::int64_t cols) const;
};

// The fp32 matrix a gradient output accumulates into: the output itself when
// it is fp32, else workspace_acc (ld = d); empty when out is not requested.
Accumulator accumulator_for(const MatrixView &out, float *workspace_acc);

// &m.dtype when m is requested (data non-null), else nullptr.
const Dtype *dtype_if_requested(const MatrixView &m);

// G = row * P + col * Q - positive * Y (see gradient_tile), for the mean
// over `global_rows` rows times dloss:
//   InfoNCE   row = positive = g / B, col = 0;
//   symmetric row = col = g / (2B), positive = g / B.
struct GradientCoefficients {
  float row = 0.0f, col = 0.0f, positive = 0.0f;
};
GradientCoefficients gradient_coefficients(Loss loss, float dloss, std::int64_t global_rows);

// Recomputes every logit tile of in.q x in.k, turns it into s*G with the
// global row_lse (q's rows) and col_lse (k's columns, symmetric; else
// nullptr), adds s G K into dq and (s G)^T Q into dk (either may be absent),
// and adds each tile's share of dL/ds into group_ds[row group]. Tiles with a
// slot in `cache` (filled by the forward on the same q and k) are read from
// it instead of recomputed.
void gradient_block(ThreadPool &pool, const Plan &plan, const Inputs &in, const float *row_lse,
                    const float *col_lse, const GradientCoefficients &coef,
                    const Accumulator &dq, const Accumulator &dk,
                    const std::vector<ThreadScratch> &scratch, double *group_ds,
                    const CachedTiles &cache = {});

// Writes an fp32 accumulator into a gradient output: a copy for fp32 outputs
// that are not the accumulator itself, a rounding for 16-bit ones.
void store_gradient(const Accumulator &a, const MatrixView &out);

}  // namespace flatmem::contrastive::cpu
