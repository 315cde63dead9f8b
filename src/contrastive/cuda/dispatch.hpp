// What the host side of the CUDA backend needs to turn a problem into kernel
// launches, shared by the single-device calls (backend.cpp) and the ring
// (src/contrastive/ring/cuda/): the operand type, device views of matrices,
// grid sizes, and one launch function per kernel family that dispatches on
// the operand type. Nothing here synchronises or allocates.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "contrastive/cuda/params.hpp"
#include "contrastive/problem.hpp"

namespace flatmem::contrastive::cuda {

inline std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// bf16 / f16 inputs as themselves; fp32 as TF32, or 3xTF32 for FULL.
Operand operand_for(Dtype dtype, Fp32Precision precision);
OutType out_type_for(Dtype dtype);
// m's data, shape and stride, and whether 16-byte vector loads are allowed.
Matrix device_matrix(const MatrixView &m);

// The forward's split: row groups (of q's rows) x column groups (of k's rows)
// of forward_tiles, and the CTAs of forward_finish.
struct ForwardGrid {
  int row_groups = 1, col_groups = 1, finish_blocks = 1;
};
ForwardGrid forward_grid(std::int64_t b, std::int64_t c);

// Gradient passes: d rounded up to the product's chunk; persistent CTAs over
// `rows` output rows (at most two per SM).
int slot_pitch(std::int64_t d);
int pass_grid(std::int64_t rows, int multiprocessors);

cudaError_t launch_tiles_for(Operand op, const ForwardTileParams &p, cudaStream_t stream);
cudaError_t launch_pass_for(Operand op, const PassParams &p, int grid, cudaStream_t stream);
cudaError_t launch_sigmoid_for(Operand op, const SigmoidPassParams &p, int grid, cudaStream_t stream);

}  // namespace flatmem::contrastive::cuda
