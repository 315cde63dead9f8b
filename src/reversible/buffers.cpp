#include "reversible/buffers.hpp"

#include <algorithm>

#include "reversible/callbacks.hpp"

namespace flatmem::reversible {
namespace {

std::size_t aligned(std::size_t bytes) {
  const std::size_t a = WorkspaceCarver::alignment;
  return (bytes + a - 1) / a * a;
}

StatePair take_pair(WorkspaceCarver &w, const StateLayout &s) {
  StatePair p;
  p.a = w.take<char>(std::int64_t(s.bytes()));
  p.b = w.take<char>(std::int64_t(s.bytes()));
  return p;
}

}  // namespace

std::size_t ResidualPlan::g_offset(std::size_t block) const { return aligned(f[block]); }

ResidualPlan plan_residuals(const std::vector<flatmem_reversible_block> &blocks,
                            const StateLayout &s) {
  ResidualPlan r;
  r.f.resize(blocks.size());
  r.g.resize(blocks.size());
  for (std::size_t k = 0; k < blocks.size(); ++k) {
    r.f[k] = call_residual_size(blocks[k].f, std::int32_t(k), FLATMEM_REVERSIBLE_F, s);
    r.g[k] = call_residual_size(blocks[k].g, std::int32_t(k), FLATMEM_REVERSIBLE_G, s);
    // Each part is at most 2^62 bytes (call_residual_size); their sum must stay a
    // size the workspace arithmetic (signed 64-bit offsets) can hold.
    const std::size_t slot = aligned(r.f[k]) + aligned(r.g[k]);
    if (slot > (std::size_t(1) << 62))
      invalid("block ", k, ": residual_size of F (", r.f[k], " bytes) and G (", r.g[k],
              " bytes) together are beyond any memory");
    r.slot_bytes = std::max(r.slot_bytes, slot);
  }
  return r;
}

ForwardBuffers carve_forward(WorkspaceCarver &w, const StateLayout &s) {
  ForwardBuffers f;
  for (auto &slot : f.slots) slot = take_pair(w, s);
  return f;
}

BackwardBuffers carve_backward(WorkspaceCarver &w, const StateLayout &s, const ResidualPlan &r,
                               int state_slots, int residual_slots) {
  BackwardBuffers b;
  b.state_slots = state_slots;
  b.residual_slots = residual_slots;
  for (int i = 0; i < state_slots; ++i) b.states[i] = take_pair(w, s);
  b.gradients = take_pair(w, s);
  for (int i = 0; i < residual_slots; ++i) b.residuals[i] = w.take<char>(std::int64_t(r.slot_bytes));
  return b;
}

}  // namespace flatmem::reversible
