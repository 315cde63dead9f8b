// exp(x) in fp32 written so that GCC vectorises loops that call it (no
// branches, no libm call). Cephes' expf scheme: x = n ln2 + r with |r| <= ln2/2,
// exp(r) by a degree-7 polynomial (relative error < 2 ulp), 2^n built in the
// exponent bits. Inputs below -87.3 give 0 (the true value is below fp32's
// normal range); NaN propagates. Callers pass x <= 88 (shifted by a maximum).
#pragma once

#include <cstdint>
#include <cstring>

namespace flatmem {

inline float fast_exp(float x) {
  const float clamped = x < -87.3f ? -87.3f : (x > 88.0f ? 88.0f : x);
  // n = round(x / ln2) with the 1.5 * 2^23 trick (round to nearest, vectorisable)
  const float shifter = 12582912.0f;
  const float t = clamped * 1.44269504088896341f + shifter;
  const float n = t - shifter;
  const float r = (clamped - n * 0.693359375f) + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  std::uint32_t bits;
  std::memcpy(&bits, &t, 4);  // t = 1.5 * 2^23 + n: its low mantissa bits hold n
  const std::uint32_t scale_bits = (bits - 0x4b400000u + 127u) << 23;
  float scale;
  std::memcpy(&scale, &scale_bits, 4);
  const float result = p * scale;
  return x < -87.3f ? 0.0f : result;
}

}  // namespace flatmem
