// Element-wise work on one logit tile held in fp32: raw_ij = <q_i, k_j> for
// R rows x C columns (row-major, leading dimension C), x_ij = s raw_ij.
// Compiled once per CPU ISA (core/isa_variants.hpp); these entry points run
// the variant cpu_isa::active() selects. Reductions use `omp simd` so that
// the summation order is fixed by the code (and the ISA), not by the thread.
//
// One exponential per element in forward and backward, also for the
// symmetric loss whose rows and columns both need exp(x - shift):
//  forward   e_ij = exp(x_ij - m_i) with m_i the row's tile maximum gives the
//            row sums; the column sums relative to the tile maximum M are
//            sum_i w_i e_ij with w_i = exp(m_i - M) (a multiply and an add
//            per element), re-based on each column's own maximum before they
//            are merged (its largest term becomes exactly 1).
//  backward  exp(x_ij - col_lse_j) = e_ij a_i b_j with e_ij = exp(x_ij -
//            row_lse_i), a_i = exp(row_lse_i - M), b_j = exp(M - col_lse_j),
//            M = the tile's largest row_lse; each row's positive is computed
//            apart, with both exponentials against their own lse.
// Saturation (one logit per row and column above the rest by tens) is as exact
// as a materialised fp32 loss: the kernels round s x before subtracting a
// maximum taken from the same rounded values (tile_math.cpp is compiled with
// -ffp-contract=off), and the two steps above keep the dominant terms exact.
// The factored forms are exact in real arithmetic; in fp32 they need the
// factors in range, so a tile takes them only when every row and column is
// within kShiftSpread of the common shift M (every column maximum >= M - T in
// forward; every row_lse and col_lse >= M - T in backward), else the tile is
// computed with two exponentials per element as before. The shifted
// arguments then carry at most T u more relative error (u = 2^-24) than
// exp(x - own maximum) would, and nothing representable is lost: terms that
// underflow are below e^(T - 87) of their row's or column's largest.
#pragma once

#include <cstdint>

namespace flatmem::contrastive::cpu {

// Largest distance (in natural-log units) between the common shift of a tile
// and a row's or column's own maximum for which the one-exponential forms are
// used (see above). e^60 ~ 1.1e26 keeps every factor a normal fp32 number.
inline constexpr float kShiftSpread = 60.0f;

// Running log-sum-exp state of one row (or column): LSE = max + log(sum),
// where sum = sum_j exp(x_j - max). max starts at -inf, sum at 0. `max` may
// also be any common shift above the true maximum (within kShiftSpread):
// LSE = max + log(sum) holds for any shift.
struct FoldTargets {
  float *row_max = nullptr;    // (R) running row states
  double *row_sum = nullptr;   // (R)
  float *col_max = nullptr;    // (C) running column states, or nullptr (InfoNCE)
  double *col_sum = nullptr;   // (C)
  const std::int64_t *positive_col = nullptr;  // (R) column of row i's positive in this tile, or < 0
  float *positive_logit = nullptr;             // (R) receives x_{i, positive_col_i} where >= 0
};

// Folds x_ij = s raw_ij into the row states (and the column states when
// col_max is set): m' = max(m, max_j x_ij), sum' = sum exp(m - m') +
// sum_j exp(x_ij - m'). Records each row's positive logit exactly as the
// element that entered its sum, so that lse_i - x_{i,y_i} >= 0 up to the
// rounding of the exponential. scratch: tile_math_scratch_floats(R, C) floats.
void fold_tile(const float *raw, std::int64_t rows, std::int64_t cols, float scale,
               const FoldTargets &t, float *scratch);

std::int64_t tile_math_scratch_floats(std::int64_t rows, std::int64_t cols);

// Merges n (max, sum) states into running ones, element by element, with the
// same rule the folds use (both sums rescaled to the larger max; NaN
// propagates): the ring combines the column states of different ranks so.
void merge_states(float *running_max, double *running_sum, const float *block_max,
                  const double *block_sum, std::int64_t n);

// Backward of one tile:
//   G_ij = row_coef exp(x_ij - row_lse_i) + col_coef exp(x_ij - col_lse_j)
//          - positive_coef [j = positive_col_i]
// (col_lse == nullptr drops the second term; positive_col_i < 0 means the
// positive is outside the tile). Writes out_ij = s G_ij (out may be raw: in
// place) and returns sum_ij G_ij raw_ij, the tile's share of dL/ds.
struct GradientTerms {
  const float *row_lse = nullptr;  // (R)
  const float *col_lse = nullptr;  // (C) or nullptr
  float row_coef = 0.0f, col_coef = 0.0f, positive_coef = 0.0f;
  const std::int64_t *positive_col = nullptr;  // (R)
};
double gradient_tile(const float *raw, float *out, std::int64_t rows, std::int64_t cols,
                     float scale, const GradientTerms &g, float *scratch);

}  // namespace flatmem::contrastive::cpu
