// The AMX tile operations the bf16 tile kernels (amx_gemm_kernels.inc) are
// written against, in two implementations with one interface:
//   EmulatedTiles  portable C++: eight 16 x 64-byte tile registers in memory
//                  and TDPBF16PS as the Intel SDM defines it (below), so the
//                  kernels run and are tested on every machine;
//   HardwareTiles  the intrinsics (amx_gemm.cpp, under a target pragma: GCC
//                  compiles them only there).
// tests/contrastive/test_amx_gemm.cpp checks the two bit for bit on random
// tiles (subnormals, infinities, NaN included) where the processor has AMX.
//
// The kernels use one configuration: palette 1, all eight tiles 16 rows x 64
// bytes (C tiles 0-3: 16 x 16 fp32; A tiles 4-5: 16 rows x 16 bf16 pairs;
// B tiles 6-7: 16 pair-rows x 16 columns, each a (k even, k odd) bf16 pair).
//
// TDPBF16PS c, a, b (SDM, "TDPBF16PS"):
//   for m < 16, for k < 16, for n < 16:
//     c[m][n] += fp32(a[m].bf16[2k])     * fp32(b[k].bf16[2n])
//     c[m][n] += fp32(a[m].bf16[2k + 1]) * fp32(b[k].bf16[2n + 1])
// each product exact (8 x 8 significant bits), each addition rounded to
// nearest even; subnormal inputs (the bf16 operands and c) read as zero and
// subnormal results written as zero, whatever MXCSR says.
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
        float acc = flush(word_float(c[m], n));
        for (int k = 0; k < 16; ++k) {
          acc = flush(acc + bf16_float(a[m], 2 * k) * bf16_float(b[k], 2 * n));
          acc = flush(acc + bf16_float(a[m], 2 * k + 1) * bf16_float(b[k], 2 * n + 1));
        }
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
