// Segment forward (nothing kept) and STANDARD's recording forward.
#include "core/error.hpp"
#include "reversible/schedules.hpp"

namespace flatmem::reversible {

std::size_t forward_workspace_bytes(const StateLayout &s) {
  WorkspaceCarver measure;
  carve_forward(measure, s);
  return measure.bytes();
}

void forward(flatmem_reversible_t &h, Chain &chain, const StateLayout &s, const char *x1,
             const char *x2, Randomness rng, char *y1, char *y2, void *workspace) {
  WorkspaceCarver carver(workspace);
  const ForwardBuffers buffers = carve_forward(carver, s);
  // S_0 is the caller's input; S_{k+1} goes to slot k mod 2.
  StatePair current{const_cast<char *>(x1), const_cast<char *>(x2)};
  for (std::int32_t k = 0; k < h.size(); ++k) {
    const BlockCall call{&h.blocks[std::size_t(k)], k, &s, rng.seed, rng.offset};
    const StatePair next = buffers.slots[std::size_t(k % 2)];
    forward_block(chain, call, FLATMEM_REVERSIBLE_PHASE_FORWARD, current, next);
    current = next;
  }
  chain.copy(s, current.a, y1);
  chain.copy(s, current.b, y2);
}

void record_forward(flatmem_reversible_t &h, Chain &chain, const StateLayout &s,
                    const ResidualPlan &r, const char *x1, const char *x2, Randomness rng,
                    char *y1, char *y2) {
  Record &record = h.record;
  record.valid = false;
  const auto n = std::size_t(h.size());
  auto carve = [&](WorkspaceCarver &w) {
    record.states.resize(n + 1);
    record.residuals.resize(n);
    for (auto &state : record.states) {
      state.a = w.take<char>(std::int64_t(s.bytes()));
      state.b = w.take<char>(std::int64_t(s.bytes()));
    }
    for (auto &slot : record.residuals) slot = w.take<char>(std::int64_t(r.slot_bytes));
  };
  WorkspaceCarver measure;
  carve(measure);
  // Kept across forwards: a training loop's steady state allocates nothing.
  if (record.memory_bytes < measure.bytes() || record.memory_device.device_type != s.device.device_type ||
      record.memory_device.device_id != s.device.device_id) {
    record.memory.reset();
    record.memory_bytes = 0;
    record.memory = chain.allocate(measure.bytes(), "STANDARD mode's activations");
    record.memory_bytes = measure.bytes();
    record.memory_device = s.device;
  }
  WorkspaceCarver carver(record.memory.get());
  carve(carver);

  chain.copy(s, x1, record.states[0].a);
  chain.copy(s, x2, record.states[0].b);
  for (std::size_t k = 0; k < n; ++k) {
    BlockCall call{&h.blocks[k], std::int32_t(k), &s, rng.seed, rng.offset};
    point_residuals(call, record.residuals[k], r);
    forward_block(chain, call, FLATMEM_REVERSIBLE_PHASE_RECORD, record.states[k],
                  record.states[k + 1]);
  }
  chain.copy(s, record.states[n].a, y1);
  chain.copy(s, record.states[n].b, y2);
  record.layout = s;
  record.residual_plan = r;
  record.valid = true;
}

}  // namespace flatmem::reversible
