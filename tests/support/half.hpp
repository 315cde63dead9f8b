// bf16 / fp16 <-> fp32 conversions for the tests, written from the number
// formats' definitions (IEEE 754 binary16; bfloat16 = binary32 with 8
// significant bits) using double arithmetic, deliberately not with the bit
// tricks of src/core/dtype.hpp, so that a shared mistake cannot hide.
//
// Rounding is to nearest, ties to even (std::nearbyint in the default mode).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace flatmem_test {

namespace detail {

// Rounds |a| (finite, >= 0) to `precision` significant bits, with a fixed
// spacing below the smallest normal 0.5 * 2^min_exponent (frexp convention:
// a = f * 2^e, f in [0.5, 1)). Returns the rounded magnitude as a double.
inline double round_to_format(double a, int precision, int min_exponent) {
  if (a == 0.0) return 0.0;
  int e = 0;
  std::frexp(a, &e);
  if (e < min_exponent) e = min_exponent;                // subnormal range: fixed spacing
  const double spacing = std::ldexp(1.0, e - precision);  // one unit in the last place
  return std::nearbyint(a / spacing) * spacing;           // a / spacing is exact (power of 2)
}

}  // namespace detail

/** binary32 -> bfloat16 bits, round to nearest even; NaN stays a (quiet) NaN. */
inline std::uint16_t bf16_from_float(float f) {
  const bool negative = std::signbit(f);
  const std::uint16_t sign = negative ? 0x8000u : 0u;
  if (std::isnan(f)) return std::uint16_t(sign | 0x7fc0u);
  if (std::isinf(f)) return std::uint16_t(sign | 0x7f80u);
  // bf16: 8 significant bits, smallest normal 2^-126 = 0.5 * 2^-125.
  const double r = detail::round_to_format(std::fabs(double(f)), 8, -125);
  if (r >= std::ldexp(1.0, 128)) return std::uint16_t(sign | 0x7f80u);  // rounded past the largest finite
  // r has at most 8 significant bits, so as a binary32 its low 16 bits are zero.
  const float rf = float(r);
  std::uint32_t bits;
  std::memcpy(&bits, &rf, 4);
  return std::uint16_t(sign | (bits >> 16));
}

/** bfloat16 bits -> binary32 (exact). */
inline float float_from_bf16(std::uint16_t h) {
  const bool negative = (h & 0x8000u) != 0;
  const int exponent = (h >> 7) & 0xff;
  const int mantissa = h & 0x7f;
  double magnitude;
  if (exponent == 0xff)
    magnitude = mantissa ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  else if (exponent == 0)
    magnitude = std::ldexp(double(mantissa), -126 - 7);
  else
    magnitude = std::ldexp(double(128 + mantissa), exponent - 127 - 7);
  return float(negative ? -magnitude : magnitude);
}

/** binary32 -> binary16 bits, round to nearest even, overflow to Inf. */
inline std::uint16_t f16_from_float(float f) {
  const bool negative = std::signbit(f);
  const std::uint16_t sign = negative ? 0x8000u : 0u;
  if (std::isnan(f)) return std::uint16_t(sign | 0x7e00u);
  if (std::isinf(f)) return std::uint16_t(sign | 0x7c00u);
  // binary16: 11 significant bits, smallest normal 2^-14 = 0.5 * 2^-13.
  const double r = detail::round_to_format(std::fabs(double(f)), 11, -13);
  if (r >= 65536.0) return std::uint16_t(sign | 0x7c00u);  // largest finite is 65504
  if (r < std::ldexp(1.0, -14))                            // subnormal (or zero): r / 2^-24
    return std::uint16_t(sign | std::uint16_t(std::ldexp(r, 24)));
  int e = 0;
  const double f_part = std::frexp(r, &e);  // r = f_part * 2^e, f_part in [0.5, 1)
  const int biased = (e - 1) + 15;
  const int mantissa = int(std::ldexp(f_part, 11)) - 1024;  // 11 significant bits, hidden one removed
  return std::uint16_t(sign | (biased << 10) | mantissa);
}

/** binary16 bits -> binary32 (exact). */
inline float float_from_f16(std::uint16_t h) {
  const bool negative = (h & 0x8000u) != 0;
  const int exponent = (h >> 10) & 0x1f;
  const int mantissa = h & 0x3ff;
  double magnitude;
  if (exponent == 0x1f)
    magnitude = mantissa ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  else if (exponent == 0)
    magnitude = std::ldexp(double(mantissa), -24);
  else
    magnitude = std::ldexp(double(1024 + mantissa), exponent - 15 - 10);
  return float(negative ? -magnitude : magnitude);
}

/** x rounded to the nearest bf16 / fp16 value, as a float. */
inline float round_to_bf16(float x) { return float_from_bf16(bf16_from_float(x)); }
inline float round_to_f16(float x) { return float_from_f16(f16_from_float(x)); }

}  // namespace flatmem_test
