// The sigmoid-loss tile kernel, compiled once per CPU ISA (see
// sigmoid_math.hpp for the math, core/isa_variants.hpp for the mechanism).
// The part below #else is included three times by core/compile_per_isa.inc.
#ifndef FLATMEM_ISA_NS
#include "contrastive/cpu/sigmoid_math.hpp"

#include <cmath>
#include <cstdint>

#include "core/fast_exp.hpp"
#include "core/isa_variants.hpp"

#define FLATMEM_ISA_SELF "contrastive/cpu/sigmoid_math.cpp"
#include "core/compile_per_isa.inc"

namespace flatmem::contrastive::cpu {

SigmoidSums sigmoid_tile(const float *raw, float *out, std::int64_t rows, std::int64_t cols,
                         const SigmoidTile &t, bool want_loss) {
  FLATMEM_ISA_CALL(sigmoid_tile, raw, out, rows, cols, t, want_loss);
}

}  // namespace flatmem::contrastive::cpu

#else  // ---- kernels, once per ISA ------------------------------------------------

namespace flatmem::contrastive::cpu::FLATMEM_ISA_NS {
namespace {

// log1p(e) for e in [0, 1], in double and branch-free so that the loop
// vectorises: 1 + e is exact in double (e is fp32); y = 1 + e = 2^n m with
// n in {0, 1}, m in [sqrt(1/2), sqrt(2)]; log m = 2 atanh(r), r = (m - 1) /
// (m + 1), |r| <= 0.1716, by its series through r^11 (the first omitted term,
// 2 r^13 / 13 < 2e-11, is below u/3 = 2^-24/3).
inline double log1p_unit(double e) {
  const double y = 1.0 + e;
  const bool upper = y > 1.4142135623730951;
  const double m = upper ? 0.5 * y : y;
  const double r = (m - 1.0) / (m + 1.0), r2 = r * r;
  double p = 1.0 / 11.0;
  p = p * r2 + 1.0 / 9.0;
  p = p * r2 + 1.0 / 7.0;
  p = p * r2 + 1.0 / 5.0;
  p = p * r2 + 1.0 / 3.0;
  p = p * r2 + 1.0;
  return (upper ? 0.6931471805599453 : 0.0) + 2.0 * r * p;
}

// One row: Loss adds softplus(v_j) into *loss; Grad writes out_j = s G_j and
// adds G_j raw_j, G_j into *ds, *dt. One exponential per element serves both.
template <bool Loss, bool Grad>
void sigmoid_row(const float *x, float *o, std::int64_t cols, std::int64_t p, const SigmoidTile &t,
                 double *loss_out, double *ds_out, double *dt_out) {
  double loss = 0.0, ds = 0.0, dt = 0.0;
#pragma omp simd reduction(+ : loss, ds, dt)
  for (std::int64_t j = 0; j < cols; ++j) {
    const float raw_ij = x[j];
    const float logit = t.scale * raw_ij + t.bias;
    const bool positive = j == p;
    const float v = positive ? -logit : logit;
    const float e = fast_exp(-std::fabs(v));  // in [0, 1]
    if constexpr (Loss) loss += double(v > 0.0f ? v : 0.0f) + log1p_unit(double(e));  // NaN: via e
    if constexpr (Grad) {
      const float sig = (v >= 0.0f ? 1.0f : e) / (1.0f + e);
      const float g = t.coef * (positive ? -sig : sig);
      ds += double(g) * double(raw_ij);
      dt += double(g);
      o[j] = t.scale * g;
    }
  }
  *loss_out += loss;
  *ds_out += ds;
  *dt_out += dt;
}

template <bool Loss, bool Grad>
SigmoidSums sigmoid_rows(const float *raw, float *out, std::int64_t rows, std::int64_t cols,
                         const SigmoidTile &t) {
  SigmoidSums sums;
  for (std::int64_t i = 0; i < rows; ++i)
    sigmoid_row<Loss, Grad>(raw + i * cols, Grad ? out + i * cols : nullptr, cols,
                            t.positive_col[i], t, &sums.loss, &sums.ds, &sums.dt);
  return sums;
}

}  // namespace

SigmoidSums sigmoid_tile(const float *raw, float *out, std::int64_t rows, std::int64_t cols,
                         const SigmoidTile &t, bool want_loss) {
  if (out == nullptr) return want_loss ? sigmoid_rows<true, false>(raw, out, rows, cols, t) : SigmoidSums{};
  return want_loss ? sigmoid_rows<true, true>(raw, out, rows, cols, t)
                   : sigmoid_rows<false, true>(raw, out, rows, cols, t);
}

}  // namespace flatmem::contrastive::cpu::FLATMEM_ISA_NS

#endif
