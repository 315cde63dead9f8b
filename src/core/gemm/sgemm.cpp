// flatmem's fp32 GEMM (sgemm.hpp), BLIS-style, compiled once per CPU ISA
// (core/compile_per_isa.inc); the kernel part below #else is included three
// times, inside namespace FLATMEM_ISA_NS, and picks its intrinsics with #if on
// FLATMEM_ISA_LEVEL (GCC's C++ front end leaves __AVX2__ / __AVX512F__ alone
// under the target pragma; the intrinsics themselves are usable there).
//
// C (m x n) = alpha op(A) op(B) + beta C is cut into blocks that fit the caches
// (L1 48 KB, L2 2 MB per core on the Xeons this was tuned on):
//   for j0 over n by kBlockCols:                 op(B) block kc x nc (L3)
//     for p0 over k by kc:                       packed once, in kCols-wide micro-panels
//       for i0 over m by kBlockRows:             op(A) block mc x kc, packed once (L2:
//                                                 384 x 256 floats = 384 KB)
//         for each micro-panel of B (kc x kCols: 32 KB at avx512, stays in L1)
//           for each sliver of A (kRows x kc, streamed from L2):
//             micro_kernel: the kRows x kCols tile of C in registers,
//             C_tile = sum_p a_p b_p^T (a rank-1 update per p: kRows broadcasts
//             of A times kCols / lanes vector loads of B, one FMA each).
// The packers take every transpose (A may be G^T with a long stride), lay the
// operands out in the order the kernel reads them, and pad with zeros to whole
// slivers and micro-panels, so one kernel serves every shape; C's ragged edge
// tiles go through a small local buffer. kc is k split evenly into blocks of at
// most kDepth, a function of k only: the order of every sum depends on the
// shape alone, never on alignment or thread, so results are bitwise reproducible.
//
// Rounding, per entry: within a k block the FMA chain rounds each step once
// (the SSE2 variant rounds the product too); each block is folded into C as
// c = alpha acc + (first block ? beta c : c). A term a_p b_p therefore meets at
// most kc + 2 + (blocks - 1) <= k + 2 roundings (sgemm.hpp's bound).
//
// Why not a BLAS: see sgemm.hpp. Reference and test: tests/core/test_sgemm.cpp;
// speed against OpenBLAS: bench/sgemm_bench.cpp.
#ifndef FLATMEM_ISA_NS
#include "core/gemm/sgemm.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>

#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include "core/isa_variants.hpp"

namespace flatmem::gemm {
namespace {

// A thread's packing buffer: 64-byte aligned, grown on demand, never beyond
// the largest block (kDepth x kBlockCols, or kBlockRows x kDepth, floats).
class PackBuffer {
 public:
  PackBuffer() = default;
  PackBuffer(const PackBuffer &) = delete;
  PackBuffer &operator=(const PackBuffer &) = delete;
  ~PackBuffer() { std::free(data_); }
  float *reserve(std::size_t floats) {
    if (floats > floats_) {
      const std::size_t bytes = (floats * sizeof(float) + 63) / 64 * 64;
      void *fresh = std::aligned_alloc(64, bytes);
      if (fresh == nullptr) throw std::bad_alloc();
      std::free(data_);
      data_ = static_cast<float *>(fresh);
      floats_ = floats;
    }
    return data_;
  }

 private:
  float *data_ = nullptr;
  std::size_t floats_ = 0;
};

enum class Packed { a, b };
float *packing(Packed which, std::size_t floats) {
  thread_local PackBuffer buffers[2];
  return buffers[int(which)].reserve(floats);
}

inline std::int64_t ceil_div(std::int64_t x, std::int64_t y) { return (x + y - 1) / y; }

// k == 0 or alpha == 0: C = beta C, without reading C when beta == 0.
void scale_c(std::int64_t m, std::int64_t n, float beta, float *c, std::int64_t ldc) {
  for (std::int64_t i = 0; i < m; ++i) {
    float *row = c + i * ldc;
    if (beta == 0.0f)
      std::fill(row, row + n, 0.0f);
    else if (beta != 1.0f)
      for (std::int64_t j = 0; j < n; ++j) row[j] *= beta;
  }
}

}  // namespace
}  // namespace flatmem::gemm

#define FLATMEM_ISA_SELF "core/gemm/sgemm.cpp"
#include "core/compile_per_isa.inc"

namespace flatmem::gemm {

void sgemm(cpu_isa::Isa isa, Op op_a, Op op_b, std::int64_t m, std::int64_t n, std::int64_t k,
           float alpha, const float *a, std::int64_t lda, const float *b, std::int64_t ldb,
           float beta, float *c, std::int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0 || alpha == 0.0f) return scale_c(m, n, beta, c, ldc);
#if FLATMEM_ISA_VARIANTS
  switch (isa) {
    case cpu_isa::Isa::amx:
    case cpu_isa::Isa::avx512bf16:
    case cpu_isa::Isa::avx512:
      return isa_avx512::sgemm(op_a, op_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    case cpu_isa::Isa::avx2:
      return isa_avx2::sgemm(op_a, op_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    default: break;
  }
#else
  (void)isa;
#endif
  isa_baseline::sgemm(op_a, op_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

const char *sgemm_kernel(cpu_isa::Isa isa) {
#if FLATMEM_ISA_VARIANTS
  switch (isa) {
    case cpu_isa::Isa::amx:
    case cpu_isa::Isa::avx512bf16:
    case cpu_isa::Isa::avx512: return isa_avx512::kKernelName;
    case cpu_isa::Isa::avx2: return isa_avx2::kKernelName;
    default: break;
  }
#else
  (void)isa;
#endif
  return isa_baseline::kKernelName;
}

}  // namespace flatmem::gemm

#else  // ---- kernels, once per ISA ------------------------------------------------

namespace flatmem::gemm::FLATMEM_ISA_NS {

// The vector operations one variant is written in, and its block sizes:
// kRows x kCols accumulators (kRows kCols / kLanes registers) plus kCols / kLanes
// for B's row and one broadcast of A fill the register file without spills.
#if FLATMEM_ISA_LEVEL == 3
using Vec = __m512;
constexpr int kLanes = 16, kRows = 12, kCols = 32;
constexpr std::int64_t kDepth = 256;  // B micro-panel kDepth x 32 floats = 32 KB of L1's 48
constexpr const char *kKernelName = "avx512 fma 12x32";
inline Vec load(const float *p) { return _mm512_loadu_ps(p); }
inline void store(float *p, Vec v) { _mm512_storeu_ps(p, v); }
inline Vec broadcast(float x) { return _mm512_set1_ps(x); }
inline Vec zero() { return _mm512_setzero_ps(); }
inline Vec mul(Vec x, Vec y) { return _mm512_mul_ps(x, y); }
inline Vec mul_add(Vec x, Vec y, Vec z) { return _mm512_fmadd_ps(x, y, z); }  // x y + z, rounded once
#elif FLATMEM_ISA_LEVEL == 2
using Vec = __m256;
constexpr int kLanes = 8, kRows = 6, kCols = 16;
constexpr std::int64_t kDepth = 384;  // B micro-panel 384 x 16 floats = 24 KB
constexpr const char *kKernelName = "avx2 fma 6x16";
inline Vec load(const float *p) { return _mm256_loadu_ps(p); }
inline void store(float *p, Vec v) { _mm256_storeu_ps(p, v); }
inline Vec broadcast(float x) { return _mm256_set1_ps(x); }
inline Vec zero() { return _mm256_setzero_ps(); }
inline Vec mul(Vec x, Vec y) { return _mm256_mul_ps(x, y); }
inline Vec mul_add(Vec x, Vec y, Vec z) { return _mm256_fmadd_ps(x, y, z); }
#elif defined(__SSE2__)
using Vec = __m128;
constexpr int kLanes = 4, kRows = 4, kCols = 8;
constexpr std::int64_t kDepth = 384;  // B micro-panel 384 x 8 floats = 12 KB
constexpr const char *kKernelName = "sse2 mul+add 4x8";
inline Vec load(const float *p) { return _mm_loadu_ps(p); }
inline void store(float *p, Vec v) { _mm_storeu_ps(p, v); }
inline Vec broadcast(float x) { return _mm_set1_ps(x); }
inline Vec zero() { return _mm_setzero_ps(); }
inline Vec mul(Vec x, Vec y) { return _mm_mul_ps(x, y); }
inline Vec mul_add(Vec x, Vec y, Vec z) { return _mm_add_ps(_mm_mul_ps(x, y), z); }  // no FMA: 2 roundings
#else  // other processors: the same loops on 4-float arrays, left to the compiler
struct Vec {
  float v[4];
};
constexpr int kLanes = 4, kRows = 4, kCols = 8;
constexpr std::int64_t kDepth = 384;
constexpr const char *kKernelName = "portable 4x8";
inline Vec load(const float *p) { return Vec{{p[0], p[1], p[2], p[3]}}; }
inline void store(float *p, Vec v) { std::memcpy(p, v.v, sizeof v.v); }
inline Vec broadcast(float x) { return Vec{{x, x, x, x}}; }
inline Vec zero() { return broadcast(0.0f); }
inline Vec mul(Vec x, Vec y) {
  for (int l = 0; l < 4; ++l) x.v[l] *= y.v[l];
  return x;
}
inline Vec mul_add(Vec x, Vec y, Vec z) {
  for (int l = 0; l < 4; ++l) z.v[l] = x.v[l] * y.v[l] + z.v[l];  // -ffp-contract=off: 2 roundings
  return z;
}
#endif
constexpr int kVectors = kCols / kLanes;
// The op(A) block (kBlockRows x kc, 384 KB at kc = 256) stays in L2 while every
// micro-panel of B passes over it; the op(B) block (kc x kBlockCols, 2 MB at
// kc = 256) is packed once per k block and reused by all of A's blocks.
constexpr std::int64_t kBlockRows = 384 / kRows * kRows;
constexpr std::int64_t kBlockCols = 2048;

// The tile of C (kRows x kCols, ld ldc) = alpha A_sliver B_panel + (first ?
// beta C : C), where a holds the sliver (kc x kRows, a[p kRows + i] = op(A)(i, p))
// and b the micro-panel (kc x kCols, b[p kCols + j] = op(B)(p, j)).
// first with beta == 0: C is not read.
inline void micro_kernel(std::int64_t kc, const float *a, const float *b, float *c,
                         std::int64_t ldc, float alpha, float beta, bool first) {
  Vec acc[kRows][kVectors];
#pragma GCC unroll 16
  for (int i = 0; i < kRows; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < kVectors; ++v) acc[i][v] = zero();

#pragma GCC unroll 2
  for (std::int64_t p = 0; p < kc; ++p, a += kRows, b += kCols) {
    Vec bv[kVectors];
#pragma GCC unroll 4
    for (int v = 0; v < kVectors; ++v) bv[v] = load(b + v * kLanes);
#pragma GCC unroll 16
    for (int i = 0; i < kRows; ++i) {
      const Vec av = broadcast(a[i]);
#pragma GCC unroll 4
      for (int v = 0; v < kVectors; ++v) acc[i][v] = mul_add(av, bv[v], acc[i][v]);
    }
  }

  const Vec va = broadcast(alpha);
  const bool read_c = !first || beta != 0.0f;
  const bool scale_c = first && beta != 1.0f;
  const Vec vb = broadcast(beta);
#pragma GCC unroll 16
  for (int i = 0; i < kRows; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < kVectors; ++v) {
      float *dst = c + i * ldc + v * kLanes;
      if (!read_c) {
        store(dst, mul(va, acc[i][v]));
        continue;
      }
      Vec old = load(dst);
      if (scale_c) old = mul(vb, old);
      store(dst, mul_add(va, acc[i][v], old));
    }
}

// A tile on C's ragged edge (rows x cols < kRows x kCols): the kernel runs on
// a local tile; C's part is copied in (when read) and out.
inline void edge_kernel(std::int64_t kc, const float *a, const float *b, float *c, std::int64_t ldc,
                        int rows, int cols, float alpha, float beta, bool first) {
  alignas(64) float tile[kRows * kCols] = {};
  const bool read_c = !first || beta != 0.0f;
  if (read_c)
    for (int i = 0; i < rows; ++i) std::memcpy(tile + i * kCols, c + i * ldc, std::size_t(cols) * sizeof(float));
  micro_kernel(kc, a, b, tile, kCols, alpha, beta, first);
  for (int i = 0; i < rows; ++i) std::memcpy(c + i * ldc, tile + i * kCols, std::size_t(cols) * sizeof(float));
}

// op(A) rows [i0, i0 + mc) x columns [p0, p0 + kc) as slivers of kRows rows
// (sliver s at out + s kc kRows, element (i, p) at p kRows + i), zero-padded.
inline void pack_a(Op op, const float *a, std::int64_t lda, std::int64_t i0, std::int64_t mc,
                   std::int64_t p0, std::int64_t kc, float *out) {
  for (std::int64_t s0 = 0; s0 < mc; s0 += kRows, out += kc * kRows) {
    const int rows = int(std::min<std::int64_t>(kRows, mc - s0));
    if (op == Op::transpose) {  // op(A)(i, p) = a[p lda + i]: kRows contiguous floats per p
      for (std::int64_t p = 0; p < kc; ++p) {
        const float *src = a + (p0 + p) * lda + i0 + s0;
        float *dst = out + p * kRows;
        for (int i = 0; i < rows; ++i) dst[i] = src[i];
        for (int i = rows; i < kRows; ++i) dst[i] = 0.0f;
      }
      continue;
    }
    for (int i = 0; i < kRows; ++i) {  // op(A)(i, p) = a[i lda + p]: one row at a time
      if (i >= rows) {
        for (std::int64_t p = 0; p < kc; ++p) out[p * kRows + i] = 0.0f;
        continue;
      }
      const float *src = a + (i0 + s0 + i) * lda + p0;
      for (std::int64_t p = 0; p < kc; ++p) out[p * kRows + i] = src[p];
    }
  }
}

// op(B) rows [p0, p0 + kc) x columns [j0, j0 + nc) as micro-panels of kCols
// columns (panel t at out + t kc kCols, element (p, j) at p kCols + j), zero-padded.
inline void pack_b(Op op, const float *b, std::int64_t ldb, std::int64_t p0, std::int64_t kc,
                   std::int64_t j0, std::int64_t nc, float *out) {
  for (std::int64_t t0 = 0; t0 < nc; t0 += kCols, out += kc * kCols) {
    const int cols = int(std::min<std::int64_t>(kCols, nc - t0));
    if (op == Op::none) {  // op(B)(p, j) = b[p ldb + j]: kCols contiguous floats per p
      for (std::int64_t p = 0; p < kc; ++p) {
        const float *src = b + (p0 + p) * ldb + j0 + t0;
        float *dst = out + p * kCols;
        for (int j = 0; j < cols; ++j) dst[j] = src[j];
        for (int j = cols; j < kCols; ++j) dst[j] = 0.0f;
      }
      continue;
    }
    for (int j = 0; j < kCols; ++j) {  // op(B)(p, j) = b[j ldb + p]: one row of b at a time
      if (j >= cols) {
        for (std::int64_t p = 0; p < kc; ++p) out[p * kCols + j] = 0.0f;
        continue;
      }
      const float *src = b + (j0 + t0 + j) * ldb + p0;
      for (std::int64_t p = 0; p < kc; ++p) out[p * kCols + j] = src[p];
    }
  }
}

// m, n, k > 0, alpha != 0 (sgemm in the part above handles the rest).
void sgemm(Op op_a, Op op_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
           const float *a, std::int64_t lda, const float *b, std::int64_t ldb, float beta, float *c,
           std::int64_t ldc) {
  // Even blocks (k = 512 at kDepth 384: two of 256, not 384 + 128), a function of the shape only.
  const std::int64_t kc_max = ceil_div(k, ceil_div(k, kDepth));
  const std::int64_t mc_max = ceil_div(ceil_div(m, ceil_div(m, kBlockRows)), kRows) * kRows;
  const std::int64_t nc_max = std::min(ceil_div(n, kCols) * kCols, kBlockCols);
  float *packed_a = packing(Packed::a, std::size_t(mc_max * kc_max));
  float *packed_b = packing(Packed::b, std::size_t(kc_max * nc_max));

  for (std::int64_t j0 = 0; j0 < n; j0 += kBlockCols) {
    const std::int64_t nc = std::min(kBlockCols, n - j0);
    for (std::int64_t p0 = 0; p0 < k; p0 += kc_max) {
      const std::int64_t kc = std::min(kc_max, k - p0);
      const bool first = p0 == 0;
      pack_b(op_b, b, ldb, p0, kc, j0, nc, packed_b);
      for (std::int64_t i0 = 0; i0 < m; i0 += mc_max) {
        const std::int64_t mc = std::min(mc_max, m - i0);
        pack_a(op_a, a, lda, i0, mc, p0, kc, packed_a);
        for (std::int64_t t0 = 0; t0 < nc; t0 += kCols) {
          const float *panel = packed_b + t0 * kc;
          const int cols = int(std::min<std::int64_t>(kCols, nc - t0));
          for (std::int64_t s0 = 0; s0 < mc; s0 += kRows) {
            const float *sliver = packed_a + s0 * kc;
            const int rows = int(std::min<std::int64_t>(kRows, mc - s0));
            float *tile = c + (i0 + s0) * ldc + j0 + t0;
            if (rows == kRows && cols == kCols)
              micro_kernel(kc, sliver, panel, tile, ldc, alpha, beta, first);
            else
              edge_kernel(kc, sliver, panel, tile, ldc, rows, cols, alpha, beta, first);
          }
        }
      }
    }
  }
}

}  // namespace flatmem::gemm::FLATMEM_ISA_NS
#endif
