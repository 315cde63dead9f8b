// The CPU implementations of the built-in blocks, called by the callbacks
// (reversible/blocks/functions.cpp) after every argument was checked.
#pragma once

#include <cstddef>
#include <cstdint>

#include "reversible/blocks/cpu/parallel.hpp"

namespace flatmem::blocks::cpu {

// A state of `rows` = batch * tokens token rows of `width` floats, and the
// block's sizes.
struct BlockShape {
  std::int64_t batch = 1, tokens = 1, rows = 1, width = 1;
  std::int64_t heads = 1, head_dim = 1;  // attention
  std::int64_t hidden = 0;               // MLP
  float eps = 1e-6f;
};

// Parameters and their gradients in the header's order (gradients NULL in a
// forward).
struct BlockParameters {
  const float *value[6] = {};
  float *grad[6] = {};
};

// Pre-LN multi-head self-attention, F(x) = MHSA(LN(x)).
std::size_t attention_residual_bytes(const BlockShape &s);
void attention_forward(const Parallel &parallel, const BlockShape &s, const BlockParameters &p,
                       const float *x, float *y, void *residuals);
void attention_vjp(const Parallel &parallel, const BlockShape &s, const BlockParameters &p,
                   const float *x, const void *residuals, const float *dy, float *dx);

// Pre-LN MLP, G(x) = GELU(LN(x) W1 + b1) W2 + b2.
std::size_t mlp_residual_bytes(const BlockShape &s);
void mlp_forward(const Parallel &parallel, const BlockShape &s, const BlockParameters &p,
                 const float *x, float *y, void *residuals);
void mlp_vjp(const Parallel &parallel, const BlockShape &s, const BlockParameters &p,
             const float *x, const void *residuals, const float *dy, float *dx);

}  // namespace flatmem::blocks::cpu
