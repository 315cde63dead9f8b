// Element-wise work of the sigmoid (SigLIP) loss on one logit tile held in
// fp32: raw_ij = <q_i, k_j>, R rows x C columns (row-major, ld C), x_ij =
// s raw_ij + t. Compiled once per CPU ISA like tile_math.hpp; sums use
// `omp simd` reductions, so their order is fixed by the code and the ISA, not
// by the thread that runs the tile.
//
// With v = -z x (z = +1 at the row's positive column, -1 elsewhere):
//   loss term  softplus(v) = max(v, 0) + log1p(exp(-|v|)), the two parts
//              widened to double and summed in double; exp by
//              core/fast_exp.hpp (< 2 ulp), log1p in fp32 (log1p_unit:
//              Cephes' logf polynomial plus the rounding error of 1 + e,
//              absolute error <= 0.74 u = 0.74 * 2^-24, checked for every
//              fp32 e in [0, 1]); one exponential per element shared with
//              the gradient. Per term: <= 2u from exp, 0.74u from log1p.
//   G_ij       coef * (-z) sigmoid(v), sigmoid(v) = 1/(1+e) (v >= 0) or
//              e/(1+e) (v < 0), e = exp(-|v|): no overflow, no 1 - sigmoid.
// Each row runs as the vectorised loop over its negatives left and right of
// the positive column plus the positive alone, so the loop body has no
// per-element test (which had kept the SSE2 baseline from vectorising).
#pragma once

#include <cstdint>

namespace flatmem::contrastive::cpu {

// log1p(e) for e in [0, 1] in fp32, branch-free so that the loop vectorises
// (the double version this replaces, a series after a double division, was
// most of the kernel's time). m = fl(1 + e) in [1, 2] and its rounding error
// c = e - (m - 1), both exact; m = 2^k (1 + f), k in {0, 1}, f in [-0.293,
// 0.415] exact; log(1 + f) = f - f^2/2 + f^3 P(f) with Cephes' logf
// polynomial, ln 2 split in two parts, and log1p(e) = k ln 2 + log(1 + f) +
// c / m (c / m to 12 %: c (1 - e/2), an error below 0.12 u). Checked against
// double log1p for every fp32 e in [0, 1], with and without fused
// multiply-adds: absolute error <= 0.74 u (u = 2^-24); bench/log1p_unit_check
// (CTest bench/log1p_unit_check samples it, --all checks every e).
// Inline here so that each ISA's kernel compiles it with its own target.
inline float log1p_unit(float e) {
  const float m = 1.0f + e;
  const float c = e - (m - 1.0f);
  const bool upper = m > 1.41421356f;
  const float k = upper ? 1.0f : 0.0f;
  const float f = (upper ? 0.5f * m : m) - 1.0f;
  const float z = f * f;
  float p = 7.0376836292e-2f;
  p = p * f - 1.1514610310e-1f;
  p = p * f + 1.1676998740e-1f;
  p = p * f - 1.2420140846e-1f;
  p = p * f + 1.4249322787e-1f;
  p = p * f - 1.6668057665e-1f;
  p = p * f + 2.0000714765e-1f;
  p = p * f - 2.4999993993e-1f;
  p = p * f + 3.3333331174e-1f;
  float y = p * f * z;
  y += -2.12194440e-4f * k;  // ln 2 = 0.693359375 - 2.12194440e-4 (+ 2e-12)
  y += -0.5f * z;
  y += c * (1.0f - 0.5f * e);
  return (f + y) + 0.693359375f * k;
}

struct SigmoidTile {
  float scale = 1.0f, bias = 0.0f;
  const std::int64_t *positive_col = nullptr;  // (R) positive column in the tile, or < 0
  // Gradient: coef = g / b. out == nullptr: loss only (forward).
  float coef = 0.0f;
};

// The tile's sums (double): loss = sum softplus(v_ij) (when want_loss), and
// with out set, ds = sum G_ij raw_ij, dt = sum G_ij, and out_ij = s G_ij
// (out may be raw itself: in place).
struct SigmoidSums {
  double loss = 0.0, ds = 0.0, dt = 0.0;
};
SigmoidSums sigmoid_tile(const float *raw, float *out, std::int64_t rows, std::int64_t cols,
                         const SigmoidTile &t, bool want_loss);

}  // namespace flatmem::contrastive::cpu
