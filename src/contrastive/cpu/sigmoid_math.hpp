// Element-wise work of the sigmoid (SigLIP) loss on one logit tile held in
// fp32: raw_ij = <q_i, k_j>, R rows x C columns (row-major, ld C), x_ij =
// s raw_ij + t. Compiled once per CPU ISA like tile_math.hpp; sums use
// `omp simd` reductions, so their order is fixed by the code and the ISA, not
// by the thread that runs the tile.
//
// With v = -z x (z = +1 at the row's positive column, -1 elsewhere):
//   loss term  softplus(v) = max(v, 0) + log1p(exp(-|v|)), summed in double;
//              exp by core/fast_exp.hpp (< 2 ulp), log1p in double by a
//              series (log1p_unit): vectorised, one exponential per element
//              shared with the gradient
//   G_ij       coef * (-z) sigmoid(v), sigmoid(v) = 1/(1+e) (v >= 0) or
//              e/(1+e) (v < 0), e = exp(-|v|): no overflow, no 1 - sigmoid.
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
