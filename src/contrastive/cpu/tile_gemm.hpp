// The three tile products of the contrastive loss: one single-threaded call
// per tile (flatmem's own threads run tiles in parallel), through flatmem's
// fp32 GEMM (core/gemm/sgemm.hpp) on fp32 rows, or, for bf16 inputs, on the bf16 rows themselves
// through flatmem's own bf16 kernels: AMX tiles at the CPU ISA level amx (amx_gemm.hpp), vdpbf16ps at
// avx512bf16 (bf16_gemm.hpp).
#pragma once

#include <cstdint>

#include "contrastive/cpu/amx_gemm.hpp"
#include "contrastive/cpu/bf16_gemm.hpp"
#include "contrastive/plan.hpp"
#include "core/cpu_isa.hpp"
#include "core/tensor.hpp"

namespace flatmem::contrastive::cpu {

// Rows [range) of a feature matrix as a product operand: either fp32 (data,
// ld: into the tensor when it is fp32, else into the widening scratch) or,
// when the bf16 kernels run, the bf16 rows in place (bf16.data set, data
// null). Both operands of one product are of the same kind.
struct TileRows {
  const float *data = nullptr;
  std::int64_t ld = 0;  // leading dimension in elements
  bf16::Rows bf16;
};

// Which engine a walk's tiles use: decided once per call (a concurrent
// flatmem_cpu_isa_set cannot mix engines within a call).
enum class Bf16Engine { widened, vdpbf16ps, amx };
struct TileProducts {
  cpu_isa::Isa isa = cpu_isa::Isa::baseline;  // the fp32 products' sgemm variant
  Bf16Engine bf16 = Bf16Engine::widened;      // bf16 inputs: amx at amx, vdpbf16ps at avx512bf16
  bool split_gradient = true;  // bf16 kernels: G as hi + lo (else rounded once)
};
TileProducts tile_products(const Plan &plan, Dtype input);

// 32-bit words of a thread's scratch for the bf16 kernels of either engine.
inline std::int64_t bf16_pack_words(std::int64_t tile_rows, std::int64_t tile_cols, std::int64_t d) {
  const std::int64_t v = bf16::scratch_words(tile_rows, tile_cols, d), a = amx::scratch_words(tile_rows, tile_cols, d);
  return v > a ? v : a;
}

// scratch: range.size() * cols floats for widening 16-bit rows.
TileRows tile_rows(const TileProducts &engine, const MatrixView &m, Range range, float *scratch);

// `pack`: the thread's bf16 kernel scratch (bf16_pack_words), unused by sgemm.
// raw (R x C, ld C) = Q_I (R x d) * K_J^T.
void tile_logits(const TileProducts &engine, const TileRows &q, const TileRows &k, std::int64_t rows, std::int64_t cols,
                 std::int64_t d, float *raw, std::uint32_t *pack);

// out (R x d, ld out_ld) += G (R x C, ld C) * K_J (C x d).
void accumulate_rows_times(const TileProducts &engine, const float *g, const TileRows &k,
                           std::int64_t rows, std::int64_t cols, std::int64_t d, float *out,
                           std::int64_t out_ld, std::uint32_t *pack);

// out (C x d, ld out_ld) += G^T (C x R) * Q_I (R x d).
void accumulate_cols_times(const TileProducts &engine, const float *g, const TileRows &q,
                           std::int64_t rows, std::int64_t cols, std::int64_t d, float *out,
                           std::int64_t out_ld, std::uint32_t *pack);

}  // namespace flatmem::contrastive::cpu
