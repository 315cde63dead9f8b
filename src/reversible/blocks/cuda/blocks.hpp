// The CUDA implementations of the built-in blocks, called by the callbacks
// (reversible/blocks/functions.cpp) after every argument was checked. All
// pointers are device memory of `call.device`; everything is enqueued on
// call.stream and nothing synchronises. Scratch: cudaMallocAsync on the
// stream from the device's current pool, cudaFreeAsync on the same stream.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "reversible/blocks/shape.hpp"

namespace flatmem::blocks::cuda {

struct DeviceCall {
  int device = 0;
  cudaStream_t stream = nullptr;
  bool tf32 = false;
};

// Pre-LN multi-head self-attention, F(x) = MHSA(LN(x)).
std::size_t attention_residual_bytes(const BlockShape &s);
void attention_forward(const DeviceCall &call, const BlockShape &s, const BlockParameters &p, const float *x,
                       float *y, void *residuals);
void attention_vjp(const DeviceCall &call, const BlockShape &s, const BlockParameters &p, const float *x,
                   const void *residuals, const float *dy, float *dx);

// Pre-LN MLP, G(x) = GELU(LN(x) W1 + b1) W2 + b2.
std::size_t mlp_residual_bytes(const BlockShape &s);
void mlp_forward(const DeviceCall &call, const BlockShape &s, const BlockParameters &p, const float *x,
                 float *y, void *residuals);
void mlp_vjp(const DeviceCall &call, const BlockShape &s, const BlockParameters &p, const float *x,
             const void *residuals, const float *dy, float *dx);

}  // namespace flatmem::blocks::cuda
