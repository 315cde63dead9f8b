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
#include <cstring>

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

TEST_CASE("contrastive/amx-kernels/emulated/tdpbf16ps-flushes-subnormals-and-rounds-each-addition") {
  namespace amx = flatmem::contrastive::cpu::amx;
  alignas(64) std::uint8_t a[16][64] = {}, b[16][64] = {}, c[16][64] = {};
  const auto put16 = [](std::uint8_t (&t)[16][64], int row, int e, std::uint16_t v) { std::memcpy(&t[row][2 * e], &v, 2); };
  const auto get = [&](int row, int n) {
    float f;
    std::memcpy(&f, &c[row][4 * n], 4);
    return f;
  };
  // row 0: 1 * 1 + 2^-24 * 1 (the second addition rounds to even: stays 1)
  put16(a, 0, 0, 0x3f80), put16(b, 0, 0, 0x3f80);
  put16(a, 0, 1, 0x3380), put16(b, 0, 1, 0x3f80);
  // row 1: a subnormal bf16 (0x0001) times 2^100 reads as 0
  put16(a, 1, 0, 0x0001), put16(b, 0, 0, 0x3f80);
  put16(a, 1, 2, 0x0001), put16(b, 1, 0, 0x7180);
  amx::EmulatedTiles::dot_bf16(c, a, b);
  CHECK(get(0, 0) == 1.0f);
  CHECK(get(1, 0) == 0.0f);
}
