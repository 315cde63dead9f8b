// Self-tests of the test helpers (tests/support): the bf16/fp16 rounding
// written from the format definitions and the DLTensor builders. A wrong
// helper would make the library tests meaningless, so they are checked
// against values known from the IEEE 754 / bfloat16 definitions.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "support/half.hpp"
#include "support/tensor.hpp"

using namespace flatmem_test;

namespace {
float from_bits(std::uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
std::uint32_t to_bits(float f) {
  std::uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}
}  // namespace

TEST_CASE("support/fp16/known-values") {
  CHECK(f16_from_float(0.0f) == 0x0000);
  CHECK(f16_from_float(-0.0f) == 0x8000);
  CHECK(f16_from_float(1.0f) == 0x3c00);
  CHECK(f16_from_float(-2.0f) == 0xc000);
  CHECK(f16_from_float(65504.0f) == 0x7bff);               // largest finite
  CHECK(f16_from_float(65519.99f) == 0x7bff);              // below the midpoint to 65536
  CHECK(f16_from_float(65520.0f) == 0x7c00);               // the midpoint ties to "even" = Inf
  CHECK(f16_from_float(1e6f) == 0x7c00);
  CHECK(f16_from_float(0x1p-14f) == 0x0400);               // smallest normal
  CHECK(f16_from_float(0x1p-24f) == 0x0001);               // smallest subnormal
  CHECK(f16_from_float(0x1p-25f) == 0x0000);               // tie to even: 0
  CHECK(f16_from_float(0x1.8p-25f) == 0x0001);             // above the tie
  CHECK(f16_from_float(3.0f * 0x1p-25f) == 0x0002);        // 1.5 ulp: tie to even (2)
  CHECK(f16_from_float(1.0f / 3.0f) == 0x3555);
  CHECK(f16_from_float(1.0f + 0x1p-11f) == 0x3c00);        // tie: stays at even 1.0
  CHECK(f16_from_float(1.0f + 3 * 0x1p-11f) == 0x3c02);    // tie: rounds up to even
  CHECK((f16_from_float(std::numeric_limits<float>::quiet_NaN()) & 0x7fff) > 0x7c00);
  CHECK(f16_from_float(-std::numeric_limits<float>::infinity()) == 0xfc00);
  CHECK(float_from_f16(0x3555) == 0.333251953125f);
  CHECK(float_from_f16(0x0001) == 0x1p-24f);
  CHECK(float_from_f16(0x7bff) == 65504.0f);
  CHECK(std::isinf(float_from_f16(0x7c00)));
  CHECK(std::isnan(float_from_f16(0x7e00)));
}

TEST_CASE("support/fp16/round-trip-of-every-value") {
  // Every finite binary16 value widens exactly and rounds back to itself;
  // values strictly between two neighbours round to the nearer one.
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const float f = float_from_f16(std::uint16_t(h));
    if (std::isnan(f)) continue;
    REQUIRE(f16_from_float(f) == h);
    if ((h & 0x7fff) < 0x7bff) {  // not the largest finite or Inf
      const float next = float_from_f16(std::uint16_t(h + 1));
      const float quarter = f + (next - f) / 4;  // exact: few significant bits
      const float three_quarters = f + 3 * (next - f) / 4;
      REQUIRE(f16_from_float(quarter) == h);
      REQUIRE(f16_from_float(three_quarters) == h + 1);
    }
  }
}

TEST_CASE("support/bf16/known-values") {
  CHECK(bf16_from_float(1.0f) == 0x3f80);
  CHECK(bf16_from_float(-1.0f) == 0xbf80);
  CHECK(bf16_from_float(1.0f / 3.0f) == 0x3eab);
  CHECK(bf16_from_float(from_bits(0x3f808000u)) == 0x3f80);  // tie: stays even
  CHECK(bf16_from_float(from_bits(0x3f818000u)) == 0x3f82);  // tie: rounds up to even
  CHECK(bf16_from_float(from_bits(0x3f808001u)) == 0x3f81);  // above the tie
  CHECK(bf16_from_float(std::numeric_limits<float>::max()) == 0x7f80);  // rounds past the largest bf16
  CHECK(bf16_from_float(from_bits(0x7f7f0000u)) == 0x7f7f);            // largest finite bf16
  CHECK(bf16_from_float(from_bits(0x00010000u)) == 0x0001);            // subnormal
  CHECK(bf16_from_float(from_bits(0x00008000u)) == 0x0000);            // subnormal tie to even
  CHECK(bf16_from_float(from_bits(0x00018000u)) == 0x0002);
  CHECK((bf16_from_float(std::numeric_limits<float>::quiet_NaN()) & 0x7fff) > 0x7f80);
  CHECK(float_from_bf16(0x3eab) == from_bits(0x3eab0000u));
}

TEST_CASE("support/bf16/agrees-with-truncation-rule-on-a-sweep") {
  // bf16 is the top half of binary32: RNE(x) = (bits + 0x7fff + lsb) >> 16 for
  // finite x. An independent formula over a sweep of bit patterns.
  for (std::uint64_t b = 0; b < 0x7f800000u; b += 0x1234u) {
    const std::uint32_t bits = std::uint32_t(b);
    const std::uint16_t expected = std::uint16_t((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
    REQUIRE(bf16_from_float(from_bits(bits)) == expected);
    REQUIRE(bf16_from_float(-from_bits(bits)) == (expected | 0x8000));
  }
  for (std::uint32_t h = 0; h < 0x7f80; ++h) REQUIRE(to_bits(float_from_bf16(std::uint16_t(h))) == h << 16);
}

TEST_CASE("support/tensor/matrix-layout-and-padding") {
  HostTensor m = HostTensor::matrix(Dtype::bf16, 3, 4, 6);
  DLTensor *t = m.dl();
  CHECK(t->ndim == 2);
  CHECK(t->shape[0] == 3);
  CHECK(t->shape[1] == 4);
  REQUIRE(t->strides != nullptr);
  CHECK(t->strides[0] == 6);
  CHECK(t->strides[1] == 1);
  CHECK(t->dtype.code == kDLBfloat);
  CHECK(t->dtype.bits == 16);
  CHECK(t->dtype.lanes == 1);
  CHECK(reinterpret_cast<std::uintptr_t>(t->data) % 64 == 0);
  m.set(2, 3, 1.0 / 3.0);
  CHECK(m.get(2, 3) == double(round_to_bf16(float(1.0 / 3.0))));
  CHECK(m.padding_untouched());
  // element (2, 3) sits at 2 * 6 + 3 elements
  std::uint16_t raw;
  std::memcpy(&raw, static_cast<unsigned char *>(t->data) + (2 * 6 + 3) * 2, 2);
  CHECK(raw == 0x3eab);

  HostTensor compact = HostTensor::matrix(Dtype::f32, 2, 2);
  CHECK(compact.dl()->strides == nullptr);
  HostTensor moved = std::move(compact);
  CHECK(moved.dl()->shape[0] == 2);
  CHECK(moved.dl()->shape[1] == 2);

  HostTensor s = HostTensor::scalar(Dtype::f32, 2.5);
  CHECK(s.dl()->ndim == 0);
  CHECK(s.get(0) == 2.5);
  HostTensor s1 = HostTensor::scalar(Dtype::f32, 2.5, true);
  CHECK(s1.dl()->ndim == 1);
  CHECK(s1.dl()->shape[0] == 1);
}
