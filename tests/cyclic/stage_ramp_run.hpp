// A stage world of 1 (L = 1: no boundaries) driven with the ramp gradients of
// ramp_run.hpp: micro-batch m of step s hands over ramp(m, 0, s) (several
// thousand elements: the device kernels run more than one block), and every
// average the handle offers is recorded. The stage handle's average is the
// data-parallel one with micro-batches for ranks, ((g_0 + g_1) + ...) * 1/N,
// so a host run compares bitwise with ramp_average(N, 0, s)
// (test_cyclic_stages_memory.cpp) and a device run with the host run
// (gpu/test_gpu_cyclic_stages.cpp). Buffers: RampBuffers with one stage,
// (0, 0) the gradient, (0, 1) the average's `out`.
#pragma once

#include <string>
#include <vector>

#include "cyclic/ramp_run.hpp"
#include "support/stage_train.hpp"

namespace test {

// Options of a world of 1 with N micro-batches (the boundaries: none).
inline StageOptions stage_ramp_options(flatmem_cyclic_rule rule, int micro_batches, std::int64_t steps,
                                       std::int64_t timeout_ms) {
  StageOptions o = stage_options(mlp_setup(1, steps, rule), micro_batches, sizeof(double), timeout_ms);
  return o;
}

// Drives `h` (a world of 1) to DONE. "" or what failed.
template <typename T>
std::string run_stage_ramp(flatmem_cyclic_stages_t *h, RampBuffers<T> &buffers, std::vector<RampUpdate<T>> &updates) {
  for (;;) {
    flatmem_cyclic_stages_action a{};
    flatmem_status s = flatmem_cyclic_stages_next(h, &a, sizeof(flatmem_cyclic_stages_action));
    if (s != FLATMEM_STATUS_SUCCESS) return call_failed("flatmem_cyclic_stages_next", s);
    if (a.kind == FLATMEM_CYCLIC_DONE) return "";
    if (a.update_step >= 0) {
      s = flatmem_cyclic_stages_average(h, buffers.tensor(0, 1));
      if (s != FLATMEM_STATUS_SUCCESS) return call_failed("flatmem_cyclic_stages_average", s);
      updates.push_back(RampUpdate<T>{0, a.update_step, buffers.read(0, 1)});
    }
    if (a.receives || a.sends) return "a world of 1 moved a boundary tensor";
    if (a.kind == FLATMEM_CYCLIC_BACKWARD) {
      buffers.write(0, 0, ramp<T>(a.micro_batch, 0, a.step));
      s = flatmem_cyclic_stages_accumulate(h, buffers.tensor(0, 0));
      if (s != FLATMEM_STATUS_SUCCESS) return call_failed("flatmem_cyclic_stages_accumulate", s);
    }
  }
}

// One average per step 0 .. steps-1, in step order: "" or what is missing.
template <typename T>
std::string stage_ramp_complete(const std::vector<RampUpdate<T>> &updates, std::int64_t steps) {
  if (std::int64_t(updates.size()) != steps)
    return std::to_string(updates.size()) + " averages, expected " + std::to_string(steps);
  for (std::size_t k = 0; k < updates.size(); ++k)
    if (updates[k].step != std::int64_t(k))
      return "average " + std::to_string(k) + " is of step " + std::to_string(updates[k].step);
  return "";
}

}  // namespace test
