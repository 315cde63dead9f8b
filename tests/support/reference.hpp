// The contrastive loss, materialised in double precision: the whole b x c
// logit matrix is built, so every formula of flatmem.h is implemented in its
// most literal form (no tiling, no running maxima beyond the usual max shift).
// It reads the exact values the library receives (features already rounded
// to their dtype, the fp32 logit scale, the fp32 dloss).
//
//   x_ij = s <q_i, k_j>
//   row_lse_i = LSE_j x_ij,   col_lse_j = LSE_i x_ij
//   InfoNCE:   L = (1/b) sum_i (row_lse_i - x_{i,y_i}),  G_ij = g (P_ij - [j = y_i]) / b
//   Symmetric: L = (1/2b) sum_i (row_lse_i - x_ii) + (1/2b) sum_j (col_lse_j - x_jj),
//              G_ij = g (P_ij + Q_ij - 2 [i = j]) / (2b)
//   P_ij = exp(x_ij - row_lse_i), Q_ij = exp(x_ij - col_lse_j)
//   dq = s G k,  dk = s G^T q,  ds = sum_ij G_ij <q_i, k_j>
//
// Besides the values it returns the magnitudes the error bounds of
// support/tolerance.hpp are built from.
#pragma once

#include <cstdint>
#include <vector>

namespace flatmem_test {

struct ReferenceProblem {
  bool symmetric = true;
  std::int64_t b = 0, c = 0, d = 0;
  std::vector<double> q, k;          // (b, d), (c, d) dense row-major
  std::vector<std::int64_t> labels;  // (b,) or empty: y_i = i
  double scale = 1.0;                // s
  double dloss = 1.0;                // g
};

struct ReferenceResult {
  double loss = 0.0;
  std::vector<double> row_lse, col_lse;  // (b,), (c,) (col_lse empty for InfoNCE)
  std::vector<double> dq, dk;            // (b, d), (c, d)
  double ds = 0.0;

  // --- magnitudes for the error bounds ---------------------------------
  // R_ij = sum_t |q_it| |k_jt| bounds |<q_i, k_j>| and the rounding error of
  // an fp32 dot product (gamma_d * R_ij).
  double max_abs_dot = 0.0;  // A = max_ij R_ij
  // W_ij = |g| / N * (P_ij + Q_ij + 2 [j = y_i]) (N = 2b or b; Q = 0 for
  // InfoNCE): the weight that multiplies the relative error of each P or Q.
  // |G|_ij: absolute values of G. n = |g| / N: per-element absolute error unit.
  std::vector<double> dq_weighted, dq_count, dq_abs;  // sum_j {W_ij, n, |G_ij|} |k_jt|
  std::vector<double> dk_weighted, dk_count, dk_abs;  // sum_i {W_ij, n, |G_ij|} |q_it|
  double ds_weighted = 0.0, ds_count = 0.0, ds_abs = 0.0;  // sum_ij {W_ij, n, |G_ij|} R_ij
  // Largest spread max_j a_ij - min_j a_ij (a = <q, k>) over rows, and over
  // columns: bounds the third derivative of the loss in s (finite differences).
  double max_spread = 0.0;
};

ReferenceResult reference_loss(const ReferenceProblem &p);

}  // namespace flatmem_test
