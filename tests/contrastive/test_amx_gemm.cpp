// The AMX tile-product kernels (src/contrastive/cpu/amx_gemm_kernels.inc) on
// every machine: compiled here over EmulatedTiles, the exact emulation of the
// tile operations (amx_tile_ops.hpp), and checked against float64 products of
// the same bf16 values within amx_test_support.hpp's bounds, at shapes on and
// off every tile edge, G split and rounded once. Then the checker itself: the
// same kernels over a tile emulation that drops the odd element of each pair
// (the mistake a wrong VNNI layout makes) must fail it. Where the processor
// has AMX, amx_hardware_check compares the hardware with this emulation bit
// for bit (ctest -L isa; exit 77 elsewhere).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "contrastive/cpu/amx_gemm.hpp"
#include "contrastive/cpu/amx_tile_ops.hpp"
#include "contrastive/amx_test_support.hpp"
#include "core/dtype.hpp"

#define FLATMEM_AMX_NS emulated
#define FLATMEM_AMX_TILES ::flatmem::contrastive::cpu::amx::EmulatedTiles
#include "contrastive/cpu/amx_gemm_kernels.inc"
#undef FLATMEM_AMX_TILES
#undef FLATMEM_AMX_NS

namespace {

// EmulatedTiles with a defect: TDPBF16PS ignores the odd element of every pair.
struct DroppedPairTiles : flatmem::contrastive::cpu::amx::EmulatedTiles {
  template <int c, int a, int b>
  static void dot() {
    using E = flatmem::contrastive::cpu::amx::EmulatedTiles;
    alignas(64) static thread_local std::uint8_t ta[16][64], tb[16][64], tc[16][64];
    E::store<a>(ta, 64);
    E::store<b>(tb, 64);
    E::store<c>(tc, 64);
    for (auto *t : {&ta, &tb})
      for (auto &row : *t)
        for (int w = 0; w < 16; ++w) std::memset(row + 4 * w + 2, 0, 2);  // odd element := 0
    E::dot_bf16(tc, ta, tb);
    E::load<c>(tc, 64);
  }
};

}  // namespace

#define FLATMEM_AMX_NS dropped_pair
#define FLATMEM_AMX_TILES DroppedPairTiles
#include "contrastive/cpu/amx_gemm_kernels.inc"
#undef FLATMEM_AMX_TILES
#undef FLATMEM_AMX_NS

using namespace amx_test;

namespace {
const Kernels emulated_kernels{"emulated", emulated::tile_logits, emulated::accumulate_rows_times,
                               emulated::accumulate_cols_times};
const Kernels broken_kernels{"dropped pair", dropped_pair::tile_logits, dropped_pair::accumulate_rows_times,
                             dropped_pair::accumulate_cols_times};
}  // namespace

TEST_CASE("contrastive/amx-kernels/emulated/logits-within-the-fp32-accumulation-bound") {
  for (const Shape &s : shapes) {
    INFO("r=", s.r, " c=", s.c, " d=", s.d);
    const Outcome o = check_logits(emulated_kernels, s, 11 + std::uint64_t(s.d));
    CHECK(o.within());
  }
}

TEST_CASE("contrastive/amx-kernels/emulated/gradient-products-within-their-bounds") {
  for (const Shape &s : shapes)
    for (bool columns : {false, true})
      for (bool split : {true, false}) {
        INFO("r=", s.r, " c=", s.c, " d=", s.d, " columns=", columns, " split=", split);
        CHECK(check_gradient(emulated_kernels, s, columns, split, 5 + std::uint64_t(s.c)).within());
      }
}

TEST_CASE("contrastive/amx-kernels/emulated/the-split-is-what-makes-gradients-fp32-accurate") {
  // Against the split's bound (rho = 2^-16), G rounded once must fail: the
  // checker can tell the two apart, so a kernel that ignored `split` would fail.
  const Shape s{64, 300, 40, 0};
  std::vector<float> split_out, once_out;
  CHECK(check_gradient(emulated_kernels, s, false, true, 3, &split_out).within());
  CHECK(check_gradient(emulated_kernels, s, false, false, 3, &once_out).within());
  double differ = 0.0;
  for (std::size_t e = 0; e < split_out.size(); ++e) differ = std::max(differ, double(std::fabs(split_out[e] - once_out[e])));
  CHECK(differ > 1e-4);  // rounding G once moves results by ~2^-9 |G| |x| sqrt(n)
}

TEST_CASE("contrastive/amx-kernels/emulated/a-kernel-that-drops-half-of-each-pair-fails") {
  for (const Shape &s : {Shape{17, 33, 31, 1}, Shape{37, 97, 97, 3}}) {
    CAPTURE(s.d);
    CHECK_FALSE(check_logits(broken_kernels, s, 7).within());
    CHECK_FALSE(check_gradient(broken_kernels, s, false, true, 7).within());
    CHECK_FALSE(check_gradient(broken_kernels, s, true, true, 7).within());
  }
}

// TDPBF16PS as an AMX Xeon computes it (amx_tile_ops.hpp): per entry an even
// and an odd fp32 sum over the pairs, then their sum, then c; each addition
// rounded to nearest even; subnormal inputs and results flushed. Each case
// tells this order from the SDM's (every product added to c in turn); the
// hardware gave these values (amx_hardware_check compares the emulation with
// it on random tiles where the processor has AMX).
TEST_CASE("contrastive/amx-kernels/emulated/tdpbf16ps-sums-even-and-odd-elements-apart-then-adds-c") {
  namespace amx = flatmem::contrastive::cpu::amx;
  const float e = 0x1p-24f, inf = std::numeric_limits<float>::infinity();
  struct Case {
    const char *what;
    float c;
    std::vector<float> a, b;  // element 2k, 2k + 1 of the pairs k = 0, 1, ...
    float want;
  };
  const Case cases[] = {
      {"1 + (2^-24 + 2^-24): the pair's sum first (SDM order: 1)", 1.0f, {e, e}, {1, 1}, 1.0f + 0x1p-23f},
      {"1 + 2^-24 (k = 0) + 2^-24 (k = 1): the even sum first (SDM: 1)", 1.0f, {e, 0, e, 0}, {1, 0, 1, 0},
       1.0f + 0x1p-23f},
      {"0 + (2^60 + 1) - 2^60 along even / odd: the even sum cancels (SDM: 0)", 0.0f, {0x1p60f, 1, 0x1p60f, 0},
       {1, 1, -1, 0}, 1.0f},
      {"c = 2^60 + (1 - 2^60): the products' sum rounded before c (exact: 1)", 0x1p60f, {1, 0x1p60f}, {1, -1}, 0.0f},
      {"2^24 + (1 + 1): (SDM: 2^24)", 0x1p24f, {1, 1}, {1, 1}, 0x1p24f + 2.0f},
      {"0 + 1 + 2^-24: one tie, to even", 0.0f, {1, e}, {1, 1}, 1.0f},
      {"2^127 * 2 - 2^127 * 2 along the even sum: inf, then inf + (-2^128) = inf", 0.0f,
       {0x1p127f, 0, 0x1p127f, 0}, {2, 0, -2, 0}, inf},
      {"a subnormal bf16 (2^-130) times 2^100 reads as 0", 0.0f, {0x1p-130f}, {0x1p100f}, 0.0f},
      {"a product of 2^-140 is flushed", 0.0f, {0x1p-100f}, {0x1p-40f}, 0.0f},
  };
  for (const Case &k : cases) {
    CAPTURE(k.what);
    alignas(64) std::uint8_t a[16][64] = {}, b[16][64] = {}, c[16][64] = {};
    for (std::size_t i = 0; i < k.a.size(); ++i) {
      const std::uint16_t av = f32_to_bf16(k.a[i]), bv = f32_to_bf16(k.b[i]);
      REQUIRE(bf16_to_f32(av) == k.a[i]);  // exact bf16 values only
      std::memcpy(&a[0][2 * i], &av, 2);
      std::memcpy(&b[i / 2][2 * (i % 2)], &bv, 2);  // column 0: elements (2k, 2k + 1) of pair row k
    }
    std::memcpy(&c[0][0], &k.c, 4);
    amx::EmulatedTiles::dot_bf16(c, a, b);
    float got;
    std::memcpy(&got, &c[0][0], 4);
    CHECK(got == k.want);
  }
}

// Every packer against its word-by-word definition (amx_gemm.hpp's layouts),
// bit for bit, on shapes on and off the tile edges: lines and columns of 1,
// 15-17 and 33, reductions with an odd last pair, a partial last chunk and
// several chunks; G with a NaN, an infinity, a subnormal and values that
// round to even. The packers build whole tiles with vector shuffles (the
// transposes of the logits' B and dk's A included); any misplaced word moves
// a product.
TEST_CASE("contrastive/amx-kernels/packers-equal-their-word-by-word-definitions") {
  namespace amx = flatmem::contrastive::cpu::amx;
  constexpr std::int64_t kB = amx::kBlock;
  // Reference layouts: A [line block][pair chunk][16 lines][16 pairs], B [column block][pair chunk][16 pairs][16 columns].
  const auto ref_lines = [&](std::int64_t lines, std::int64_t pairs, auto word) {
    std::vector<std::uint32_t> out(std::size_t(amx::packed_words(lines, pairs)));
    const std::int64_t chunks = (pairs + kB - 1) / kB;
    for (std::int64_t l = 0; l < amx::whole_tiles(lines); ++l)
      for (std::int64_t p = 0; p < chunks * kB; ++p)
        out[std::size_t(((l / kB) * chunks + p / kB) * kB * kB + (l % kB) * kB + p % kB)] =
            l < lines && p < pairs ? word(l, p) : 0u;
    return out;
  };
  const auto ref_columns = [&](std::int64_t columns, std::int64_t pairs, auto word) {
    std::vector<std::uint32_t> out(std::size_t(amx::packed_words(columns, pairs)));
    const std::int64_t chunks = (pairs + kB - 1) / kB;
    for (std::int64_t j = 0; j < amx::whole_tiles(columns); ++j)
      for (std::int64_t p = 0; p < chunks * kB; ++p)
        out[std::size_t(((j / kB) * chunks + p / kB) * kB * kB + (p % kB) * kB + j % kB)] =
            j < columns && p < pairs ? word(p, j) : 0u;
    return out;
  };
  const auto g_half = [](float g, int part) -> std::uint32_t {
    const std::uint16_t hi = f32_to_bf16(g);
    return part == 0 ? hi : f32_to_bf16(g - bf16_to_f32(hi));
  };
  for (std::int64_t lines : {1, 15, 16, 17, 33})
    for (std::int64_t k : {1, 2, 31, 32, 33, 64, 97}) {
      CAPTURE(lines);
      CAPTURE(k);
      const std::int64_t ld = k + 3, pairs = (k + 1) / 2;
      std::vector<std::uint16_t> m(std::size_t(std::max(lines, k) * ld + 16));
      for (std::size_t i = 0; i < m.size(); ++i) m[i] = std::uint16_t(0x3f80u + 37u * i);
      const amx::Rows rows{m.data(), ld};
      // rows as lines (A of the logits) and as columns (B of the logits): pairs along a row of k
      const auto row_word = [&](std::int64_t line, std::int64_t p) {
        const std::uint16_t *row = m.data() + line * ld;
        return 2 * p + 1 < k ? std::uint32_t(row[2 * p]) | std::uint32_t(row[2 * p + 1]) << 16 : std::uint32_t(row[2 * p]);
      };
      std::vector<std::uint32_t> got(std::size_t(amx::packed_words(lines, pairs)), 0xdeadbeefu);
      emulated::pack_rows_as_lines(got.data(), rows, lines, k);
      CHECK(got == ref_lines(lines, pairs, row_word));
      std::fill(got.begin(), got.end(), 0xdeadbeefu);
      emulated::pack_rows_as_columns(got.data(), rows, lines, k);
      CHECK(got == ref_columns(lines, pairs, [&](std::int64_t p, std::int64_t j) { return row_word(j, p); }));
      // a matrix of k rows paired along its rows, `lines` columns (B of G K and G^T Q)
      std::vector<std::uint32_t> pairs_got(std::size_t(amx::packed_words(lines, pairs)), 0xdeadbeefu);
      emulated::pack_row_pairs(pairs_got.data(), amx::Rows{m.data(), lines + 2}, k, lines);
      CHECK(pairs_got == ref_columns(lines, pairs, [&](std::int64_t p, std::int64_t j) {
              const std::uint16_t *lo = m.data() + 2 * p * (lines + 2) + j;
              return 2 * p + 1 < k ? std::uint32_t(lo[0]) | std::uint32_t(lo[lines + 2]) << 16 : std::uint32_t(lo[0]);
            }));
      // G (fp32, `lines` x k) by rows (dq's A: pairs along its k columns) and by columns (dk's A: pairs
      // along its `lines` rows), each part
      std::vector<float> g(std::size_t(lines * k));
      for (std::size_t i = 0; i < g.size(); ++i) g[i] = std::ldexp(float(int(i * 2654435761u % 2001u) - 1000), -7);
      g[0] = std::numeric_limits<float>::quiet_NaN();
      if (g.size() > 1) g[1] = -std::numeric_limits<float>::infinity();
      if (g.size() > 2) g[2] = 1e-40f;                   // subnormal
      if (g.size() > 3) g[3] = bf16_to_f32(0x3f81) + 0x1p-16f;  // a tie that rounds to even
      for (int part : {0, 1}) {
        CAPTURE(part);
        const std::int64_t gp = (k + 1) / 2, gc = (lines + 1) / 2;
        std::vector<std::uint32_t> a(std::size_t(amx::packed_words(lines, gp)), 0xdeadbeefu);
        emulated::pack_g_rows(a.data(), g.data(), lines, k, part);
        CHECK(a == ref_lines(lines, gp, [&](std::int64_t r, std::int64_t p) {
                const float *row = g.data() + r * k;
                const std::uint32_t lo = g_half(row[2 * p], part);
                return 2 * p + 1 < k ? lo | g_half(row[2 * p + 1], part) << 16 : lo;
              }));
        std::vector<std::uint32_t> t(std::size_t(amx::packed_words(k, gc)), 0xdeadbeefu);
        emulated::pack_g_columns(t.data(), g.data(), lines, k, part);
        CHECK(t == ref_lines(k, gc, [&](std::int64_t j, std::int64_t p) {
                const std::uint32_t lo = g_half(g[std::size_t(2 * p * k + j)], part);
                return 2 * p + 1 < lines ? lo | g_half(g[std::size_t((2 * p + 1) * k + j)], part) << 16 : lo;
              }));
      }
    }
}
