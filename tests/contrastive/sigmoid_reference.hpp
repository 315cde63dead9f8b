// The sigmoid (SigLIP) loss materialised in double precision, and the error
// bounds of the library's fp32 computation against it.
//
// Reference (flatmem.h, "Sigmoid (SigLIP) loss"), literally: the whole b x c
// matrix of x_ij = s <q_i, k_j> + t, v_ij = -z_ij x_ij (z = +1 at (i, y_i),
// -1 elsewhere), L = (1/b) sum_ij softplus(v_ij), G_ij = g (-z_ij)
// sigmoid(v_ij) / b, dq = s G k, dk = s G^T q, ds = sum G_ij <q_i, k_j>,
// dt = sum G_ij. softplus and sigmoid in double in their stable forms. It reads
// the values the library receives (features rounded to their dtype, fp32 s, t
// and g).
//
// Error bounds (same notation and method as support/tolerance.hpp: u = 2^-24,
// gamma_n = n u / (1 - n u), first order, times `slack` = 2):
// 1. Logits. raw_ij = fl(<q_i, k_j>) errs by <= gamma_d R_ij (R_ij = sum_t
//    |q_it k_jt|, A = max R); fl(s raw) adds u s A, fl(. + t) adds u |x| <=
//    u (s A + |t|). So every logit is within dx = s gamma_{d+2} A + u |t|.
// 2. Loss. d softplus(v) / dv = sigmoid(v) in [0, 1], so a logit error dx
//    moves a term by <= sigmoid(v_ij) dx. Evaluating max(v, 0) (exact) +
//    log1p(e), e = exp(-|v|) in fp32 within 2 ulp (4u relative; d log1p(e) /
//    de = 1 / (1 + e), so <= 4u e / (1 + e) <= 2u absolute), log1p in fp32
//    within 0.74u absolute (the library's log1p_unit; bench/log1p_unit_check
//    --all checks every fp32 e in [0, 1]) and adding the two parts in double
//    errs by < 4u per term. The double sums are
//    exact to b c 2^-53 relative, far below; the final division and fp32
//    rounding add 2u |L|. With sum_ij sigmoid(v_ij) / b = sum_ij |G_ij| (g = 1):
//        |L - L_ref| <= dx sum |G| + 4u c + 2u |L_ref|.
// 3. Gradients. sigmoid'(v) = sigmoid(v)(1 - sigmoid(v)) <= sigmoid(v): dx
//    changes sigmoid by the relative factor e^dx - 1 ~ dx. The library's exp
//    (a polynomial, < 2 ulp = 4u relative), 1 + e, the division, g / b, the
//    product by it and by s add <= 6u relative: each s G_ij errs by <= s
//    |G_ij| eps_G, eps_G = dx + 10u (4u of room), plus, where exp(-|v|)
//    underflows (|v| > 87.3, flushed to 0), an absolute s |g| / b 2^-125.
//    dq_it = sum_j s G_ij k_jt accumulated in fp32 GEMMs over c terms:
//        tau_dq = s [(eps_G + gamma_c) sum_j |G_ij| |k_jt| + |g|/b 2^-125 sum_j |k_jt|]
//    (dk likewise, sum over the b rows, gamma_b). ds = sum_ij G_ij raw_ij in
//    double: each term errs by |G| (eps_G |raw| + gamma_d R) <= (eps_G +
//    gamma_d) |G| R; dt = sum G_ij by eps_G sum |G|; each rounded to fp32
//    (u relative, 2u allowed).
// 4. 16-bit outputs: rounded once from fp32 (output_rounding / output_floor
//    of support/tolerance.hpp).
// Worst-case bounds, not fitted constants; a real defect (a wrong sign of z, a
// dropped tile, the bias missing from one term) moves results far more.
#pragma once

#include <cstdint>
#include <vector>

#include "support/tensor.hpp"

namespace flatmem_test {

struct SigmoidProblem {
  std::int64_t b = 0, c = 0, d = 0;
  std::vector<double> q, k;          // (b, d), (c, d) row-major
  std::vector<std::int64_t> labels;  // (b,) or empty: y_i = i
  double scale = 1.0, bias = 0.0;    // s, t
  double dloss = 1.0;                // g
};

struct SigmoidResult {
  double loss = 0.0;
  std::vector<double> dq, dk;  // (b, d), (c, d)
  double ds = 0.0, dt = 0.0;
  // magnitudes for the bounds
  double max_abs_dot = 0.0;             // A = max_ij R_ij
  double sum_abs_g = 0.0;               // sum_ij |G_ij|
  double sum_abs_g_r = 0.0;             // sum_ij |G_ij| R_ij
  std::vector<double> dq_abs, dq_count; // sum_j |G_ij| |k_jt|, sum_j |k_jt|
  std::vector<double> dk_abs, dk_count; // sum_i |G_ij| |q_it|, sum_i |q_it|
};

SigmoidResult sigmoid_reference(const SigmoidProblem &p);

struct SigmoidTolerance {
  double loss = 0.0, ds = 0.0, dt = 0.0;
  std::vector<double> dq, dk;
};

// Bounds of section 2-4 above; dq_out / dk_out: the gradient outputs' dtypes;
// input: q's and k's (bf16 at avx512bf16 adds support/tolerance.hpp's note 7).
SigmoidTolerance sigmoid_tolerance(const SigmoidProblem &p, const SigmoidResult &r, Dtype dq_out,
                                   Dtype dk_out, Dtype input = Dtype::f32);

}  // namespace flatmem_test
