// Which instruction set the CPU element-wise kernels run with. Each kernel
// file is compiled once per ISA (core/compile_per_isa.inc) and one place,
// active(), picks the variant at run time:
//   the best the processor (and OS) supports among those compiled, or
//   the one FLATMEM_CPU_ISA=amx|avx512bf16|avx512|avx2|baseline names (like oneDNN's
//   ONEDNN_MAX_CPU_ISA or OPENBLAS_CORETYPE), or
//   the one set by flatmem_cpu_isa_set().
// Asking for an ISA the processor lacks is an error (FLATMEM_STATUS_UNSUPPORTED),
// never an illegal instruction. The level also picks flatmem's own GEMM kernels
// (core/gemm/sgemm.hpp; contrastive/cpu/bf16_gemm.hpp, amx_gemm.hpp): no BLAS's
// CPU table decides what runs.
#pragma once

namespace flatmem::cpu_isa {

enum class Isa : int {
  baseline = 1,  // x86-64 (SSE2), or the portable build on other processors
  avx2 = 2,      // x86-64-v3: AVX2, FMA, BMI1/2, F16C
  avx512 = 3,    // x86-64-v4: AVX-512 F, BW, DQ, VL
  avx512bf16 = 4,  // avx512 + AVX512_BF16: bf16 tile products on vdpbf16ps
                   // (contrastive/cpu/bf16_gemm.hpp); element-wise kernels as avx512
  amx = 5,         // avx512bf16 + AMX-TILE and AMX-BF16, the OS's tile state in XCR0 and
                   // this process's permission for it (arch_prctl ARCH_REQ_XCOMP_PERM,
                   // asked once at detection): bf16 tile products on AMX tiles
                   // (contrastive/cpu/amx_gemm.hpp); everything else as avx512bf16
};

// True when AMX tiles may run in this process: the processor has AMX-TILE and
// AMX-BF16, the OS enables tile state (XCR0 bits 17, 18), and the kernel gave
// this process permission for tile data (asked once, here; permission is
// per process, so every thread may then use tiles). Without the permission the
// first tile instruction faults (SIGILL), which is why detection asks first.
bool amx_usable();

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

const char *name(Isa isa);  // "amx", "avx512bf16", "avx512", "avx2", "baseline"

}  // namespace flatmem::cpu_isa
