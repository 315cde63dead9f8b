// Global -> shared loads of feature chunks, with zero fill for rows past the
// matrix and features past d, so that the GEMMs always see whole chunks
// (zeros add nothing to a dot product).
//
// Fast path (Matrix::vector_loads: base and row pitch 16-byte aligned):
// asynchronous 16-byte cp.async copies; a vector that straddles d copies only
// its valid bytes and zero-fills the rest (the cp.async src-size operand), so
// no byte past a row is read. Fallback (any alignment the DLPack checks
// accept): element loads and a 16-byte shared store.
#pragma once

#include <cstdint>
#include <type_traits>

#include "contrastive/cuda/params.hpp"
#include "contrastive/cuda/tile_mma.cuh"

namespace flatmem::contrastive::cuda {

__device__ __forceinline__ void cp_async_16(void *dst, const void *src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(dst)),
               "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int pending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(pending));
}

// The raw bits of an operand element (2 or 4 bytes); 0 bits are +0.0 in every format.
template <Operand op>
using RawElement = std::conditional_t<sizeof(typename OperandTraits<op>::Element) == 2,
                                      std::uint16_t, std::uint32_t>;

template <Operand op>
__device__ __forceinline__ RawElement<op> load_raw(const Matrix &m, std::int64_t r,
                                                   std::int64_t c) {
  return static_cast<const RawElement<op> *>(m.data)[r * m.ld + c];
}

// smem[r][0..width) = m[row0 + r][col0 .. col0 + width), r < rows; zero outside m.
// Rows of `pitch` bytes. Issues cp.async on the fast path: the caller commits and waits.
template <Operand op, int rows, int width>
__device__ __forceinline__ void load_chunk(char *smem, int pitch, const Matrix &m,
                                           std::int64_t row0, std::int64_t col0) {
  using Raw = RawElement<op>;
  constexpr int per_vector = 16 / int(sizeof(Raw));
  constexpr int vectors_per_row = width / per_vector;
  static_assert(width % per_vector == 0, "chunks are whole 16-byte vectors");
  for (int v = threadIdx.x; v < rows * vectors_per_row; v += threads) {
    const int r = v / vectors_per_row, cv = v % vectors_per_row;
    const std::int64_t gr = row0 + r, gc = col0 + std::int64_t(cv) * per_vector;
    char *dst = smem + r * pitch + cv * 16;
    if (m.vector_loads) {
      const std::int64_t valid =
          gr < m.rows && gc < m.cols ? (m.cols - gc < per_vector ? m.cols - gc : per_vector) : 0;
      const Raw *src = static_cast<const Raw *>(m.data) + (valid ? gr * m.ld + gc : 0);
      cp_async_16(dst, src, int(valid) * int(sizeof(Raw)));
    } else {
      Raw values[per_vector];
#pragma unroll
      for (int e = 0; e < per_vector; ++e)
        values[e] = gr < m.rows && gc + e < m.cols ? load_raw<op>(m, gr, gc + e) : Raw(0);
      *reinterpret_cast<uint4 *>(dst) = *reinterpret_cast<const uint4 *>(values);
    }
  }
}

// Transposed: smem[f][j] = m[row0 + j][col0 + f] for j < rows, f < width
// (zero outside m): the B operand of out = Gt * m, whose K dimension is the
// row index j of m. Synchronous loads; consecutive threads take consecutive
// j, so the 2- or 4-byte shared stores of a warp fall into distinct banks.
template <Operand op, int rows, int width>
__device__ __forceinline__ void load_chunk_transposed(char *smem, int pitch, const Matrix &m,
                                                      std::int64_t row0, std::int64_t col0) {
  using Raw = RawElement<op>;
  constexpr int per_vector = 16 / int(sizeof(Raw));
  constexpr int vectors_per_row = width / per_vector;
  for (int v = threadIdx.x; v < rows * vectors_per_row; v += threads) {
    const int j = v % rows, cv = v / rows;
    const std::int64_t gr = row0 + j, gc = col0 + std::int64_t(cv) * per_vector;
    alignas(16) Raw values[per_vector];
    if (m.vector_loads && gr < m.rows && gc + per_vector <= m.cols) {
      *reinterpret_cast<uint4 *>(values) =
          *reinterpret_cast<const uint4 *>(static_cast<const Raw *>(m.data) + gr * m.ld + gc);
    } else {
#pragma unroll
      for (int e = 0; e < per_vector; ++e)
        values[e] = gr < m.rows && gc + e < m.cols ? load_raw<op>(m, gr, gc + e) : Raw(0);
    }
#pragma unroll
    for (int e = 0; e < per_vector; ++e)
      *reinterpret_cast<Raw *>(smem + (cv * per_vector + e) * pitch + j * int(sizeof(Raw))) =
          values[e];
  }
}

// Stores of the three output element types, rounded to nearest even once.
__device__ __forceinline__ void store_output(void *base, std::int64_t index, OutType type,
                                             float v) {
  switch (type) {
    case OutType::bf16: static_cast<__nv_bfloat16 *>(base)[index] = __float2bfloat16_rn(v); break;
    case OutType::f16: static_cast<__half *>(base)[index] = __float2half_rn(v); break;
    default: static_cast<float *>(base)[index] = v; break;
  }
}

}  // namespace flatmem::contrastive::cuda
