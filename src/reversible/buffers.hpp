// Where the executor keeps things. One layout function per use both measures
// (carver without base) and carves (carver over the workspace), so a size
// query and the call that uses the workspace cannot disagree.
//
// Backward memory, with S = one state tensor's bytes and R = the largest
// block's residuals (F's + G's):
//   VANILLA     2 states (4 S) + 2 gradients (2 S) + 1 residual slot (R)
//   OVERLAPPED  3 states (6 S) + 2 gradients (2 S) + 2 residual slots (2 R)
//   STANDARD    2 gradients (2 S); the forward kept (n + 1) states and n
//               blocks' residuals in handle memory.
// None of these grows with the number of blocks except STANDARD's record.
#pragma once

#include <flatmem/flatmem.h>

#include <array>
#include <cstddef>
#include <vector>

#include "core/workspace.hpp"
#include "reversible/state.hpp"

namespace flatmem::reversible {

// Residual bytes per block and how F's and G's share one slot.
struct ResidualPlan {
  std::vector<std::size_t> f, g;  // per block
  std::size_t slot_bytes = 0;     // max over blocks of aligned(f) + aligned(g)
  std::size_t g_offset(std::size_t block) const;
};

ResidualPlan plan_residuals(const std::vector<flatmem_reversible_block> &blocks,
                            const StateLayout &s);

// A state (X1, X2) or (Y1, Y2) held in two buffers.
struct StatePair {
  char *a = nullptr;  // stream 1: X1 / Y1
  char *b = nullptr;  // stream 2: X2 / Y2
};

struct ForwardBuffers {
  std::array<StatePair, 2> slots;
};
ForwardBuffers carve_forward(WorkspaceCarver &w, const StateLayout &s);

struct BackwardBuffers {
  int state_slots = 0, residual_slots = 0;
  std::array<StatePair, 3> states;
  StatePair gradients;  // (dA, dB): dY1 -> dX1, dY2 -> dX2 in place
  std::array<char *, 2> residuals{};
};
// state_slots 2 and residual_slots 1 for VANILLA, 3 and 2 for OVERLAPPED,
// 0 and 0 for STANDARD.
BackwardBuffers carve_backward(WorkspaceCarver &w, const StateLayout &s, const ResidualPlan &r,
                               int state_slots, int residual_slots);

}  // namespace flatmem::reversible
