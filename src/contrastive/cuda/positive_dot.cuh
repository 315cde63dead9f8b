// The positive logit's raw product <q_i, k_j>, formed by one warp in a fixed
// order (lane-strided fmaf, then a butterfly), in the tiles' precision: for
// TF32 tiles both factors are rounded to TF32 first (their products are then
// exact in fp32, as in the tensor cores), so that x_{i,y_i} inside row_lse_i
// and the one subtracted carry the same rounding and cancel when the softmax
// is peaked. Shared by forward_finish.cu and the ring's block kernels
// (ring_kernels.cu), so one rank of the ring reproduces one device bitwise.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "contrastive/cuda/params.hpp"
#include "contrastive/cuda/tile_mma.cuh"

namespace flatmem::contrastive::cuda {

__device__ __forceinline__ float feature(const Matrix &m, std::int64_t r, std::int64_t j,
                                         Operand op, bool tf32) {
  const std::int64_t at = r * m.ld + j;
  switch (op) {
    case Operand::bf16: return __bfloat162float(static_cast<const __nv_bfloat16 *>(m.data)[at]);
    case Operand::f16: return __half2float(static_cast<const __half *>(m.data)[at]);
    default: {
      const float v = static_cast<const float *>(m.data)[at];
      return tf32 ? __uint_as_float(to_tf32(v)) : v;
    }
  }
}

// Every lane of the warp calls it; every lane gets the same sum (lane 0's is used).
__device__ __forceinline__ float positive_dot(const Matrix &q, std::int64_t i, const Matrix &k,
                                              std::int64_t j, Operand op, bool tf32, int lane) {
  float dot = 0.0f;
  for (std::int64_t t = lane; t < q.cols; t += 32)
    dot = fmaf(feature(q, i, t, op, tf32), feature(k, j, t, op, tf32), dot);
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, offset);
  return dot;
}

}  // namespace flatmem::contrastive::cuda
