// The bf16 tile products for the hardware: bf16_gemm_kernels.inc compiled for
// x86-64-v4 + AVX512_BF16 under a target pragma (as core/compile_per_isa.inc
// does for the element-wise kernels, and for the same reason: only these
// functions get the target), called only when cpu_isa::for_kernels() says
// the processor runs avx512bf16.
#include "contrastive/cpu/bf16_gemm.hpp"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>

#include "core/dtype.hpp"
#include "core/isa_variants.hpp"

#if defined(FLATMEM_BF16_EMULATED)
// Test instrumentation (CMake -DFLATMEM_BF16_EMULATED=ON, never a release):
// the same kernels over SIMDe's portable emulation, used when the process
// has FLATMEM_TEST_EMULATE_BF16=1 whatever the processor, so that machines
// without AVX512_BF16 run the whole loss (walk, scratch, ring) through them.
#include <cstdlib>

#include <simde/x86/avx512.h>
#define FLATMEM_BF16_NS flatmem::contrastive::cpu::bf16::native
#define FLATMEM_V(name) simde_mm512_##name
#define FLATMEM_VT(type) simde__##type
#include "contrastive/cpu/bf16_gemm_kernels.inc"
#undef FLATMEM_VT
#undef FLATMEM_V
#undef FLATMEM_BF16_NS
#elif FLATMEM_ISA_VARIANTS
#include <immintrin.h>

#pragma GCC push_options
#pragma GCC target("arch=x86-64-v4,avx512bf16,prefer-vector-width=512")
#define FLATMEM_BF16_NS flatmem::contrastive::cpu::bf16::native
#define FLATMEM_V(name) _mm512_##name
#define FLATMEM_VT(type) __##type
#include "contrastive/cpu/bf16_gemm_kernels.inc"
#undef FLATMEM_VT
#undef FLATMEM_V
#undef FLATMEM_BF16_NS
#pragma GCC pop_options
#endif

namespace flatmem::contrastive::cpu::bf16 {

#if defined(FLATMEM_BF16_EMULATED) || FLATMEM_ISA_VARIANTS
#if defined(FLATMEM_BF16_EMULATED)
bool active() {
  static const bool on = [] {
    const char *v = std::getenv("FLATMEM_TEST_EMULATE_BF16");
    return v != nullptr && v[0] == '1';
  }();
  return on || cpu_isa::for_kernels() >= cpu_isa::Isa::avx512bf16;
}
#else
bool active() { return cpu_isa::for_kernels() >= cpu_isa::Isa::avx512bf16; }
#endif

void tile_logits(Rows q, Rows k, std::int64_t rows, std::int64_t cols, std::int64_t d, float *raw,
                 std::uint32_t *scratch) {
  native::tile_logits(q, k, rows, cols, d, raw, scratch);
}

void accumulate_rows_times(const float *g, Rows k, std::int64_t rows, std::int64_t cols,
                           std::int64_t d, float *out, std::int64_t out_ld, bool split,
                           std::uint32_t *scratch) {
  native::accumulate_rows_times(g, k, rows, cols, d, out, out_ld, split, scratch);
}

void accumulate_cols_times(const float *g, Rows q, std::int64_t rows, std::int64_t cols,
                           std::int64_t d, float *out, std::int64_t out_ld, bool split,
                           std::uint32_t *scratch) {
  native::accumulate_cols_times(g, q, rows, cols, d, out, out_ld, split, scratch);
}
#else
// Without the ISA variants (clang, other processors) cpu_isa never reports
// avx512bf16, so active() is false and nothing below is reached.
bool active() { return false; }
void tile_logits(Rows, Rows, std::int64_t, std::int64_t, std::int64_t, float *, std::uint32_t *) {}
void accumulate_rows_times(const float *, Rows, std::int64_t, std::int64_t, std::int64_t, float *,
                           std::int64_t, bool, std::uint32_t *) {}
void accumulate_cols_times(const float *, Rows, std::int64_t, std::int64_t, std::int64_t, float *,
                           std::int64_t, bool, std::uint32_t *) {}
#endif

}  // namespace flatmem::contrastive::cpu::bf16
