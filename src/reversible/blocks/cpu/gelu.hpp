// Exact GELU and its derivative in fp32, written so that the loops calling it
// vectorise (no libm call, no branch):
//   GELU(u)  = u Phi(u),          Phi(u) = (1 + erf(u / sqrt 2)) / 2 = erfc(-u / sqrt 2) / 2
//   GELU'(u) = Phi(u) + u phi(u), phi(u) = exp(-u^2 / 2) / sqrt(2 pi)
// erfc(z), z >= 0, by Numerical Recipes' Chebyshev fit
//   erfc(z) = t exp(-z^2 + P(t)),  t = 1 / (1 + z/2),  relative error < 1.2e-7,
// so Phi is accurate relative to itself in the negative tail too (no 1 + erf
// cancellation). exp(-z^2) = exp(-u^2/2) is formed without rounding u^2: u is
// split into hi (top 12 significant bits) + lo, so hi^2 and hi*lo are exact in
// fp32 and exp(-u^2/2) = exp(-hi^2/2) exp(-(hi lo + lo^2/2)). Altogether GELU
// and GELU' are within a few 1e-7 relative of the exact values.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/fast_exp.hpp"

namespace flatmem::blocks::cpu {

// Phi(u) and phi(u).
inline void normal_cdf_pdf(float u, float &cdf, float &pdf) {
  const float uc = u < -64.0f ? -64.0f : (u > 64.0f ? 64.0f : u);  // exp(-u^2/2) is 0 beyond
  const float z = std::fabs(uc) * 0.70710678118654752f;
  const float t = 1.0f / (1.0f + 0.5f * z);
  float p = 0.17087277f;
  p = p * t - 0.82215223f;
  p = p * t + 1.48851587f;
  p = p * t - 1.13520398f;
  p = p * t + 0.27886807f;
  p = p * t - 0.18628806f;
  p = p * t + 0.09678418f;
  p = p * t + 0.37409196f;
  p = p * t + 1.00002368f;
  p = p * t - 1.26551223f;
  std::uint32_t bits;
  std::memcpy(&bits, &uc, 4);
  bits &= 0xfffff000u;
  float hi;
  std::memcpy(&hi, &bits, 4);
  const float lo = uc - hi;
  const float gauss = fast_exp(-0.5f * (hi * hi)) * fast_exp(-(hi * lo + 0.5f * (lo * lo)));
  const float half_erfc = 0.5f * t * gauss * fast_exp(p);
  cdf = u >= 0.0f ? 1.0f - half_erfc : half_erfc;
  cdf = u != u ? u : cdf;  // NaN in, NaN out
  pdf = gauss * 0.39894228040143268f;
}

// g[i] = GELU(u[i]), i < n.
void gelu(const float *u, std::int64_t n, float *g);

// g[i] = GELU(u[i]) and d[i] *= GELU'(u[i]) (d holds dL/dGELU, leaves dL/du).
void gelu_backward(const float *u, std::int64_t n, float *g, float *d);

}  // namespace flatmem::blocks::cpu
