// Row softmax of an attention score tile and its backward.
//   forward:  p_ij = exp(s_ij - m_i) / sum_k exp(s_ik - m_i),  m_i = max_k s_ik
//   backward: ds_ij = scale * p_ij (dp_ij - sum_k p_ik dp_ik)
// (scale: the factor the scores were multiplied by, folded into ds so that
// dQ = ds K and dK = ds^T Q need no further scaling).
#pragma once

#include <cstdint>

namespace flatmem::blocks::cpu {

// In place on a (rows, cols) tile with leading dimension cols.
void softmax_rows(float *scores, std::int64_t rows, std::int64_t cols);

// dp (rows, cols) becomes ds, given p.
void softmax_backward_rows(const float *p, float *dp, std::int64_t rows, std::int64_t cols,
                           float scale);

}  // namespace flatmem::blocks::cpu
