// The three tile products of the contrastive loss, through CBLAS sgemm (one
// single-threaded call per tile; flatmem's own threads run tiles in parallel).
#pragma once

#include <cstdint>

#include "contrastive/plan.hpp"
#include "core/tensor.hpp"

namespace flatmem::contrastive::cpu {

// Rows [range) of a feature matrix as fp32: points into the tensor when it is
// fp32, else into `scratch` (range.size() * cols floats) after widening.
struct Fp32Rows {
  const float *data;
  std::int64_t ld;  // leading dimension in elements
};
Fp32Rows fp32_rows(const MatrixView &m, Range range, float *scratch);

// raw (R x C, ld C) = Q_I (R x d) * K_J^T.
void tile_logits(const Fp32Rows &q, const Fp32Rows &k, std::int64_t rows, std::int64_t cols,
                 std::int64_t d, float *raw);

// out (R x d, ld out_ld) += G (R x C, ld C) * K_J (C x d).
void accumulate_rows_times(const float *g, const Fp32Rows &k, std::int64_t rows, std::int64_t cols,
                           std::int64_t d, float *out, std::int64_t out_ld);

// out (C x d, ld out_ld) += G^T (C x R) * Q_I (R x d).
void accumulate_cols_times(const float *g, const Fp32Rows &q, std::int64_t rows, std::int64_t cols,
                           std::int64_t d, float *out, std::int64_t out_ld);

}  // namespace flatmem::contrastive::cpu
