// The three things the executor does to one block, on one chain. Every mode
// is a schedule of these; OVERLAPPED and VANILLA call exactly the same steps
// on the same inputs, which is why their results are bitwise equal.
#pragma once

#include <flatmem/flatmem.h>

#include <cstdint>

#include "reversible/buffers.hpp"
#include "reversible/chain.hpp"
#include "reversible/state.hpp"

namespace flatmem::reversible {

struct BlockCall {
  const flatmem_reversible_block *block = nullptr;
  std::int32_t index = 0;
  const StateLayout *state = nullptr;
  std::uint64_t seed = 0, offset = 0;
  // This block's residuals (F's at f, G's at g), or nulls (phase FORWARD).
  char *residual_f = nullptr, *residual_g = nullptr;
};

// Residual pointers of block k inside a slot laid out by `plan`.
void point_residuals(BlockCall &call, char *slot, const ResidualPlan &plan);

// (Y1, Y2) = block(X1, X2):  Y1 = X1 + F(X2),  Y2 = X2 + G(Y1).
void forward_block(Chain &chain, const BlockCall &call, flatmem_reversible_phase phase,
                   StatePair in, StatePair out);

// R_k, (X1, X2) from (Y1, Y2):  X2 = Y2 - G(Y1),  X1 = Y1 - F(X2), keeping
// G's and F's residuals for gradient_block.
void rebuild_block(Chain &chain, const BlockCall &call, StatePair out, StatePair in);

// B_k, in place on gradients (dA, dB) = (dY1, dY2):
//   dA += J_G(Y1)^T dB   -> dX1
//   dB += J_F(X2)^T dA   -> dX2
void gradient_block(Chain &chain, const BlockCall &call, const char *y1, const char *x2,
                    StatePair gradients);

}  // namespace flatmem::reversible
