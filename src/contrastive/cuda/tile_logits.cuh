// One 64 x 128 tile of raw products raw_ij = <a_i, b_j> in registers, for
// the forward and both backward passes: a GEMM over d in chunks of 32
// features, double-buffered in shared memory (cp.async of chunk kc + 1 runs
// while the tensor cores work on chunk kc). Nothing of the tile ever leaves
// the chip.
//
// Register layout of the result (per warp w, lane = 4g + t): acc[n][e] holds
//   row  16w + g + 8 (e / 2),   column 8n + 2t + (e % 2)
// of the tile; rows past a.rows and columns past b.rows come out as 0.
#pragma once

#include "contrastive/cuda/params.hpp"
#include "contrastive/cuda/tile_load.cuh"
#include "contrastive/cuda/tile_mma.cuh"

namespace flatmem::contrastive::cuda {

constexpr int tile_col_frags = tile_cols / 8;  // n8 fragments per warp row strip

template <Operand op>
struct LogitStages {
  static constexpr int pitch = smem_pitch<op>(chunk_d);
  static constexpr int a_bytes = tile_rows * pitch;
  static constexpr int stage_bytes = (tile_rows + tile_cols) * pitch;
  static constexpr int bytes = 2 * stage_bytes;
};

// Row and column of tile element (n, e) for this thread, relative to the tile.
__device__ __forceinline__ int frag_row(int e) {
  return (threadIdx.x >> 5) * 16 + ((threadIdx.x & 31) >> 2) + 8 * (e >> 1);
}
__device__ __forceinline__ int frag_col(int n, int e) {
  return n * 8 + 2 * (threadIdx.x & 3) + (e & 1);
}

template <Operand op>
__device__ __forceinline__ void logit_tile(float (&acc)[tile_col_frags][4], char *stages,
                                           const Matrix &a, const Matrix &b, std::int64_t row0,
                                           std::int64_t col0) {
  using S = LogitStages<op>;
#pragma unroll
  for (int n = 0; n < tile_col_frags; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[n][e] = 0.0f;
  const int chunks = int((a.cols + chunk_d - 1) / chunk_d);
  load_chunk<op, tile_rows, chunk_d>(stages, S::pitch, a, row0, 0);
  load_chunk<op, tile_cols, chunk_d>(stages + S::a_bytes, S::pitch, b, col0, 0);
  cp_async_commit();
  const int warp = threadIdx.x >> 5;
  for (int kc = 0; kc < chunks; ++kc) {
    char *current = stages + (kc & 1) * S::stage_bytes;
    if (kc + 1 < chunks) {
      char *next = stages + ((kc + 1) & 1) * S::stage_bytes;
      const std::int64_t d0 = std::int64_t(kc + 1) * chunk_d;
      load_chunk<op, tile_rows, chunk_d>(next, S::pitch, a, row0, d0);
      load_chunk<op, tile_cols, chunk_d>(next + S::a_bytes, S::pitch, b, col0, d0);
    }
    cp_async_commit();  // possibly empty: keeps "all but the newest group" meaning chunk kc
    cp_async_wait<1>();
    __syncthreads();
    warp_gemm_nt<op, tile_col_frags>(acc, current + warp * 16 * S::pitch, S::pitch,
                                     current + S::a_bytes, S::pitch, chunk_d);
    __syncthreads();  // the stage is overwritten two chunks later
  }
}

// s from its device scalar; a value the CPU path would refuse (not finite, or
// <= 0) becomes NaN so that every output shows it (no host check is possible
// without a round trip).
__device__ __forceinline__ float read_scale(const float *scale) {
  const float s = *scale;
  return (s > 0.0f && s <= 3.402823466e38f) ? s : __int_as_float(0x7fc00000);
}

constexpr float log2e = 1.4426950408889634f;

// exp(x - m) with m = -inf read as 0 (an empty state), so that masked -inf
// entries give 0 instead of NaN.
__device__ __forceinline__ float exp_shifted(float x, float m) {
  const float safe = m == -__int_as_float(0x7f800000) ? 0.0f : m;
  return exp2f((x - safe) * log2e);
}

// (m1, s1) <- merge with (m2, s2): both sums rescaled to the larger maximum.
__device__ __forceinline__ void merge_state(float &m1, float &s1, float m2, float s2) {
  const float m = fmaxf(m1, m2);
  s1 = s1 * exp_shifted(m1, m) + s2 * exp_shifted(m2, m);
  m1 = m;
}

}  // namespace flatmem::contrastive::cuda
