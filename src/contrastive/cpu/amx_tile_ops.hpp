// The AMX tile operations the bf16 tile kernels (amx_gemm_kernels.inc) are
// written against, in two implementations with one interface:
//   EmulatedTiles  portable C++: eight 16 x 64-byte tile registers in memory
//                  and TDPBF16PS as the hardware computes it (below), so the
//                  kernels run and are tested on every machine;
//   HardwareTiles  the intrinsics (amx_gemm.cpp, under a target pragma: GCC
//                  compiles them only there).
// tests/contrastive/amx_hardware_check.cpp compares the two bit for bit on
// random tiles (subnormals, infinities, NaN included) where the processor has
// AMX.
//
// The kernels use one configuration: palette 1, all eight tiles 16 rows x 64
// bytes (C tiles 0-3: 16 x 16 fp32; A tiles 4-5: 16 rows x 16 bf16 pairs;
// B tiles 6-7: 16 pair-rows x 16 columns, each a (k even, k odd) bf16 pair).
//
// TDPBF16PS c, a, b, as the hardware computes it. The SDM's pseudocode adds
// the 32 products of an entry to c one at a time; an AMX Xeon (Sapphire /
// Emerald Rapids generation, 2026-12-05) does not. Measured there: for each
// entry two fp32 sums, one over the even elements of the pairs and one over
// the odd ones, then their sum, then c:
//   for m < 16, for n < 16:
//     even = 0, odd = 0
//     for k < 16: even += fp32(a[m].bf16[2k])     * fp32(b[k].bf16[2n])
//                 odd  += fp32(a[m].bf16[2k + 1]) * fp32(b[k].bf16[2n + 1])
//     c[m][n] = c[m][n] + (even + odd)
// each product exact (8 x 8 significant bits, beyond fp32's range where it
// must be: an addition overflows, a product alone does not), each addition
// rounded to nearest even; subnormal inputs (the bf16 operands and c) read as zero and
// subnormal results written as zero, whatever MXCSR says. It matched all of
// 153,600 random entries there where the SDM's order matched 35-40 % (products
// spread over 2^+-4..12), and distinguishes e.g. 1 + (2^-24 + 2^-24) = 1 +
// 2^-23 (the SDM's order: 1), (2^60 + 1) - 2^60 = 1 along the even and odd
// elements of one pair and the next (the SDM: 0), and 2^60 + (1 - 2^60) = 0
// when the 2^60 is c (test_amx_gemm checks these on the emulation).
#pragma once

#include <cstdint>
#include <cstring>

namespace flatmem::contrastive::cpu::amx {

constexpr int kTileRows = 16, kTileBytes = 64;

// The 64-byte operand of LDTILECFG.
struct alignas(64) TileConfig {
  std::uint8_t palette = 1, start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t colsb[16] = {};
  std::uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64, "LDTILECFG reads 64 bytes");

constexpr TileConfig full_tiles() {
  TileConfig c;
  for (int t = 0; t < 8; ++t) c.colsb[t] = kTileBytes, c.rows[t] = kTileRows;
  return c;
}

class EmulatedTiles {
 public:
  static void configure() {}
  static void release() {}
  template <int t>
  static void zero() {
    std::memset(regs()[t], 0, sizeof regs()[t]);
  }
  template <int t>
  static void load(const void *base, std::int64_t stride) {
    for (int r = 0; r < kTileRows; ++r)
      std::memcpy(regs()[t][r], static_cast<const char *>(base) + r * stride, kTileBytes);
  }
  template <int t>
  static void store(void *base, std::int64_t stride) {
    for (int r = 0; r < kTileRows; ++r)
      std::memcpy(static_cast<char *>(base) + r * stride, regs()[t][r], kTileBytes);
  }
  template <int c, int a, int b>
  static void dot() {
    dot_bf16(regs()[c], regs()[a], regs()[b]);
  }

  // One TDPBF16PS on tiles in memory (exposed for the tests).
  static void dot_bf16(std::uint8_t (&c)[kTileRows][kTileBytes], const std::uint8_t (&a)[kTileRows][kTileBytes],
                       const std::uint8_t (&b)[kTileRows][kTileBytes]) {
    for (int m = 0; m < kTileRows; ++m)
      for (int n = 0; n < 16; ++n) {
        float even = 0.0f, odd = 0.0f;
        for (int k = 0; k < 16; ++k) {
          even = add_product(even, bf16_float(a[m], 2 * k), bf16_float(b[k], 2 * n));
          odd = add_product(odd, bf16_float(a[m], 2 * k + 1), bf16_float(b[k], 2 * n + 1));
        }
        const float acc = flush(flush(word_float(c[m], n)) + flush(even + odd));
        std::memcpy(&c[m][4 * n], &acc, 4);
      }
  }

 private:
  using Regs = std::uint8_t[8][kTileRows][kTileBytes];
  static Regs &regs() {
    alignas(64) static thread_local Regs r;
    return r;
  }
  static float bits_float(std::uint32_t bits) {
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }
  // acc + x y rounded once to fp32, then flushed. The product is exact and
  // not limited to fp32's range (2^127 * 2 does not overflow on its own: the
  // hardware's +inf + (-2^128) is +inf); in double the sum of an fp32 and a
  // 16-bit product rounds to fp32 as a single rounding would (53 >= 2 * 24 + 2).
  static float add_product(float acc, float x, float y) {
    return flush(float(double(acc) + double(x) * double(y)));
  }
  // Subnormal -> signed zero.
  static float flush(float x) {
    std::uint32_t bits;
    std::memcpy(&bits, &x, 4);
    return (bits & 0x7f800000u) == 0 ? bits_float(bits & 0x80000000u) : x;
  }
  static float word_float(const std::uint8_t *row, int n) {
    std::uint32_t bits;
    std::memcpy(&bits, row + 4 * n, 4);
    return bits_float(bits);
  }
  static float bf16_float(const std::uint8_t *row, int e) {
    std::uint16_t h;
    std::memcpy(&h, row + 2 * e, 2);
    return flush(bits_float(std::uint32_t(h) << 16));
  }
};

}  // namespace flatmem::contrastive::cpu::amx
