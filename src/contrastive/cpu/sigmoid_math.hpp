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
