// The AMX tile products for the hardware: amx_gemm_kernels.inc over
// HardwareTiles, compiled for x86-64-v4 + AMX-TILE + AMX-BF16 under a target
// pragma (only these functions get the target), called only when
// cpu_isa::for_kernels() is amx.
#include "contrastive/cpu/amx_gemm.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "core/cpu_isa.hpp"
#include "core/dtype.hpp"
#include "core/isa_variants.hpp"

#if FLATMEM_ISA_VARIANTS
#pragma GCC push_options
#pragma GCC target("arch=x86-64-v4,amx-tile,amx-bf16")
#include "contrastive/cpu/amx_hardware_tiles.hpp"
#define FLATMEM_AMX_NS flatmem::contrastive::cpu::amx::native
#define FLATMEM_AMX_TILES ::flatmem::contrastive::cpu::amx::HardwareTiles
#include "contrastive/cpu/amx_gemm_kernels.inc"
#undef FLATMEM_AMX_TILES
#undef FLATMEM_AMX_NS
#pragma GCC pop_options
#endif

namespace flatmem::contrastive::cpu::amx {

#if FLATMEM_ISA_VARIANTS
bool active() { return cpu_isa::for_kernels() >= cpu_isa::Isa::amx; }

void tile_logits(Rows q, Rows k, std::int64_t rows, std::int64_t cols, std::int64_t d, float *raw,
                 std::uint32_t *scratch) {
  native::tile_logits(q, k, rows, cols, d, raw, scratch);
}

void accumulate_rows_times(const float *g, Rows k, std::int64_t rows, std::int64_t cols, std::int64_t d,
                           float *out, std::int64_t out_ld, bool split, std::uint32_t *scratch) {
  native::accumulate_rows_times(g, k, rows, cols, d, out, out_ld, split, scratch);
}

void accumulate_cols_times(const float *g, Rows q, std::int64_t rows, std::int64_t cols, std::int64_t d,
                           float *out, std::int64_t out_ld, bool split, std::uint32_t *scratch) {
  native::accumulate_cols_times(g, q, rows, cols, d, out, out_ld, split, scratch);
}
#else
// Without the ISA variants (clang, other processors) cpu_isa never reports
// amx, so active() is false and nothing below is reached.
bool active() { return false; }
void tile_logits(Rows, Rows, std::int64_t, std::int64_t, std::int64_t, float *, std::uint32_t *) {}
void accumulate_rows_times(const float *, Rows, std::int64_t, std::int64_t, std::int64_t, float *, std::int64_t,
                           bool, std::uint32_t *) {}
void accumulate_cols_times(const float *, Rows, std::int64_t, std::int64_t, std::int64_t, float *, std::int64_t,
                           bool, std::uint32_t *) {}
#endif

}  // namespace flatmem::contrastive::cpu::amx
