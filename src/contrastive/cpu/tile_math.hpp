// Element-wise work on one logit tile held in fp32: raw_ij = <q_i, k_j> for
// R rows x C columns (row-major, leading dimension C). Vectorised loops;
// reductions use `omp simd` so that the summation order is fixed by the code.
#pragma once

#include <cstdint>

namespace flatmem::contrastive::cpu {

// Running log-sum-exp state of one row (or column): LSE = max + log(sum),
// where sum = sum_j exp(x_j - max). max starts at -inf, sum at 0.
//
// fold_rows: for each row i of the tile, merges x_ij = s * raw_ij, j < C, into
// (row_max[i], row_sum[i]):  m' = max(m, max_j x_ij),
// sum' = sum * exp(m - m') + sum_j exp(x_ij - m').
void fold_rows(const float *raw, std::int64_t rows, std::int64_t cols, float scale, float *row_max,
               double *row_sum);

// The same per column j over the R rows of the tile. `scratch` holds `cols` floats.
void fold_cols(const float *raw, std::int64_t rows, std::int64_t cols, float scale, float *col_max,
               double *col_sum, float *scratch);

// Merges n (max, sum) states into running ones, element by element, with the
// same rule the folds use (both sums rescaled to the larger max; NaN
// propagates): the ring combines the column states of different ranks so.
void merge_states(float *running_max, double *running_sum, const float *block_max,
                  const double *block_sum, std::int64_t n);

// Backward of one tile. On entry raw holds <q_i, k_j>; on return it holds
// s * G_ij with
//   G_ij = row_coef * exp(x_ij - row_lse_i) + col_coef * exp(x_ij - col_lse_j)
//          - positive_coef * [j = positive_col_i]
// (col_lse == nullptr drops the second term; positive_col_i < 0 means the
// positive is outside the tile). Returns sum_ij G_ij * raw_ij, the tile's
// share of dL/ds.
double gradient_tile(float *raw, std::int64_t rows, std::int64_t cols, float scale,
                     const float *row_lse, const float *col_lse, float row_coef, float col_coef,
                     const std::int64_t *positive_col, float positive_coef);

}  // namespace flatmem::contrastive::cpu
