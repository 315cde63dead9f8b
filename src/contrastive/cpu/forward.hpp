// CPU forward and backward of the tiled contrastive loss.
#pragma once

#include "contrastive/cpu/logit_cache.hpp"
#include "contrastive/plan.hpp"
#include "contrastive/problem.hpp"
#include "core/thread_pool.hpp"

namespace flatmem::contrastive::cpu {

std::size_t forward_workspace_bytes(const Plan &plan, Loss loss, Dtype input, int threads);
std::size_t backward_workspace_bytes(const Plan &plan, Dtype input, const Dtype *dq_dtype,
                                     const Dtype *dk_dtype, int threads);

// Writes out.loss, out.row_lse and (symmetric) out.col_lse; fills the slots
// of `cache` with their raw logit tiles.
void forward(ThreadPool &pool, const Plan &plan, const Inputs &in, const ForwardOutputs &out,
             void *workspace, const CachedTiles &cache = {});

// Writes the requested gradients (args.dq / args.dk data non-null, args.dscale),
// reading the tiles `cache` holds (the forward's, on the same q and k).
void backward(ThreadPool &pool, const Plan &plan, const Inputs &in, const BackwardArgs &args,
              void *workspace, const CachedTiles &cache = {});

}  // namespace flatmem::contrastive::cpu
