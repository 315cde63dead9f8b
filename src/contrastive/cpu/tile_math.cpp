#include "contrastive/cpu/tile_math.hpp"

#include <cmath>
#include <limits>

#include "core/fast_exp.hpp"
#include "core/simd_clones.hpp"

namespace flatmem::contrastive::cpu {
namespace {

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

void merge_states(float *running_max, double *running_sum, const float *block_max,
                  const double *block_sum, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) merge(running_max[i], running_sum[i], block_max[i], block_sum[i]);
}

FLATMEM_SIMD_CLONES
void fold_rows(const float *raw, std::int64_t rows, std::int64_t cols, float scale, float *row_max,
               double *row_sum) {
  for (std::int64_t i = 0; i < rows; ++i) {
    const float *x = raw + i * cols;
    float tile_max = -std::numeric_limits<float>::infinity();
    float nan_probe = 0.0f;  // a max drops NaN: the probe puts it back so NaN poisons the row
#pragma omp simd reduction(max : tile_max) reduction(+ : nan_probe)
    for (std::int64_t j = 0; j < cols; ++j) {
      const float v = scale * x[j];
      tile_max = v > tile_max ? v : tile_max;  // not std::fmax: a libm call, 7x slower here
      nan_probe += x[j] * 0.0f;
    }
    if (nan_probe != nan_probe) tile_max = nan_probe;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (std::int64_t j = 0; j < cols; ++j) sum += fast_exp(scale * x[j] - tile_max);
    merge(row_max[i], row_sum[i], tile_max, sum);
  }
}

FLATMEM_SIMD_CLONES
void fold_cols(const float *raw, std::int64_t rows, std::int64_t cols, float scale, float *col_max,
               double *col_sum, float *scratch) {
  float *tile_max = scratch;
  for (std::int64_t j = 0; j < cols; ++j) tile_max[j] = -std::numeric_limits<float>::infinity();
  for (std::int64_t i = 0; i < rows; ++i) {
    const float *x = raw + i * cols;
#pragma omp simd
    for (std::int64_t j = 0; j < cols; ++j) {
      const float v = scale * x[j];
      tile_max[j] = (v > tile_max[j] || v != v) ? v : tile_max[j];  // keeps NaN
    }
  }
  // Sums in fp32 over at most `rows` terms, then merged in double.
  for (std::int64_t j = 0; j < cols; ++j) {
    const float m = tile_max[j];
    merge(col_max[j], col_sum[j], m, 0.0);  // moves the running max first
  }
  // tile_max now free: reuse it as the per-column fp32 sum against col_max.
  for (std::int64_t j = 0; j < cols; ++j) tile_max[j] = 0.0f;
  for (std::int64_t i = 0; i < rows; ++i) {
    const float *x = raw + i * cols;
#pragma omp simd
    for (std::int64_t j = 0; j < cols; ++j) tile_max[j] += fast_exp(scale * x[j] - col_max[j]);
  }
  for (std::int64_t j = 0; j < cols; ++j) col_sum[j] += tile_max[j];
}

FLATMEM_SIMD_CLONES
double gradient_tile(float *raw, std::int64_t rows, std::int64_t cols, float scale,
                     const float *row_lse, const float *col_lse, float row_coef, float col_coef,
                     const std::int64_t *positive_col, float positive_coef) {
  double ds = 0.0;
  for (std::int64_t i = 0; i < rows; ++i) {
    float *x = raw + i * cols;
    const std::int64_t p = positive_col[i];
    const float raw_positive = p >= 0 ? x[p] : 0.0f;
    const float lse = row_lse[i];
    float row_ds = 0.0f;
    if (col_lse != nullptr) {
#pragma omp simd reduction(+ : row_ds)
      for (std::int64_t j = 0; j < cols; ++j) {
        const float logit = scale * x[j];
        const float g = row_coef * fast_exp(logit - lse) + col_coef * fast_exp(logit - col_lse[j]);
        row_ds += g * x[j];
        x[j] = scale * g;
      }
    } else {
#pragma omp simd reduction(+ : row_ds)
      for (std::int64_t j = 0; j < cols; ++j) {
        const float g = row_coef * fast_exp(scale * x[j] - lse);
        row_ds += g * x[j];
        x[j] = scale * g;
      }
    }
    if (p >= 0) {
      x[p] -= scale * positive_coef;
      row_ds -= positive_coef * raw_positive;
    }
    ds += row_ds;
  }
  return ds;
}

}  // namespace flatmem::contrastive::cpu
