// Compiling a kernel file once per instruction set, in one translation unit.
//
// A kernel file (e.g. contrastive/cpu/tile_math.cpp) includes its standard
// headers, then core/compile_per_isa.inc with FLATMEM_ISA_SELF naming itself:
// the .inc includes the file again once per ISA with FLATMEM_ISA_NS set to
// isa_baseline / isa_avx2 / isa_avx512, each under `#pragma GCC target`
// (x86-64-v3 with FMA; x86-64-v4 with 512-bit vectors preferred). The file's
// kernels, defined inside namespace FLATMEM_ISA_NS, exist three times; its
// public functions, compiled once, call the variant cpu_isa::active() picks
// through FLATMEM_ISA_CALL.
//
// Why pragmas in one TU and not three TUs with -march flags: an inline
// function or template instantiated in a TU built with -march=x86-64-v4 is a
// weak symbol, and the linker may keep that copy for every caller, so code
// outside the kernels would execute AVX-512 on an AVX2 machine. Under the
// pragma only the functions defined in the ISA namespace get the target;
// headers (and the std templates they define) are compiled for baseline
// x86-64 and inlined into the kernels, never the other way round.
// Replaces GCC's target_clones, which gave no way to force or test a path and
// no FMA in its avx2 clone.
#pragma once

#include "core/cpu_isa.hpp"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(FLATMEM_NO_ISA_VARIANTS)
#define FLATMEM_ISA_VARIANTS 1
#else
#define FLATMEM_ISA_VARIANTS 0
#endif

// Calls FN's variant for the ISA cpu_isa::for_kernels() names with the given arguments (FN is
// declared in each isa_* namespace nested in the current namespace).
#if FLATMEM_ISA_VARIANTS
#define FLATMEM_ISA_CALL(FN, ...)                                  \
  do {                                                             \
    switch (::flatmem::cpu_isa::for_kernels()) {                        \
      case ::flatmem::cpu_isa::Isa::amx:                           \
      case ::flatmem::cpu_isa::Isa::avx512bf16:                    \
      case ::flatmem::cpu_isa::Isa::avx512: return isa_avx512::FN(__VA_ARGS__); \
      case ::flatmem::cpu_isa::Isa::avx2: return isa_avx2::FN(__VA_ARGS__);     \
      default: return isa_baseline::FN(__VA_ARGS__);               \
    }                                                              \
  } while (0)
#else
#define FLATMEM_ISA_CALL(FN, ...) return isa_baseline::FN(__VA_ARGS__)
#endif
