// The CPU implementations of the built-in blocks, called by the callbacks
// (reversible/blocks/functions.cpp) after every argument was checked.
#pragma once

#include <cstddef>
#include <cstdint>

#include "reversible/blocks/cpu/parallel.hpp"
#include "reversible/blocks/shape.hpp"

namespace flatmem::blocks::cpu {

using blocks::BlockParameters;
using blocks::BlockShape;

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
