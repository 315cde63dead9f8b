// Host-side entry points of the CUDA kernels: one launch function per kernel
// (template on the operand type where the tile GEMM depends on it). Each
// enqueues on `stream` and returns cudaGetLastError(); none synchronises.
#pragma once

#include <cuda_runtime_api.h>

#include "contrastive/cuda/params.hpp"

namespace flatmem::contrastive::cuda {

// forward_tiles.cu
template <Operand op>
int forward_tiles_smem_bytes();
template <Operand op>
cudaError_t launch_forward_tiles(const ForwardTileParams &p, cudaStream_t stream);

// forward_finish.cu: `blocks` CTAs write loss_partial[0..blocks).
cudaError_t launch_forward_finish(const ForwardFinishParams &p, Operand op, int blocks,
                                  cudaStream_t stream);

// backward_pass.cu: `grid` persistent CTAs, each with its own accumulator slot.
template <Operand op>
int backward_pass_smem_bytes();
template <Operand op>
cudaError_t launch_backward_pass(const PassParams &p, int grid, cudaStream_t stream);

// sigmoid_pass.cu: `grid` persistent CTAs, each with its own accumulator slot.
template <Operand op>
int sigmoid_pass_smem_bytes();
template <Operand op>
cudaError_t launch_sigmoid_pass(const SigmoidPassParams &p, int grid, cudaStream_t stream);

// final_sums.cu: one CTA each.
cudaError_t launch_loss_sum(const LossSumParams &p, cudaStream_t stream);
cudaError_t launch_ds_sum(const DsSumParams &p, cudaStream_t stream);
// *total = (accumulate ? *total : 0) + the ordered sum of partial[0..count).
cudaError_t launch_partial_sum(const double *partial, int count, double *total, bool accumulate,
                               cudaStream_t stream);

// ring_kernels.cu: the ring's per-block and final steps (see there).
cudaError_t launch_reset_states(MaxSum *states, std::int64_t n, cudaStream_t stream);
cudaError_t launch_fold_row_partials(MaxSum *running, const MaxSum *row_partial, int groups,
                                     std::int64_t b, cudaStream_t stream);
cudaError_t launch_merge_col_partials(MaxSum *fresh, const MaxSum *col_partial, int groups,
                                      std::int64_t c, cudaStream_t stream);
cudaError_t launch_merge_states(MaxSum *into, const MaxSum *from, std::int64_t n,
                                cudaStream_t stream);
cudaError_t launch_block_positives(const BlockPositiveParams &p, cudaStream_t stream);
cudaError_t launch_add_floats(float *into, const float *from, std::int64_t n, cudaStream_t stream);
cudaError_t launch_store_accumulator(const float *acc, std::int64_t rows, std::int64_t d, void *out,
                                     std::int64_t out_ld, OutType out_type, cudaStream_t stream);
cudaError_t launch_store_scalar(float *out, float value, cudaStream_t stream);

}  // namespace flatmem::contrastive::cuda
