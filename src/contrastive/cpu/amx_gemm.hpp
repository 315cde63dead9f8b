// The contrastive tile products of bf16 inputs on AMX tiles (TDPBF16PS: exact
// bf16 x bf16 products, fp32 accumulation), used at the CPU ISA level amx
// (Sapphire / Emerald Rapids and later), with the numerics of the avx512bf16
// kernels (bf16_gemm.hpp): the same products, the same fp32 sums per entry
// (in another order), G entering dq's and dk's products as hi + lo bf16 parts
// (split) or rounded once.
//
// Both operands are packed into scratch first, zero padded to whole tiles:
// A as [16-row block][16-pair chunk][16 rows][16 pairs], B as [16-column
// block][16-pair chunk][16 pairs][16 columns] (each 32-bit word a bf16 pair
// along the reduction), so every tile load reads 1 KiB of contiguous scratch
// and no load reads past an operand. The kernel (amx_gemm_kernels.inc) keeps a
// 32 x 32 block of C in four tiles over the whole reduction: per 32-element
// step two A tiles, two B tiles, four TDPBF16PS (eight with the split).
//   logits  raw = Q K^T   A = q rows,                  B = k rows as pairs along d
//   dq     += G K         A = bf16(G) rows (hi, lo),   B = k row pairs
//   dk     += G^T Q       A = bf16(G) columns (hi, lo), B = q row pairs
// Written once over amx_tile_ops.hpp's tile operations: amx_gemm.cpp compiles
// it for the hardware, tests/contrastive/test_amx_gemm.cpp over the exact
// emulation too, on every machine.
#pragma once

#include <cstdint>

#include "contrastive/cpu/bf16_gemm.hpp"

namespace flatmem::contrastive::cpu::amx {

using Rows = bf16::Rows;

constexpr std::int64_t kBlock = 16;  // rows, columns and pairs of a tile

inline std::int64_t whole_tiles(std::int64_t n) { return (n + kBlock - 1) / kBlock * kBlock; }

// 32-bit words of a packed operand of `lines` rows (A) or columns (B) over
// `pairs` pairs of the reduction.
inline std::int64_t packed_words(std::int64_t lines, std::int64_t pairs) {
  return whole_tiles(lines) * whole_tiles(pairs);
}

// 32-bit words of per-thread scratch for the three products of tiles of at
// most tile_rows x tile_cols and feature dimension d (two A parts and a B).
inline std::int64_t scratch_words(std::int64_t tile_rows, std::int64_t tile_cols, std::int64_t d) {
  const std::int64_t pd = (d + 1) / 2, pc = (tile_cols + 1) / 2, pr = (tile_rows + 1) / 2;
  const std::int64_t logits = packed_words(tile_rows, pd) + packed_words(tile_cols, pd);
  const std::int64_t dq = 2 * packed_words(tile_rows, pc) + packed_words(d, pc);
  const std::int64_t dk = 2 * packed_words(tile_cols, pr) + packed_words(d, pr);
  const std::int64_t most = logits > dq ? logits : dq;
  return most > dk ? most : dk;
}

// True when the AMX kernels are compiled in and the active CPU ISA is amx
// (cpu_isa::for_kernels(): CPUID, XCR0 and the kernel's permission for tile
// data). Callers decide once per call.
bool active();

// raw (R x C, ld C) = Q_I (R x d) K_J^T.
void tile_logits(Rows q, Rows k, std::int64_t rows, std::int64_t cols, std::int64_t d, float *raw,
                 std::uint32_t *scratch);

// out (R x d, ld out_ld) += G (R x C, ld C) K_J (C x d).
void accumulate_rows_times(const float *g, Rows k, std::int64_t rows, std::int64_t cols, std::int64_t d,
                           float *out, std::int64_t out_ld, bool split, std::uint32_t *scratch);

// out (C x d, ld out_ld) += G^T (C x R) Q_I (R x d).
void accumulate_cols_times(const float *g, Rows q, std::int64_t rows, std::int64_t cols, std::int64_t d,
                           float *out, std::int64_t out_ld, bool split, std::uint32_t *scratch);

// What the kernels are, for flatmem_cpu_isa_engine.
constexpr const char *kKernelName = "AMX tdpbf16ps 32x32 (bf16 products, fp32 sums)";

}  // namespace flatmem::contrastive::cpu::amx
