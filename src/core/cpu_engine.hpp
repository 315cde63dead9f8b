// What computes the CPU products at an instruction-set level, in words: the
// library and version, and the kernel for each input dtype. The answer of
// flatmem_cpu_isa_engine (flatmem.h), printed by the benchmarks beside every
// row, so that a user sees which kernels ran -- never a BLAS's guess.
#pragma once

#include "core/cpu_isa.hpp"

namespace flatmem::cpu_isa {

// A static string, e.g. "flatmem 0.2.0 own kernels at amx: fp32 avx512 fma
// 12x32; bf16 AMX tiles (TDPBF16PS); fp16 widened to fp32".
const char *engine(Isa isa);

}  // namespace flatmem::cpu_isa
