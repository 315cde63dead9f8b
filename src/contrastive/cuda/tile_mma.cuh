// Tensor-core building blocks: per-operand storage types, the mma.sync
// wrappers, and the warp-level "NT" GEMM over shared-memory tiles
//     acc[16 x 8*N] += A[16 x K] * B[8*N x K]^T
// where A holds the warp's 16 rows and B one row per output column, both with
// the K dimension contiguous (row pitch in bytes, 16 bytes of padding per row
// so that the fragment loads below are free of bank conflicts).
//
// Fragment layouts (PTX ISA, "Matrix fragments for mma.m16n8k16 / m16n8k8"),
// g = lane / 4, t = lane % 4:
//   m16n8k16 (bf16, fp16): A regs a0..a3 = rows {g, g+8} x cols {2t, 2t+1}
//     then the same at cols + 8; B regs b0, b1 = cols k {2t, 2t+1} and
//     {2t+8, 2t+9} of output column g; C = rows {g, g+8} x cols {2t, 2t+1}.
//   m16n8k8 (tf32): a0 = (g, t), a1 = (g+8, t), a2 = (g, t+4), a3 = (g+8, t+4);
//     b0 = (k t, n g), b1 = (k t+4, n g); C as above.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "contrastive/cuda/params.hpp"

namespace flatmem::contrastive::cuda {

template <Operand op>
struct OperandTraits;

template <>
struct OperandTraits<Operand::bf16> {
  using Element = __nv_bfloat16;
  static constexpr int k_step = 16;
  static __device__ __forceinline__ Element from_float(float v) { return __float2bfloat16_rn(v); }
  static __device__ __forceinline__ float to_float(Element v) { return __bfloat162float(v); }
};

template <>
struct OperandTraits<Operand::f16> {
  using Element = __half;
  static constexpr int k_step = 16;
  static __device__ __forceinline__ Element from_float(float v) { return __float2half_rn(v); }
  static __device__ __forceinline__ float to_float(Element v) { return __half2float(v); }
};

template <>
struct OperandTraits<Operand::tf32> {
  using Element = float;
  static constexpr int k_step = 8;
  static __device__ __forceinline__ Element from_float(float v) { return v; }
  static __device__ __forceinline__ float to_float(Element v) { return v; }
};

template <>
struct OperandTraits<Operand::f32x3> : OperandTraits<Operand::tf32> {};

// Bytes of one shared-memory row holding `elements` operands plus the padding.
template <Operand op>
constexpr int smem_pitch(int elements) {
  return elements * int(sizeof(typename OperandTraits<op>::Element)) + 16;
}

__device__ __forceinline__ std::uint32_t smem_address(const void *p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], const void *p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(p)));
}

template <Operand op>
__device__ __forceinline__ void mma_16x8x16(float (&c)[4], const std::uint32_t (&a)[4],
                                            std::uint32_t b0, std::uint32_t b1) {
  if constexpr (op == Operand::bf16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

__device__ __forceinline__ void mma_16x8x8_tf32(float (&c)[4], const std::uint32_t (&a)[4],
                                                std::uint32_t b0, std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// fp32 -> TF32 (round to nearest, ties away: cvt.rna), as a 32-bit pattern.
__device__ __forceinline__ std::uint32_t to_tf32(float v) {
  std::uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(v));
  return r;
}

// v = head + tail with both TF32: head = tf32(v), tail = tf32(v - head).
// head * head' + head * tail' + tail * head' misses only tail * tail'
// (relative 2^-22) and the tails' own rounding (2^-22): close to fp32.
__device__ __forceinline__ void split_tf32(float v, std::uint32_t &head, std::uint32_t &tail) {
  head = to_tf32(v);
  tail = to_tf32(v - __uint_as_float(head));
}

// acc[n] (n < N) += A(16 x K, the warp's rows) * B(8N x K)^T.
// a: first of the warp's 16 rows; b: first output column; pitches in bytes.
template <Operand op, int N>
__device__ __forceinline__ void warp_gemm_nt(float (&acc)[N][4], const char *a, int a_pitch,
                                             const char *b, int b_pitch, int k_extent) {
  const int lane = threadIdx.x & 31;
  if constexpr (op == Operand::bf16 || op == Operand::f16) {
    static_assert(N % 2 == 0, "ldmatrix.x4 loads B for two n8 tiles at once");
    // ldmatrix.x4: lanes 8m..8m+7 give the row addresses of matrix m.
    const int m = lane >> 3, r = lane & 7;
    const char *a_lane = a + ((m & 1) * 8 + r) * a_pitch + (m >> 1) * 8 * 2;  // a0 a1 a2 a3
    const char *b_lane = b + ((m >> 1) * 8 + r) * b_pitch + (m & 1) * 8 * 2;  // b0 b1 of 2 tiles
    for (int k0 = 0; k0 < k_extent; k0 += 16) {
      std::uint32_t fa[4];
      ldmatrix_x4(fa, a_lane + k0 * 2);
#pragma unroll
      for (int n2 = 0; n2 < N / 2; ++n2) {
        std::uint32_t fb[4];
        ldmatrix_x4(fb, b_lane + n2 * 16 * b_pitch + k0 * 2);
        mma_16x8x16<op>(acc[2 * n2], fa, fb[0], fb[1]);
        mma_16x8x16<op>(acc[2 * n2 + 1], fa, fb[2], fb[3]);
      }
    }
  } else {
    const int g = lane >> 2, t = lane & 3;
    const float *a0 = reinterpret_cast<const float *>(a + g * a_pitch);
    const float *a8 = reinterpret_cast<const float *>(a + (g + 8) * a_pitch);
    for (int k0 = 0; k0 < k_extent; k0 += 8) {
      const float av[4] = {a0[k0 + t], a8[k0 + t], a0[k0 + t + 4], a8[k0 + t + 4]};
      std::uint32_t ah[4], at[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        if constexpr (op == Operand::f32x3) split_tf32(av[i], ah[i], at[i]);
        else ah[i] = to_tf32(av[i]);
      }
#pragma unroll
      for (int n = 0; n < N; ++n) {
        const float *bn = reinterpret_cast<const float *>(b + (n * 8 + g) * b_pitch);
        const float b0 = bn[k0 + t], b1 = bn[k0 + t + 4];
        if constexpr (op == Operand::f32x3) {
          std::uint32_t bh0, bt0, bh1, bt1;
          split_tf32(b0, bh0, bt0);
          split_tf32(b1, bh1, bt1);
          // small terms first, then the head product
          mma_16x8x8_tf32(acc[n], at, bh0, bh1);
          mma_16x8x8_tf32(acc[n], ah, bt0, bt1);
          mma_16x8x8_tf32(acc[n], ah, bh0, bh1);
        } else {
          mma_16x8x8_tf32(acc[n], ah, to_tf32(b0), to_tf32(b1));
        }
      }
    }
  }
}

}  // namespace flatmem::contrastive::cuda
