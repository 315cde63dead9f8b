// Which instruction set the CPU element-wise kernels run with. Each kernel
// file is compiled once per ISA (core/compile_per_isa.inc) and one place,
// active(), picks the variant at run time:
//   the best the processor (and OS) supports among those compiled, or
//   the one FLATMEM_CPU_ISA=avx512bf16|avx512|avx2|baseline names (like oneDNN's
//   ONEDNN_MAX_CPU_ISA or OPENBLAS_CORETYPE), or
//   the one set by flatmem_cpu_isa_set().
// Asking for an ISA the processor lacks is an error (FLATMEM_STATUS_UNSUPPORTED),
// never an illegal instruction. GEMMs are the BLAS's business, not covered here.
#pragma once

namespace flatmem::cpu_isa {

enum class Isa : int {
  baseline = 1,  // x86-64 (SSE2), or the portable build on other processors
  avx2 = 2,      // x86-64-v3: AVX2, FMA, BMI1/2, F16C
  avx512 = 3,    // x86-64-v4: AVX-512 F, BW, DQ, VL
  avx512bf16 = 4,  // avx512 + AVX512_BF16: bf16 tile products on vdpbf16ps
                   // (contrastive/cpu/bf16_gemm.hpp); element-wise kernels as avx512
};

// The best ISA this processor runs among those compiled into the library.
Isa detected();

// The ISA the kernels use now. Throws flatmem::Error (UNSUPPORTED /
// INVALID_ARGUMENT) when FLATMEM_CPU_ISA is malformed or names an ISA above
// detected(), so that handle creation reports it before any kernel runs.
Isa active();

// The ISA for a kernel about to run: active(), or baseline when active()
// would throw (the entry points call active() first and report that error;
// a kernel never throws over it).
Isa for_kernels() noexcept;

// Selects `isa` for the whole process (overrides FLATMEM_CPU_ISA); throws
// when the processor lacks it. reset() returns to the environment's choice.
void select(Isa isa);
void reset();

const char *name(Isa isa);  // "avx512bf16", "avx512", "avx2", "baseline"

}  // namespace flatmem::cpu_isa
