// The contrastive tile products of bf16 inputs on AVX512_BF16 (vdpbf16ps:
// exact bf16 x bf16 products, fp32 accumulation), used at the CPU ISA level
// avx512bf16 instead of widening the tiles to fp32 for sgemm (tile_gemm.cpp).
//
// One register-blocked kernel serves all three products: C (M x N) = / +=
// A (M x K) B (K x N), K consumed in pairs (vdpbf16ps multiplies adjacent
// bf16 pairs) and in blocks of kKBlockPairs pairs. A is read in place (q's
// rows) or from scratch (the tile's G rounded to bf16: its rows for dq, its
// column pairs in groups of kTransposedGroup columns for dk), B is packed
// panel by panel (kPanelWidth columns x one K block, zero padded):
//   logits  raw = Q K^T   A = q rows, B = k rows transposed into pairs along d
//   dq     += G K         A = bf16(G) rows, B = k row pairs
//   dk     += G^T Q       A = bf16(G) column pairs, B = q row pairs
// G is fp32; it enters a product either rounded once to bf16 (relative error
// 2^-8 per entry) or, split = true, as hi + lo = bf16(G) + bf16(G - hi)
// (residual <= 2^-16 |G|: below fp32 accumulation's gamma_n for n >= 256),
// which doubles the cost of that product.
//
// The kernels live in bf16_gemm_kernels.inc, compiled here for the hardware
// and, in tests/contrastive/test_bf16_gemm.cpp, over SIMDe's portable
// emulation of the same intrinsics, so that machines without AVX512_BF16
// test the very code the hardware runs.
#pragma once

#include <cstdint>

namespace flatmem::contrastive::cpu::bf16 {

constexpr std::int64_t kPanelRows = 6;    // rows of C per kernel call (register block)
constexpr std::int64_t kPanelWidth = 64;  // columns of C per kernel call: 4 x 16 fp32 lanes
constexpr std::int64_t kKBlockPairs = 128;  // pairs of K per packed panel (32 KB: stays in L1)
constexpr std::int64_t kTransposedGroup = 16;  // columns of G per group in dk's packed G^T

// bf16 rows: element (r, t) at data[r * ld + t].
struct Rows {
  const std::uint16_t *data = nullptr;
  std::int64_t ld = 0;
};

// 32-bit words of the packed B panel: one K block of the longest reduction
// (d for the logits, tile_cols for dq, tile_rows for dk).
inline std::int64_t panel_words(std::int64_t tile_rows, std::int64_t tile_cols, std::int64_t d) {
  const std::int64_t longest = d > tile_rows ? (d > tile_cols ? d : tile_cols) : (tile_rows > tile_cols ? tile_rows : tile_cols);
  const std::int64_t pairs = (longest + 1) / 2;
  return (pairs < kKBlockPairs ? pairs : kKBlockPairs) * kPanelWidth;
}

// 32-bit words of one bf16 part of G: dq's rows (tile_rows x ceil(C / 2)
// pairs) or dk's G^T (ceil(C / 16) groups x ceil(R / 2) pairs x 16 words).
inline std::int64_t g_part_words(std::int64_t tile_rows, std::int64_t tile_cols) {
  const std::int64_t rows_layout = tile_rows * ((tile_cols + 1) / 2);
  const std::int64_t columns_layout =
      (tile_cols + kTransposedGroup - 1) / kTransposedGroup * kTransposedGroup * ((tile_rows + 1) / 2);
  return rows_layout > columns_layout ? rows_layout : columns_layout;
}

// 32-bit words of per-thread scratch the three products need for tiles of at
// most tile_rows x tile_cols and feature dimension d: one packed B panel,
// and two bf16 copies (hi, lo) of the tile's G.
inline std::int64_t scratch_words(std::int64_t tile_rows, std::int64_t tile_cols, std::int64_t d) {
  return panel_words(tile_rows, tile_cols, d) + 2 * g_part_words(tile_rows, tile_cols);
}

// True when the bf16 kernels are compiled in and the active CPU ISA is
// avx512bf16 (cpu_isa::for_kernels()). Callers decide once per call.
bool active();

// raw (R x C, ld C) = Q_I (R x d) K_J^T.
void tile_logits(Rows q, Rows k, std::int64_t rows, std::int64_t cols, std::int64_t d, float *raw,
                 std::uint32_t *scratch);

// out (R x d, ld out_ld) += G (R x C, ld C) K_J (C x d).
void accumulate_rows_times(const float *g, Rows k, std::int64_t rows, std::int64_t cols,
                           std::int64_t d, float *out, std::int64_t out_ld, bool split,
                           std::uint32_t *scratch);

// out (C x d, ld out_ld) += G^T (C x R) Q_I (R x d).
void accumulate_cols_times(const float *g, Rows q, std::int64_t rows, std::int64_t cols,
                           std::int64_t d, float *out, std::int64_t out_ld, bool split,
                           std::uint32_t *scratch);

}  // namespace flatmem::contrastive::cpu::bf16
