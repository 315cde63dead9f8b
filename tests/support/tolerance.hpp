// Error bounds for the library's fp32 computation against the exact (double)
// reference, derived from the operations the header promises: products
// accumulated in fp32, log-sum-exp with the maximum subtracted, 16-bit inputs
// widened exactly and 16-bit gradients rounded once at the end.
//
// Notation: u = 2^-24 (fp32 unit roundoff), gamma_n = n u / (1 - n u) (the
// classic bound on the relative error of an n-term fp32 sum or dot product:
// |fl(sum a_i) - sum a_i| <= gamma_n sum |a_i|, whatever the order or
// blocking, FMA or not). bf16 and fp16 inputs are exactly representable in
// fp32 (8 and 11 significant bits), so widening them costs nothing and only
// the fp32 accumulation counts, exactly as for fp32 inputs.
//
// 1. Logits. raw_ij = fl(<q_i, k_j>) over d terms: error <= gamma_d R_ij with
//    R_ij = sum_t |q_it k_jt|; x_ij = fl(s raw_ij) adds u |x_ij|. So every
//    logit is within  dx = s gamma_{d+1} A,  A = max_ij R_ij.
// 2. Log-sum-exp over n terms (n = c for rows, b for columns). The shift by
//    the maximum is exact; each term exp(fl(x - m)) carries the rounding of
//    its argument (relative u |x - m|, and since e^-a a <= 1/e this adds at
//    most n u / e to the sum, which is >= 1), the exp error (the library's
//    polynomial: < 2 ulp = 4u), and the fp32 partial sums add gamma_n. The
//    log in double is exact enough; the fp32 result adds u |lse|. Altogether
//        |lse - lse_ref| <= dx + (2n + 8) u + 2u |lse_ref|,
//    the factor 2 on n covering n (sum) + n/e (arguments) with room.
// 3. Loss = mean of lse minus mean of positive logits: the positive logits
//    are O(d) fp32 products at worst, inside dx; so
//        |L - L_ref| <= dx + (2 max(b, c) + 8) u + 2u |L_ref|.
// 4. Gradients. The backward recomputes x and evaluates P = exp(x - row_lse)
//    with the forward's fp32 row_lse: every P (and Q) has a relative error
//    eps_G = dx + tau_lse + 8u (logit error, lse error, exp and the fp32
//    multiply-adds forming G), plus at most u/e absolute from rounding the
//    exponent's argument. Each entry of G therefore errs by at most
//        W_ij eps_G + 2u |g|/N + 3u |G_ij|
//    (W_ij = |g|/N (P + Q + 2[positive]) , N = 2b or b; the last term covers
//    the fp32 products s * G and coefficients). dq_it = sum_j s G_ij k_jt is
//    an fp32 sum of c products (tile GEMMs accumulating into one buffer),
//    adding gamma_c s sum_j |G_ij| |k_jt|. Hence
//        tau_dq = s [eps_G sum_j W_ij |k_jt| + 2u |g|/N sum_j |k_jt|
//                    + (gamma_c + 3u) sum_j |G_ij| |k_jt|],
//    the same for dk with the roles of q and k (sum over i, gamma_b), and for
//    ds = sum_ij G_ij raw_ij: R_ij replaces |k_jt|, plus gamma_d sum |G| R for
//    the logits and gamma_{c+1} for the fp32 per-row sums.
// 5. All bounds are first order; a factor `slack` = 2 covers the second-order
//    terms (e^eps - 1 vs eps with eps < 1e-2) and products of errors.
// 7. At the CPU ISA level avx512bf16, bf16 inputs' products run on vdpbf16ps:
//    the logits' products stay exact (bf16 x bf16) with fp32 sums, so 1.-3.
//    hold as they are; G (fp32) enters dq's and dk's products either split
//    in two bf16 parts, hi + lo (FLATMEM_FP32_PRECISION_DEFAULT / FULL:
//    residual <= 2^-16 |G|, and twice the terms, a second gamma_c), or
//    rounded once (TF32: 2^-8 |G|). Either adds (rho + gamma_c) sum |G| |k|.
// 6. 16-bit outputs are the fp32 result rounded once (RNE): add half an ulp,
//    relative 2^-8 for bf16 (8 significant bits) and 2^-11 for fp16
//    (11 bits), plus 2^-25 absolute for fp16 subnormals (spacing 2^-24).
//    bf16 shares fp32's exponent range, so its subnormals need nothing extra.
//
// These are worst-case bounds (error analysis), not fitted constants: the
// observed errors are typically 10-100x smaller (sqrt(n) instead of n), and a
// real defect (a dropped tile, a wrong scale, a missing column term) moves
// the results by far more, e.g. a missing column changes an LSE by about 1/c.
#pragma once

#include <flatmem/flatmem.h>

#include <cmath>
#include <cstdlib>
#include <vector>

#include "support/reference.hpp"
#include "support/tensor.hpp"

namespace flatmem_test {

constexpr double u32 = 0x1p-24;
constexpr double slack = 2.0;

inline double gamma_n(double n) { return n * u32 / (1.0 - n * u32); }

struct ForwardTolerance {
  double logit = 0.0;  // dx
  double loss = 0.0;
  std::vector<double> row_lse, col_lse;
  double max_lse = 0.0;  // largest of row_lse / col_lse tolerances
};

inline ForwardTolerance forward_tolerance(const ReferenceProblem &p, const ReferenceResult &r) {
  ForwardTolerance t;
  t.logit = p.scale * gamma_n(double(p.d + 1)) * r.max_abs_dot;
  const auto lse_tol = [&](double n, double lse) {
    return slack * (t.logit + (2.0 * n + 8.0) * u32 + 2.0 * u32 * std::fabs(lse));
  };
  for (double v : r.row_lse) t.row_lse.push_back(lse_tol(double(p.c), v));
  for (double v : r.col_lse) t.col_lse.push_back(lse_tol(double(p.b), v));
  for (double v : t.row_lse) t.max_lse = std::max(t.max_lse, v);
  for (double v : t.col_lse) t.max_lse = std::max(t.max_lse, v);
  t.loss = slack * (t.logit + (2.0 * double(std::max(p.b, p.c)) + 8.0) * u32 + 2.0 * u32 * std::fabs(r.loss));
  return t;
}

/** Half an ulp of the output format (relative), and its subnormal floor. */
inline double output_rounding(Dtype out) {
  return out == Dtype::bf16 ? 0x1p-8 : out == Dtype::f16 ? 0x1p-11 : 0.0;
}
inline double output_floor(Dtype out) { return out == Dtype::f16 ? 0x1p-25 : 0.0; }

// Whether the CPU's bf16 kernels compute this process's bf16 products: the
// ISA in use is avx512bf16 or above (amx), or a build with FLATMEM_BF16_EMULATED runs their
// SIMDe emulation (FLATMEM_TEST_EMULATE_BF16=1, see src/contrastive/cpu/bf16_gemm.cpp).
inline bool bf16_kernels_in_use() {
  flatmem_cpu_isa in_use = FLATMEM_CPU_ISA_BASELINE;
  if (flatmem_cpu_isa_get(&in_use, nullptr) == FLATMEM_STATUS_SUCCESS && in_use >= FLATMEM_CPU_ISA_AVX512BF16)
    return true;
  const char *emulate = std::getenv("FLATMEM_TEST_EMULATE_BF16");
  return emulate != nullptr && emulate[0] == '1';
}

// Note 7's relative error of G's entry into a product of `terms` terms (0
// where the products are sgemm's on fp32 or widened rows).
inline double gradient_entry_error(Dtype input, double terms,
                                   std::int64_t fp32_precision = FLATMEM_FP32_PRECISION_DEFAULT) {
  if (input != Dtype::bf16 || !bf16_kernels_in_use()) return 0.0;
  return (fp32_precision == FLATMEM_FP32_PRECISION_TF32 ? 0x1p-8 : 0x1p-16) + gamma_n(terms);
}

struct BackwardTolerance {
  std::vector<double> dq, dk;
  double ds = 0.0;
};

inline BackwardTolerance backward_tolerance(const ReferenceProblem &p, const ReferenceResult &r,
                                            const ForwardTolerance &f, Dtype dq_out, Dtype dk_out,
                                            Dtype input = Dtype::f32,
                                            std::int64_t fp32_precision = FLATMEM_FP32_PRECISION_DEFAULT) {
  BackwardTolerance t;
  const double eps_g = f.logit + f.max_lse + 8.0 * u32;
  const auto matrix_tol = [&](const std::vector<double> &weighted, const std::vector<double> &count,
                              const std::vector<double> &abs, const std::vector<double> &value,
                              double terms, Dtype out) {
    std::vector<double> tol(value.size());
    for (std::size_t n = 0; n < value.size(); ++n) {
      const double fp32 = slack * (eps_g * weighted[n] + 2.0 * u32 * count[n] +
                                   (gamma_n(terms) + 3.0 * u32 +
                                    gradient_entry_error(input, terms, fp32_precision)) * abs[n]);
      // rounding a value that is already off by fp32 to 16 bits
      tol[n] = fp32 * (1.0 + output_rounding(out)) + output_rounding(out) * std::fabs(value[n]) +
               output_floor(out);
    }
    return tol;
  };
  t.dq = matrix_tol(r.dq_weighted, r.dq_count, r.dq_abs, r.dq, double(p.c), dq_out);
  t.dk = matrix_tol(r.dk_weighted, r.dk_count, r.dk_abs, r.dk, double(p.b), dk_out);
  t.ds = slack * (eps_g * r.ds_weighted + 2.0 * u32 * r.ds_count +
                  (gamma_n(double(p.d)) + gamma_n(double(p.c + 1)) + 3.0 * u32) * r.ds_abs) +
         2.0 * u32 * std::fabs(r.ds);
  return t;
}

}  // namespace flatmem_test
