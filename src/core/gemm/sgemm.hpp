// flatmem's own single-threaded fp32 GEMM, one variant per CPU ISA level.
//
// The CPU products of the contrastive tiles and of the built-in reversible
// blocks run here rather than in a BLAS, so that flatmem's ISA level
// (core/cpu_isa.hpp), never a BLAS's CPU table, decides which kernels run:
// Debian's OpenBLAS 0.3.21 does not know Sapphire / Emerald Rapids and falls
// back to its SSE3 kernels there (5x slower than its AVX-512 ones).
// How it works: core/gemm/sgemm.cpp.
#pragma once

#include <cstdint>

#include "core/cpu_isa.hpp"

namespace flatmem::gemm {

enum class Op { none, transpose };

// Row-major C (m x n, ldc) = alpha * op(A) * op(B) + beta * C, on the calling
// thread only (flatmem's own threads call it once per tile); op(A) is m x k,
// op(B) is k x n, each stored row-major with its leading dimension (A is
// k x m in memory when op_a is transpose, B n x k when op_b is).
//   beta == 0: C is not read (NaN or garbage in C does not propagate, as BLAS).
//   k == 0 or alpha == 0: C = beta C, A and B not read (as BLAS).
// Deterministic: the result depends only on `isa` and the arguments' values
// and shapes (not on pointer alignment, not on the thread). `isa` must be one
// the processor runs (cpu_isa::detected() or below); amx and avx512bf16 run
// the avx512 variant.
// Accuracy: every entry is a sum of k + 1 terms, each rounded at most k + 2
// times, so |C - exact| <= gamma_{k+2} (|alpha| sum_p |a_ip| |b_pj| + |beta c_ij|),
// gamma_n = n u / (1 - n u), u = 2^-24 (tests/core/test_sgemm.cpp).
void sgemm(cpu_isa::Isa isa, Op op_a, Op op_b, std::int64_t m, std::int64_t n, std::int64_t k,
           float alpha, const float *a, std::int64_t lda, const float *b, std::int64_t ldb,
           float beta, float *c, std::int64_t ldc);

// What runs at `isa`, a static string, e.g. "avx512 fma 12x32" (rows x columns
// of the register block); for benchmark rows and the library's queries.
const char *sgemm_kernel(cpu_isa::Isa isa);

}  // namespace flatmem::gemm
