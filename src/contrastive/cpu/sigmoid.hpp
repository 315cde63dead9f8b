// CPU driver of the sigmoid (SigLIP) loss: one Latin-square tile walk
// (tile_walk.hpp) per call gives the loss and/or the gradients; nothing is
// saved between calls.
#pragma once

#include "contrastive/plan.hpp"
#include "contrastive/problem.hpp"
#include "core/thread_pool.hpp"

namespace flatmem::contrastive::cpu {

// What one sigmoid call computes: loss (forward, value_and_grad) and any of the
// gradients, each times dloss (backward; 1 otherwise).
struct SigmoidArgs {
  float bias = 0.0f;           // t (CPU tensors only)
  float dloss = 1.0f;          // g (CPU tensors only)
  const float *bias_data = nullptr;   // where t lives (a device pointer on CUDA)
  const float *dloss_data = nullptr;  // where g lives, or nullptr: g = 1
  float *loss = nullptr;       // nullptr: not requested
  MatrixView dq, dk;           // data == nullptr: not requested
  float *dscale = nullptr;     // dL/ds, or nullptr
  float *dbias = nullptr;      // dL/dt, or nullptr
  bool wants_gradient() const { return dq.data || dk.data || dscale || dbias; }
};

// dq_dtype / dk_dtype: nullptr when that gradient is not requested.
std::size_t sigmoid_workspace_bytes(const Plan &plan, Dtype input, const Dtype *dq_dtype,
                                    const Dtype *dk_dtype, int threads);

void sigmoid(ThreadPool &pool, const Plan &plan, const Inputs &in, const SigmoidArgs &args,
             void *workspace);

}  // namespace flatmem::contrastive::cpu
