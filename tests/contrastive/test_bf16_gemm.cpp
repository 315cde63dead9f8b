// The bf16 tile-product kernels (src/contrastive/cpu/bf16_gemm_kernels.inc)
// against float64 products of the same bf16 values, on every machine: the
// kernel source is compiled here over SIMDe's portable emulation of the
// AVX-512 intrinsics (Debian's libsimde-dev), so an AVX2-only machine tests
// the very code an AVX512_BF16 machine runs; where the processor has
// AVX512_BF16 the same source compiled for the hardware (as the library
// compiles it, under the same target pragma) is checked against the same
// bounds too.
//
// Bounds (u = 2^-24, gamma_n = n u / (1 - n u)): bf16 x bf16 products are
// exact in fp32 and vdpbf16ps adds them one at a time into fp32 lanes, so a
// sum of n products (plus the accumulated output, if any) errs by at most
// gamma_{n+1} times the sum of the magnitudes. G (fp32) enters rounded to
// bf16 (relative 2^-8 per entry) or split in hi + lo (residual 2^-16 |G|,
// twice the terms), which adds rho * sum |G| |x| with rho = 2^-8 or 2^-16.
// A missing pair, a wrong tail mask or a misplaced panel moves an entry by a
// whole product, orders of magnitude beyond these bounds.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <simde/x86/avx512.h>

#include "contrastive/cpu/bf16_gemm.hpp"
#include "core/dtype.hpp"
#include "support/bf16_operands.hpp"
#include <flatmem/flatmem.h>

#define FLATMEM_BF16_NS emulated
#define FLATMEM_V(name) simde_mm512_##name
#define FLATMEM_VT(type) simde__##type
#include "contrastive/cpu/bf16_gemm_kernels.inc"
#undef FLATMEM_VT
#undef FLATMEM_V
#undef FLATMEM_BF16_NS

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define FLATMEM_TEST_HARDWARE_BF16 1
#include <immintrin.h>
#pragma GCC push_options
#pragma GCC target("arch=x86-64-v4,avx512bf16,prefer-vector-width=512")
#define FLATMEM_BF16_NS hardware
#define FLATMEM_V(name) _mm512_##name
#define FLATMEM_VT(type) __##type
#include "contrastive/cpu/bf16_gemm_kernels.inc"
#undef FLATMEM_VT
#undef FLATMEM_V
#undef FLATMEM_BF16_NS
#pragma GCC pop_options
#endif

namespace {

namespace bf = flatmem::contrastive::cpu::bf16;
using flatmem::bf16_to_f32;
using flatmem::f32_to_bf16;

using flatmem_test::bf16_gamma_n;
double gamma_n(double n) { return bf16_gamma_n(n); }

// The kernels' three products and G's two conversions, from either build.
struct Kernels {
  const char *name;
  void (*logits)(bf::Rows, bf::Rows, std::int64_t, std::int64_t, std::int64_t, float *, std::uint32_t *);
  void (*rows_times)(const float *, bf::Rows, std::int64_t, std::int64_t, std::int64_t, float *,
                     std::int64_t, bool, std::uint32_t *);
  void (*cols_times)(const float *, bf::Rows, std::int64_t, std::int64_t, std::int64_t, float *,
                     std::int64_t, bool, std::uint32_t *);
  void (*g_rows)(const float *, std::int64_t, std::int64_t, int, std::uint16_t *, std::int64_t);
  void (*g_columns)(const float *, std::int64_t, std::int64_t, int, std::uint32_t *);
};

std::vector<Kernels> builds() {
  std::vector<Kernels> out{{"emulated", emulated::tile_logits, emulated::accumulate_rows_times,
                            emulated::accumulate_cols_times, emulated::convert_g_rows,
                            emulated::convert_g_columns}};
  flatmem_cpu_isa best = FLATMEM_CPU_ISA_BASELINE;
  REQUIRE(flatmem_cpu_isa_get(nullptr, &best) == FLATMEM_STATUS_SUCCESS);
#ifdef FLATMEM_TEST_HARDWARE_BF16
  if (best >= FLATMEM_CPU_ISA_AVX512BF16)  // amx machines have it too
    out.push_back({"avx512bf16 hardware", hardware::tile_logits, hardware::accumulate_rows_times,
                   hardware::accumulate_cols_times, hardware::convert_g_rows, hardware::convert_g_columns});
#endif
  return out;
}

using flatmem_test::Bf16Matrix;
using flatmem_test::gaussian;

std::vector<std::uint32_t> scratch_for(std::int64_t r, std::int64_t c, std::int64_t d) {
  // poisoned: the kernels must write every word they read
  return std::vector<std::uint32_t>(std::size_t(bf::scratch_words(r, c, d)), 0x7fc07fc0u);
}

struct Shape {
  std::int64_t r, c, d, pad;
};
// The last two reduce over more than one K block (bf::kKBlockPairs pairs) with
// an odd remainder: logits over d = 519, dq over c = 261, dk over r = 259.
static_assert(2 * bf::kKBlockPairs < 259, "the K-blocked shapes must span more than one block");
const Shape shapes[] = {{1, 1, 1, 0},   {1, 1, 2, 1},     {6, 64, 2, 0},   {7, 65, 3, 1},
                        {5, 63, 31, 2}, {13, 129, 64, 0}, {37, 97, 97, 3}, {64, 17, 128, 1},
                        {97, 131, 61, 0}, {7, 11, 519, 2}, {259, 261, 33, 1}};

TEST_CASE("contrastive/bf16-kernels/logits-within-the-fp32-accumulation-bound") {
  std::mt19937_64 rng(11);
  for (const Kernels &kern : builds())
    for (const Shape &s : shapes) {
      CAPTURE(kern.name);
      CAPTURE(s.r);
          CAPTURE(s.c);
          CAPTURE(s.d);
          CAPTURE(s.pad);
      const Bf16Matrix q(s.r, s.d, s.pad, rng), k(s.c, s.d, s.pad, rng);
      std::vector<float> raw(std::size_t(s.r * s.c), -1.0f);
      auto scratch = scratch_for(s.r, s.c, s.d);
      kern.logits(q.rows_view(), k.rows_view(), s.r, s.c, s.d, raw.data(), scratch.data());
      for (std::int64_t i = 0; i < s.r; ++i)
        for (std::int64_t j = 0; j < s.c; ++j) {
          double exact = 0.0, magnitude = 0.0;
          for (std::int64_t t = 0; t < s.d; ++t) {
            exact += q.at(i, t) * k.at(j, t);
            magnitude += std::fabs(q.at(i, t) * k.at(j, t));
          }
          const double err = std::fabs(double(raw[std::size_t(i * s.c + j)]) - exact);
          REQUIRE(err <= gamma_n(double(s.d)) * magnitude);  // NaN fails too
        }
    }
}

// out = out0 + sum over the reduction of G x (x = k for dq, q for dk), in
// float64 of the exact values, and the magnitude sum the bound scales.
struct Expected {
  std::vector<double> value, magnitude, g_magnitude;
};

Expected expected_product(bool rows_times, const std::vector<float> &g, const Bf16Matrix &x,
                          const std::vector<float> &out0, std::int64_t r, std::int64_t c, std::int64_t d) {
  const std::int64_t m = rows_times ? r : c, n = rows_times ? c : r;  // output rows, reduction
  Expected e{std::vector<double>(std::size_t(m * d)), std::vector<double>(std::size_t(m * d)),
             std::vector<double>(std::size_t(m * d))};
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t t = 0; t < d; ++t) {
      const std::size_t o = std::size_t(i * d + t);
      double v = out0[o], mag = std::fabs(out0[o]), gmag = 0.0;
      for (std::int64_t j = 0; j < n; ++j) {
        const double gij = rows_times ? g[std::size_t(i * c + j)] : g[std::size_t(j * c + i)];
        const double xv = x.at(j, t);
        v += gij * xv;
        mag += std::fabs(gij * xv);
        gmag += std::fabs(gij * xv);
      }
      e.value[o] = v, e.magnitude[o] = mag, e.g_magnitude[o] = gmag;
    }
  return e;
}

// Largest error relative to the G term's magnitude, after checking each
// entry against the bound for G rounded with relative error rho.
double check_product(const Kernels &kern, bool rows_times, bool split, const Shape &s,
                     std::mt19937_64 &rng) {
  const Bf16Matrix x(rows_times ? s.c : s.r, s.d, s.pad, rng);
  // G spans magnitudes like a softmax gradient: most entries small, a few large
  std::vector<float> g = gaussian(std::size_t(s.r * s.c), rng, 1e-3f);
  for (std::int64_t i = 0; i < std::min(s.r, s.c); ++i) g[std::size_t(i * s.c + i)] = -0.5f;
  const std::int64_t m = rows_times ? s.r : s.c;
  std::vector<float> out = gaussian(std::size_t(m * s.d), rng, 0.1f);
  const Expected e = expected_product(rows_times, g, x, out, s.r, s.c, s.d);
  auto scratch = scratch_for(s.r, s.c, s.d);
  if (rows_times)
    kern.rows_times(g.data(), x.rows_view(), s.r, s.c, s.d, out.data(), s.d, split, scratch.data());
  else
    kern.cols_times(g.data(), x.rows_view(), s.r, s.c, s.d, out.data(), s.d, split, scratch.data());
  const double terms = double(rows_times ? s.c : s.r) * (split ? 2.0 : 1.0) + 1.0;
  const double rho = split ? 0x1p-16 : 0x1p-8;
  double worst = 0.0;
  for (std::size_t o = 0; o < out.size(); ++o) {
    const double err = std::fabs(double(out[o]) - e.value[o]);
    // the split's terms: hi x and lo x, each |.| <= |G x| (1 + 2^-8)
    const double bound = gamma_n(terms) * e.magnitude[o] * (1.0 + 0x1p-7) + rho * e.g_magnitude[o];
    REQUIRE(err <= bound);
    worst = std::max(worst, err / std::max(e.g_magnitude[o], 1e-30));
  }
  return worst;
}

TEST_CASE("contrastive/bf16-kernels/gradient-products-within-their-bounds") {
  std::mt19937_64 rng(12);
  for (const Kernels &kern : builds())
    for (const Shape &s : shapes)
      for (bool rows_times : {true, false})
        for (bool split : {true, false}) {
          CAPTURE(kern.name);
          CAPTURE(s.r);
          CAPTURE(s.c);
          CAPTURE(s.d);
          CAPTURE(s.pad);
          CAPTURE(rows_times);
          CAPTURE(split);
          check_product(kern, rows_times, split, s, rng);
        }
}

TEST_CASE("contrastive/bf16-kernels/the-split-is-what-makes-gradients-fp32-accurate") {
  // Rounded once, G's error shows at the 2^-8 level (the split's bound, 2^-16
  // plus accumulation, would fail it); split, it stays near fp32 accumulation.
  // So a kernel that ignored `split` fails one of the two checks.
  const Shape s{37, 97, 61, 1};
  for (const Kernels &kern : builds())
    for (bool rows_times : {true, false}) {
      CAPTURE(kern.name);
      CAPTURE(rows_times);
      std::mt19937_64 rng(13);
      const double once = check_product(kern, rows_times, false, s, rng);
      rng.seed(13);
      const double split = check_product(kern, rows_times, true, s, rng);
      CHECK(once > 0x1p-14);
      CHECK(split < 0x1p-15);
      CHECK(split * 64.0 < once);
    }
}

TEST_CASE("contrastive/bf16-kernels/nan-in-g-reaches-only-its-own-outputs") {
  // G's NaN (PROPAGATE policy) must stay NaN through the hi/lo split and
  // reach exactly the output rows it feeds: row 3 of dq, row 4 of dk.
  const Shape s{7, 9, 5, 0};
  std::mt19937_64 rng(14);
  for (const Kernels &kern : builds())
    for (bool rows_times : {true, false})
      for (bool split : {true, false}) {
        CAPTURE(kern.name);
        CAPTURE(rows_times);
        CAPTURE(split);
        const Bf16Matrix x(rows_times ? s.c : s.r, s.d, s.pad, rng);
        std::vector<float> g = gaussian(std::size_t(s.r * s.c), rng, 1.0f);
        g[std::size_t(3 * s.c + 4)] = std::nanf("");
        const std::int64_t m = rows_times ? s.r : s.c, poisoned = rows_times ? 3 : 4;
        std::vector<float> out(std::size_t(m * s.d), 0.0f);
        auto scratch = scratch_for(s.r, s.c, s.d);
        if (rows_times)
          kern.rows_times(g.data(), x.rows_view(), s.r, s.c, s.d, out.data(), s.d, split, scratch.data());
        else
          kern.cols_times(g.data(), x.rows_view(), s.r, s.c, s.d, out.data(), s.d, split, scratch.data());
        for (std::int64_t i = 0; i < m; ++i)
          for (std::int64_t t = 0; t < s.d; ++t)
            CHECK(std::isnan(out[std::size_t(i * s.d + t)]) == (i == poisoned));
      }
}

// G's parts as the scalar code defines them: hi = bf16(G), lo = bf16(G - hi),
// lo = 0 where G - hi is NaN (G NaN or infinite).
std::uint16_t hi_of(float g) { return f32_to_bf16(g); }
std::uint16_t lo_of(float g) {
  const float rest = g - bf16_to_f32(f32_to_bf16(g));
  return rest == rest ? f32_to_bf16(rest) : std::uint16_t(0);
}

// Values whose rounding is delicate: ties (even and odd), the largest finite
// (rounds to Inf), subnormals, signed zeros, Inf, NaN, then random bit patterns.
std::vector<float> awkward_floats(std::size_t n, std::mt19937_64 &rng) {
  const std::uint32_t special[] = {0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu, 0x00008000u,
                                   0x00018000u, 0x3f808000u, 0x3f818000u, 0x3f80c000u, 0x7f7fffffu,
                                   0xff7fffffu, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00001u,
                                   0x7f800001u, 0x3f7fffffu, 0x477fe000u};
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t bits = i < std::size(special) ? special[i] : std::uint32_t(rng());
    std::memcpy(&v[i], &bits, sizeof bits);
  }
  return v;
}

TEST_CASE("contrastive/bf16-kernels/g-conversions-equal-the-scalar-rounding") {
  // The vector conversions round in integer lanes: bit for bit flatmem::f32_to_bf16
  // for every input, subnormals and NaN included, in both layouts and both builds
  // (tails of 1..31 columns, odd rows).
  std::mt19937_64 rng(16);
  for (const Kernels &kern : builds())
    for (const Shape &s : {Shape{1, 1, 0, 0}, Shape{3, 17, 0, 0}, Shape{4, 33, 0, 0}, Shape{5, 64, 0, 0}})
      for (int part : {0, 1}) {
        CAPTURE(kern.name);
        CAPTURE(s.r);
        CAPTURE(s.c);
        CAPTURE(part);
        const std::vector<float> g = awkward_floats(std::size_t(s.r * s.c), rng);
        auto expect = [&](std::int64_t i, std::int64_t j) -> std::uint16_t {
          if (i >= s.r || j >= s.c) return 0;  // padding
          const float v = g[std::size_t(i * s.c + j)];
          return part == 0 ? hi_of(v) : lo_of(v);
        };
        const std::int64_t ld = (s.c + 1) / 2 * 2;
        std::vector<std::uint16_t> rows(std::size_t(s.r * ld), 0xdeadu);
        kern.g_rows(g.data(), s.r, s.c, part, rows.data(), ld);
        for (std::int64_t i = 0; i < s.r; ++i)
          for (std::int64_t j = 0; j < ld; ++j) REQUIRE(rows[std::size_t(i * ld + j)] == expect(i, j));
        const std::int64_t pairs = (s.r + 1) / 2, groups = (s.c + 15) / 16;
        std::vector<std::uint32_t> cols(std::size_t(groups * 16 * pairs), 0xdeadbeefu);
        kern.g_columns(g.data(), s.r, s.c, part, cols.data());
        for (std::int64_t c = 0; c < groups * 16; ++c)
          for (std::int64_t p = 0; p < pairs; ++p) {
            const std::uint32_t w = cols[std::size_t(((c / 16) * pairs + p) * 16 + c % 16)];
            REQUIRE((w & 0xffffu) == expect(2 * p, c));
            REQUIRE((w >> 16) == expect(2 * p + 1, c));
          }
      }
}

TEST_CASE("contrastive/bf16-kernels/outputs-outside-the-tile-are-untouched") {
  // dq rows live inside a wider accumulator (ld > d): the masked stores must
  // not write the columns between rows or the rows after the tile.
  const Shape s{11, 13, 70, 0};
  const std::int64_t ld = s.d + 5, rows_after = 2;
  std::mt19937_64 rng(15);
  for (const Kernels &kern : builds()) {
    CAPTURE(kern.name);
    const Bf16Matrix k(s.c, s.d, s.pad, rng);
    const std::vector<float> g = gaussian(std::size_t(s.r * s.c), rng, 1.0f);
    std::vector<float> out(std::size_t((s.r + rows_after) * ld), 7.0f);
    auto scratch = scratch_for(s.r, s.c, s.d);
    kern.rows_times(g.data(), k.rows_view(), s.r, s.c, s.d, out.data(), ld, true, scratch.data());
    for (std::int64_t i = 0; i < s.r + rows_after; ++i)
      for (std::int64_t t = 0; t < ld; ++t)
        if (i >= s.r || t >= s.d) CHECK(out[std::size_t(i * ld + t)] == 7.0f);
  }
}

}  // namespace
