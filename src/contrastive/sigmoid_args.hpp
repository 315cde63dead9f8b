// What one sigmoid (SigLIP) call computes, shared by every engine that runs
// it: the CPU tile walk (cpu/sigmoid.hpp), the CUDA tile kernels
// (cuda/backend.hpp), the panel engine (panels/cuda/engine.hpp) and the
// ring (ring/).
#pragma once

#include "contrastive/problem.hpp"

namespace flatmem::contrastive {

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

}  // namespace flatmem::contrastive
