// Element types flatmem accepts and the scalar conversions between them.
// bf16 and fp16 are widened to fp32 tile by tile; results are rounded to
// nearest-even once, at the end.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace flatmem {

enum class Dtype { f32, bf16, f16, i64 };

inline std::size_t dtype_bytes(Dtype t) {
  switch (t) {
    case Dtype::f32: return 4;
    case Dtype::bf16:
    case Dtype::f16: return 2;
    case Dtype::i64: return 8;
  }
  return 0;
}

const char *dtype_name(Dtype t);

inline float bits_to_f32(std::uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
inline std::uint32_t f32_to_bits(float f) {
  std::uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return bits;
}

inline float bf16_to_f32(std::uint16_t h) { return bits_to_f32(std::uint32_t(h) << 16); }

// Round to nearest even; NaN stays NaN (quiet).
inline std::uint16_t f32_to_bf16(float f) {
  std::uint32_t x = f32_to_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return std::uint16_t((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return std::uint16_t(x >> 16);
}

// IEEE binary16 -> binary32, exact (subnormals included).
inline float f16_to_f32(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t(h & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1fu;
  const std::uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return bits_to_f32(sign | 0x7f800000u | (mantissa << 13));
  if (exponent != 0) return bits_to_f32(sign | ((exponent + 112u) << 23) | (mantissa << 13));
  // zero or subnormal: mantissa * 2^-24
  const float magnitude = float(mantissa) * 5.9604644775390625e-8f;
  return sign ? -magnitude : magnitude;
}

// binary32 -> binary16, round to nearest even, overflow to Inf.
std::uint16_t f32_to_f16(float f);

}  // namespace flatmem
