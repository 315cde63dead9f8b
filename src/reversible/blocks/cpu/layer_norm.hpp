// LayerNorm over the last dimension (width w), per token row r:
//   mean_r = (1/w) sum_c x_rc,  var_r = (1/w) sum_c (x_rc - mean_r)^2   (biased)
//   rstd_r = 1 / sqrt(var_r + eps),  xhat_rc = (x_rc - mean_r) rstd_r
//   y_rc   = xhat_rc gamma_c + beta_c
// Backward, with g_c = dy_rc gamma_c:
//   dx_rc += rstd_r (g_c - mean_c(g) - xhat_rc mean_c(g xhat))
//   dgamma_c += sum_r dy_rc xhat_rc,   dbeta_c += sum_r dy_rc
#pragma once

#include <cstdint>

namespace flatmem::blocks::cpu {

// Rows [0, rows) of x (compact, width columns) -> y, mean, rstd.
void layer_norm_rows(const float *x, std::int64_t rows, std::int64_t width, const float *gamma,
                     const float *beta, float eps, float *y, float *mean, float *rstd);

// dx (rows x width) += the input gradient of rows [0, rows) given dy.
void layer_norm_backward_rows(const float *x, const float *mean, const float *rstd,
                              const float *dy, std::int64_t rows, std::int64_t width,
                              const float *gamma, float *dx);

// dgamma[c], dbeta[c] += the sums over all `rows` rows, for columns
// [cols.begin, cols.end) only (rows in order: one fixed summation order).
void layer_norm_parameter_grads(const float *x, const float *mean, const float *rstd,
                                const float *dy, std::int64_t rows, std::int64_t width,
                                std::int64_t col_begin, std::int64_t col_end, float *dgamma,
                                float *dbeta);

}  // namespace flatmem::blocks::cpu
