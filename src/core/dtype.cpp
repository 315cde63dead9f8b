#include "core/dtype.hpp"

#include <cmath>

namespace flatmem {

const char *dtype_name(Dtype t) {
  switch (t) {
    case Dtype::f32: return "float32";
    case Dtype::bf16: return "bfloat16";
    case Dtype::f16: return "float16";
    case Dtype::i64: return "int64";
  }
  return "?";
}

std::uint16_t f32_to_f16(float f) {
  const std::uint32_t x = f32_to_bits(f);
  const std::uint16_t sign = std::uint16_t((x >> 16) & 0x8000u);
  const std::uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return std::uint16_t(sign | 0x7e00u);        // NaN
  if (abs >= 0x477ff000u) return std::uint16_t(sign | 0x7c00u);       // rounds to >= 65520: Inf
  if (abs < 0x38800000u) {                                            // below 2^-14: subnormal
    // value / 2^-24 rounded to nearest even
    const float scaled = bits_to_f32(abs) * 16777216.0f;
    return std::uint16_t(sign | std::uint16_t(std::nearbyint(scaled)));
  }
  // normal: rebias exponent (127 -> 15) and round the mantissa from 23 to 10 bits
  std::uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);
  return std::uint16_t(sign | ((rounded - (112u << 23)) >> 13));
}

}  // namespace flatmem
