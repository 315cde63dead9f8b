// What the CPU forward and backward keep in the workspace, carved by one
// function each so that the size query and the call agree by construction.
#pragma once

#include <cstdint>
#include <vector>

#include "contrastive/plan.hpp"
#include "core/workspace.hpp"

namespace flatmem::contrastive::cpu {

// Per-thread tile scratch: O(tile_rows * tile_cols + (tile_rows + tile_cols) * d).
// For 16-bit inputs one block serves either engine (the query does not depend
// on the CPU ISA): the widened rows, or for bf16 the bf16 kernels' packing.
struct ThreadScratch {
  float *tile = nullptr;             // tile_rows x tile_cols logits / gradients
  float *q_rows = nullptr;           // widened q rows (16-bit inputs only)
  float *k_rows = nullptr;           // widened k rows (16-bit inputs only)
  std::uint32_t *pack = nullptr;     // bf16 inputs: bf16_pack_words (tile_gemm.hpp), over q_rows
  float *math = nullptr;             // tile_math_scratch_floats(tile_rows, tile_cols)
  std::int64_t *positives = nullptr; // tile_rows positive-column slots
};

struct ForwardBuffers {
  float *row_max = nullptr;   // (b,)  running log-sum-exp state per row
  double *row_sum = nullptr;  // (b,)
  float *col_max = nullptr;   // (c,)  symmetric only
  double *col_sum = nullptr;  // (c,)
  float *positive_logit = nullptr;  // (b,) x_{i, y_i} as the tiles computed it
  std::vector<ThreadScratch> threads;
};

struct BackwardBuffers {
  double *group_ds = nullptr;  // (G,) dL/ds per row group
  float *dq_acc = nullptr;     // (b, d) fp32 accumulator when dq is 16-bit
  float *dk_acc = nullptr;     // (c, d) likewise for dk
  std::vector<ThreadScratch> threads;
};

// One ThreadScratch per thread, sized for `plan`'s tiles.
std::vector<ThreadScratch> carve_thread_scratch(WorkspaceCarver &carver, const Plan &plan,
                                                Dtype input, int threads);

ForwardBuffers carve_forward(WorkspaceCarver &carver, const Plan &plan, Loss loss, Dtype input,
                             int threads);

// dq_dtype / dk_dtype: nullptr when that gradient is not requested.
BackwardBuffers carve_backward(WorkspaceCarver &carver, const Plan &plan, Dtype input,
                               const Dtype *dq_dtype, const Dtype *dk_dtype, int threads);

}  // namespace flatmem::contrastive::cpu
