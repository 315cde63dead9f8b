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

SigmoidSums sigmoid_tile(const float *raw, float *out, std::int64_t rows, std::int64_t cols,
                         const SigmoidTile &t, bool want_loss) {
  SigmoidSums sums;
  for (std::int64_t i = 0; i < rows; ++i) {
    const float *x = raw + i * cols;
    const std::int64_t p = t.positive_col[i];
    if (want_loss) {
      // log1p is a libm call (not vectorised): the loss pass is kept apart
      // from the gradient pass so that the latter vectorises.
      double loss = 0.0;
      for (std::int64_t j = 0; j < cols; ++j) {
        const float logit = t.scale * x[j] + t.bias;
        const float v = j == p ? -logit : logit;
        loss += double(std::fmax(v, 0.0f)) + double(std::log1p(std::exp(-std::fabs(v))));
      }
      sums.loss += loss;
    }
    if (out == nullptr) continue;
    float *o = out + i * cols;
    double ds = 0.0, dt = 0.0;
#pragma omp simd reduction(+ : ds, dt)
    for (std::int64_t j = 0; j < cols; ++j) {
      const float raw_ij = x[j];
      const float logit = t.scale * raw_ij + t.bias;
      const bool positive = j == p;
      const float v = positive ? -logit : logit;
      const float e = fast_exp(-std::fabs(v));
      const float sig = (v >= 0.0f ? 1.0f : e) / (1.0f + e);
      const float g = t.coef * (positive ? -sig : sig);
      ds += double(g) * double(raw_ij);
      dt += double(g);
      o[j] = t.scale * g;
    }
    sums.ds += ds;
    sums.dt += dt;
  }
  return sums;
}

}  // namespace flatmem::contrastive::cpu::FLATMEM_ISA_NS

#endif
