// CPU driver of the sigmoid (SigLIP) loss: one Latin-square tile walk
// (tile_walk.hpp) per call gives the loss and/or the gradients; nothing is
// saved between calls. sigmoid_block is that walk over one (rows, column
// block) pair: a single process runs it once, the ring
// (src/contrastive/ring/ring_sigmoid.cpp) once per column block that passes
// through the rank.
#pragma once

#include <vector>

#include "contrastive/cpu/blocks.hpp"
#include "contrastive/plan.hpp"
#include "contrastive/problem.hpp"
#include "contrastive/sigmoid_args.hpp"
#include "core/thread_pool.hpp"

namespace flatmem::contrastive::cpu {

// The tile terms of one block: G = coef * dL/dx per element with coef =
// g / B (B: the rows of the whole batch, all ranks), the loss terms when
// `loss`, G and the sums ds, dt when `gradient`.
struct SigmoidTerms {
  float bias = 0.0f;
  float coef = 0.0f;
  bool loss = false, gradient = false;
};

// Sums per row group (G entries each), added to by sigmoid_block: the loss
// terms (before the 1/B), ds and dt.
struct SigmoidGroupSums {
  double *loss = nullptr, *ds = nullptr, *dt = nullptr;
};

// Every tile of in.q x in.k (Inputs::row_offset / col_offset place it in the
// global batch): adds s G K into dq and (s G)^T Q into dk (either may be
// empty; both only with terms.gradient) and each tile's sums into `sums`
// [row group], in walk order: the same bits for any thread count.
void sigmoid_block(ThreadPool &pool, const Plan &plan, const Inputs &in, const SigmoidTerms &terms,
                   const Accumulator &dq, const Accumulator &dk,
                   const std::vector<ThreadScratch> &scratch, const SigmoidGroupSums &sums);

// dq_dtype / dk_dtype: nullptr when that gradient is not requested.
std::size_t sigmoid_workspace_bytes(const Plan &plan, Dtype input, const Dtype *dq_dtype,
                                    const Dtype *dk_dtype, int threads);

// The whole single-process call: outputs of `args` written at the end.
void sigmoid(ThreadPool &pool, const Plan &plan, const Inputs &in, const SigmoidArgs &args,
             void *workspace);

}  // namespace flatmem::contrastive::cpu
