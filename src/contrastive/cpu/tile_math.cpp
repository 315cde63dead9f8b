// The contrastive tile kernels, compiled once per CPU ISA (see tile_math.hpp
// for the math and core/isa_variants.hpp for the mechanism). The part below
// #else is the kernel code; it is included three times by
// core/compile_per_isa.inc, inside namespace FLATMEM_ISA_NS.
#ifndef FLATMEM_ISA_NS
#include "contrastive/cpu/tile_math.hpp"

#include <cmath>
#include <cstdint>
#include <limits>

#include "core/fast_exp.hpp"
#include "core/isa_variants.hpp"

namespace flatmem::contrastive::cpu {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Merges a block's (max, sum) pair into a running one: both sums rescaled to
// the larger max. Inputs may be -inf (empty); NaN propagates.
inline void merge(float &running_max, double &running_sum, float block_max, double block_sum) {
  if (block_max > running_max) {
    running_sum = running_sum * std::exp(double(running_max) - double(block_max)) + block_sum;
    running_max = block_max;
  } else if (block_max == block_max) {  // not NaN
    if (block_sum != 0.0) running_sum += block_sum * std::exp(double(block_max) - double(running_max));
  } else {
    running_max = block_max;  // NaN poisons the row, as IEEE arithmetic would
    running_sum = block_max;
  }
}

}  // namespace
}  // namespace flatmem::contrastive::cpu

#define FLATMEM_ISA_SELF "contrastive/cpu/tile_math.cpp"
#include "core/compile_per_isa.inc"

namespace flatmem::contrastive::cpu {

std::int64_t tile_math_scratch_floats(std::int64_t rows, std::int64_t cols) {
  return rows + 3 * cols;  // row maxima; column maxima, their rows, column sums
}

void merge_states(float *running_max, double *running_sum, const float *block_max,
                  const double *block_sum, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) merge(running_max[i], running_sum[i], block_max[i], block_sum[i]);
}

void fold_tile(const float *raw, std::int64_t rows, std::int64_t cols, float scale,
               const FoldTargets &t, float *scratch) {
  FLATMEM_ISA_CALL(fold_tile, raw, rows, cols, scale, t, scratch);
}

double gradient_tile(const float *raw, float *out, std::int64_t rows, std::int64_t cols,
                     float scale, const GradientTerms &g, float *scratch) {
  FLATMEM_ISA_CALL(gradient_tile, raw, out, rows, cols, scale, g, scratch);
}

}  // namespace flatmem::contrastive::cpu

#else  // ---- kernels, once per ISA ------------------------------------------------

namespace flatmem::contrastive::cpu::FLATMEM_ISA_NS {
namespace {

// max_j raw_ij of one row; NaN is dropped here (the sums propagate it).
inline float row_max_raw(const float *x, std::int64_t cols) {
  float m = -kInf;
#pragma omp simd reduction(max : m)
  for (std::int64_t j = 0; j < cols; ++j) m = x[j] > m ? x[j] : m;
  return m;
}

void record_positives(const float *raw, std::int64_t rows, std::int64_t cols, float scale,
                      const FoldTargets &t) {
  for (std::int64_t i = 0; i < rows; ++i) {
    const std::int64_t p = t.positive_col[i];
    if (p >= 0) t.positive_logit[i] = scale * raw[i * cols + p];
  }
}

// Two exponentials per element: rows and columns each against their own tile
// maximum. For tiles whose spread defeats the common shift, and for NaN/Inf.
void fold_rows_own_max(const float *raw, std::int64_t rows, std::int64_t cols, float scale,
                       const FoldTargets &t) {
  for (std::int64_t i = 0; i < rows; ++i) {
    const float *x = raw + i * cols;
    float tile_max = -kInf;
    float nan_probe = 0.0f;  // a max drops NaN: the probe puts it back so NaN poisons the row
#pragma omp simd reduction(max : tile_max) reduction(+ : nan_probe)
    for (std::int64_t j = 0; j < cols; ++j) {
      const float v = scale * x[j];
      tile_max = v > tile_max ? v : tile_max;
      nan_probe += x[j] * 0.0f;
    }
    if (nan_probe != nan_probe) tile_max = nan_probe;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (std::int64_t j = 0; j < cols; ++j) sum += fast_exp(scale * x[j] - tile_max);
    merge(t.row_max[i], t.row_sum[i], tile_max, sum);
  }
}

void fold_cols_own_max(const float *raw, std::int64_t rows, std::int64_t cols, float scale,
                       const FoldTargets &t, float *scratch) {
  float *tile_max = scratch;
  for (std::int64_t j = 0; j < cols; ++j) tile_max[j] = -kInf;
  for (std::int64_t i = 0; i < rows; ++i) {
    const float *x = raw + i * cols;
#pragma omp simd
    for (std::int64_t j = 0; j < cols; ++j) {
      const float v = scale * x[j];
      tile_max[j] = (v > tile_max[j] || v != v) ? v : tile_max[j];  // keeps NaN
    }
  }
  for (std::int64_t j = 0; j < cols; ++j) merge(t.col_max[j], t.col_sum[j], tile_max[j], 0.0);
  for (std::int64_t j = 0; j < cols; ++j) tile_max[j] = 0.0f;  // now the fp32 column sums
  for (std::int64_t i = 0; i < rows; ++i) {
    const float *x = raw + i * cols;
#pragma omp simd
    for (std::int64_t j = 0; j < cols; ++j) tile_max[j] += fast_exp(scale * x[j] - t.col_max[j]);
  }
  for (std::int64_t j = 0; j < cols; ++j) t.col_sum[j] += tile_max[j];
}

// Row maxima (scaled) into row_max[i] and, when col_max is set, column maxima
// of raw into col_max[j] and the first row holding each into col_row[j] (as a
// float: tile rows are far below 2^24), in one sweep. s > 0, so max(s x) =
// s max(x) exactly.
void tile_maxima(const float *raw, std::int64_t rows, std::int64_t cols, float scale,
                 float *row_max, float *col_max, float *col_row) {
  if (col_max == nullptr) {
    for (std::int64_t i = 0; i < rows; ++i) row_max[i] = scale * row_max_raw(raw + i * cols, cols);
    return;
  }
  for (std::int64_t j = 0; j < cols; ++j) col_max[j] = -kInf, col_row[j] = 0.0f;
  for (std::int64_t i = 0; i < rows; ++i) {
    const float *x = raw + i * cols;
    const float row = float(i);
    float m = -kInf;
#pragma omp simd reduction(max : m)
    for (std::int64_t j = 0; j < cols; ++j) {
      m = x[j] > m ? x[j] : m;
      const bool above = x[j] > col_max[j];
      col_max[j] = above ? x[j] : col_max[j];
      col_row[j] = above ? row : col_row[j];
    }
    row_max[i] = scale * m;
  }
}

// The column states of a tile folded with the common shift M: col_acc[j] =
// sum_i w_i e_ij ~ sum_i exp(x_ij - M). Before merging, each is re-based on
// the column's own maximum c_j: its largest term, recomputed exactly as it
// entered the sum, becomes exp(c_j - c_j) = 1 and the rest is rescaled by
// exp(M - c_j) in double. In real arithmetic nothing changes; in fp32 the
// dominant term no longer carries the relative error of w_i (a few ulp),
// which at saturation (one term ~1, the rest ~1e-13) was the whole of the
// column's lse - x_jj: the state becomes (c_j, 1 + rest) with rest as exact
// as its terms, as a materialised loss would have it.
void merge_columns_rebased(const float *raw, std::int64_t cols, float scale, float shift,
                           const float *row_max, const float *col_max, const float *col_row,
                           const float *col_acc, const FoldTargets &t) {
  for (std::int64_t j = 0; j < cols; ++j) {
    const auto i = static_cast<std::int64_t>(col_row[j]);
    const float m = row_max[i];
    const float dominant = fast_exp(m - shift) * fast_exp(scale * raw[i * cols + j] - m);
    const float top = scale * col_max[j];
    double rest = (double(col_acc[j]) - double(dominant)) * std::exp(double(shift) - double(top));
    rest = rest < 0.0 ? 0.0 : rest;  // cannot happen (the sum holds the term); keeps NaN
    merge(t.col_max[j], t.col_sum[j], top, 1.0 + rest);
  }
}

// Whether every column maximum lies within kShiftSpread of the shift
// (and everything is finite: the two-exponential path handles NaN/Inf).
bool columns_near(const float *col_max_raw, std::int64_t cols, float scale, float shift) {
  if (!(shift < kInf)) return false;
  float lowest = kInf;
#pragma omp simd reduction(min : lowest)
  for (std::int64_t j = 0; j < cols; ++j) lowest = col_max_raw[j] < lowest ? col_max_raw[j] : lowest;
  return scale * lowest >= shift - kShiftSpread;
}

}  // namespace

void fold_tile(const float *raw, std::int64_t rows, std::int64_t cols, float scale,
               const FoldTargets &t, float *scratch) {
  if (t.positive_col) record_positives(raw, rows, cols, scale, t);
  float *row_max = scratch, *col_max = scratch + rows, *col_acc = scratch + rows + cols;
  float *col_row = scratch + rows + 2 * cols;
  tile_maxima(raw, rows, cols, scale, row_max, t.col_max ? col_max : nullptr, col_row);
  float shift = -kInf;  // M, the tile maximum
  for (std::int64_t i = 0; i < rows; ++i) shift = row_max[i] > shift ? row_max[i] : shift;
  if (t.col_max && !columns_near(col_max, cols, scale, shift)) {
    fold_rows_own_max(raw, rows, cols, scale, t);
    fold_cols_own_max(raw, rows, cols, scale, t, scratch);
    return;
  }
  if (t.col_max)
    for (std::int64_t j = 0; j < cols; ++j) col_acc[j] = 0.0f;
  for (std::int64_t i = 0; i < rows; ++i) {
    const float *x = raw + i * cols;
    const float m = row_max[i];
    float sum = 0.0f;
    if (t.col_max) {
      const float w = fast_exp(m - shift);  // in [e^-T, 1]
#pragma omp simd reduction(+ : sum)
      for (std::int64_t j = 0; j < cols; ++j) {
        const float e = fast_exp(scale * x[j] - m);
        sum += e;
        col_acc[j] += w * e;
      }
    } else {
#pragma omp simd reduction(+ : sum)
      for (std::int64_t j = 0; j < cols; ++j) sum += fast_exp(scale * x[j] - m);
    }
    // A NaN in the row makes sum NaN (exp(NaN) is NaN; an Inf gives Inf - Inf).
    merge(t.row_max[i], t.row_sum[i], m, sum);
  }
  if (t.col_max) merge_columns_rebased(raw, cols, scale, shift, row_max, col_max, col_row, col_acc, t);
}

namespace {

// Columns [j0, j1) of one row: out_j = s v_j with v_j = row_coef exp(x_j - lse)
// (+ col_coef exp(x_j - col_lse_j)); returns sum_j v_j raw_j. Two
// exponentials per element (one for InfoNCE): the reference form.
float gradient_span_two_exp(const float *x, float *o, std::int64_t j0, std::int64_t j1, float scale,
                            float lse, const GradientTerms &g) {
  float row_ds = 0.0f;
  if (g.col_lse != nullptr) {
#pragma omp simd reduction(+ : row_ds)
    for (std::int64_t j = j0; j < j1; ++j) {
      const float logit = scale * x[j];
      const float v = g.row_coef * fast_exp(logit - lse) + g.col_coef * fast_exp(logit - g.col_lse[j]);
      row_ds += v * x[j];
      o[j] = scale * v;
    }
  } else {
#pragma omp simd reduction(+ : row_ds)
    for (std::int64_t j = j0; j < j1; ++j) {
      const float v = g.row_coef * fast_exp(scale * x[j] - lse);
      row_ds += v * x[j];
      o[j] = scale * v;
    }
  }
  return row_ds;
}

// The same with one exponential per element for the symmetric loss:
// exp(x_j - col_lse_j) = exp(x_j - lse) a col_factor_j (see tile_math.hpp).
float gradient_span_shared(const float *x, float *o, std::int64_t j0, std::int64_t j1, float scale,
                           float lse, float a, float row_coef, const float *col_factor) {
  float row_ds = 0.0f;
#pragma omp simd reduction(+ : row_ds)
  for (std::int64_t j = j0; j < j1; ++j) {
    const float v = fast_exp(scale * x[j] - lse) * (row_coef + a * col_factor[j]);
    row_ds += v * x[j];
    o[j] = scale * v;
  }
  return row_ds;
}

// The factors of the one-exponential symmetric form, or false when the
// tile's log-sum-exps spread too far for them (or are not finite).
bool shared_shift_factors(const GradientTerms &g, std::int64_t rows, std::int64_t cols,
                          float *row_factor, float *col_factor) {
  float shift = -kInf, lowest = kInf;
  for (std::int64_t i = 0; i < rows; ++i) {
    shift = g.row_lse[i] > shift ? g.row_lse[i] : shift;
    lowest = g.row_lse[i] < lowest ? g.row_lse[i] : lowest;
  }
  float highest_col = -kInf;
  for (std::int64_t j = 0; j < cols; ++j) {
    lowest = g.col_lse[j] < lowest ? g.col_lse[j] : lowest;
    highest_col = g.col_lse[j] > highest_col ? g.col_lse[j] : highest_col;
  }
  // !(a >= b) also catches NaN; +Inf anywhere goes to the reference form.
  if (!(shift < kInf) || !(highest_col < kInf) || !(lowest >= shift - kShiftSpread)) return false;
  for (std::int64_t i = 0; i < rows; ++i) row_factor[i] = fast_exp(g.row_lse[i] - shift);  // [e^-T, 1]
  for (std::int64_t j = 0; j < cols; ++j)
    col_factor[j] = g.col_coef * fast_exp(shift - g.col_lse[j]);  // col_coef (0, e^T]
  return true;
}

}  // namespace

// Each row's positive is kept out of the vectorised spans and computed on its
// own: G_ip = row_coef exp(x_ip - row_lse_i) + col_coef exp(x_ip - col_lse_p)
// - positive_coef, each exponential against its own log-sum-exp. Where the
// pair saturates (x_ip is its row's and column's log-sum-exp up to ~1e-13)
// both are exactly 1 and G_ip = 0 exactly (row_coef + col_coef ==
// positive_coef: g/2B + g/2B = g/B in fp32), as in a materialised fp32 loss;
// through the shared factors it would be a few ulp of positive_coef, and
// summed into the row's dL/ds before the positive's -positive_coef it would
// cancel to the rounding of that sum.
double gradient_tile(const float *raw, float *out, std::int64_t rows, std::int64_t cols,
                     float scale, const GradientTerms &g, float *scratch) {
  float *row_factor = scratch, *col_factor = scratch + rows;
  const bool shared = g.col_lse != nullptr && shared_shift_factors(g, rows, cols, row_factor, col_factor);
  const auto span = [&](const float *x, float *o, std::int64_t i, std::int64_t j0, std::int64_t j1) {
    if (j0 >= j1) return 0.0f;
    return shared ? gradient_span_shared(x, o, j0, j1, scale, g.row_lse[i], row_factor[i], g.row_coef, col_factor)
                  : gradient_span_two_exp(x, o, j0, j1, scale, g.row_lse[i], g);
  };
  double ds = 0.0;
  for (std::int64_t i = 0; i < rows; ++i) {
    const float *x = raw + i * cols;
    float *o = out + i * cols;
    const std::int64_t p = g.positive_col[i];
    if (p < 0) {
      ds += span(x, o, i, 0, cols);
      continue;
    }
    const float raw_p = x[p], logit = scale * raw_p;
    float v = g.row_coef * fast_exp(logit - g.row_lse[i]);
    if (g.col_lse != nullptr) v += g.col_coef * fast_exp(logit - g.col_lse[p]);
    const float grad = v - g.positive_coef;
    float row_ds = span(x, o, i, 0, p) + span(x, o, i, p + 1, cols);
    row_ds += grad * raw_p;
    o[p] = scale * grad;  // after the spans: out may be raw itself
    ds += row_ds;
  }
  return ds;
}

}  // namespace flatmem::contrastive::cpu::FLATMEM_ISA_NS
#endif
