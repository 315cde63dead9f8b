#include "cyclic/stages/schedule.hpp"

#include <algorithm>

#include "core/error.hpp"
#include "core/options.hpp"
#include "cyclic/schedule.hpp"

namespace flatmem::cyclic::stages {

std::int64_t StageSchedule::offset(std::int32_t m) const { return stagger_offset(m, micro_batches, stages); }

std::int64_t StageSchedule::period() const {
  const std::int64_t p = 2 * std::int64_t(stages);
  return rule == FLATMEM_CYCLIC_SYNC ? p + offset(micro_batches - 1) : p;
}

std::int32_t StageSchedule::delay(std::int32_t m, std::int32_t stage) const {
  switch (rule) {
    case FLATMEM_CYCLIC_SYNC: return 0;
    case FLATMEM_CYCLIC_NEWEST: return newest_delay(offset(micro_batches - 1) - offset(m), stage);
    default: return 1;
  }
}

std::int64_t StageSchedule::version(std::int32_t m, std::int32_t stage, std::int64_t s) const {
  return std::max<std::int64_t>(0, s - delay(m, stage));
}

std::int64_t StageSchedule::forward_time(std::int32_t stage, std::int32_t m, std::int64_t s) const {
  return offset(m) + period() * s + stage;
}

std::int64_t StageSchedule::backward_time(std::int32_t stage, std::int32_t m, std::int64_t s) const {
  return offset(m) + period() * s + 2 * std::int64_t(stages) - 1 - stage;
}

std::int32_t StageSchedule::first_undelayed(std::int32_t stage) const {
  // Delays are non-increasing in m (offsets grow): the first 0, if any.
  std::int32_t lo = 0, hi = micro_batches;
  while (lo < hi) {
    const std::int32_t mid = lo + (hi - lo) / 2;
    if (delay(mid, stage) == 0)
      hi = mid;
    else
      lo = mid + 1;
  }
  return lo;
}

std::int32_t StageSchedule::versions_kept(std::int32_t stage) const {
  // 2 iff the last use of some version v comes after the first use of v + 1
  // (a backward after a forward in the same time step comes first).
  const std::int64_t L2 = 2 * std::int64_t(stages), j2 = 2 * std::int64_t(stage);
  const std::int32_t m0 = first_undelayed(stage), n = micro_batches;
  if (m0 == n)  // version v: steps v+1 (all); first use of v+1: F(j, 0, v+2); last of v: B(j, N-1, v+1)
    return steps >= 3 && offset(n - 1) > period() - L2 + 1 + j2 ? 2 : 1;
  if (m0 == 0) return 1;  // last use of v: B(j, N-1, v) < first use of v+1: F(j, 0, v+1)
  // Version v: step v from m0 on, step v+1 before m0; first use of v+1: F(j, m0, v+1).
  return steps >= 2 && offset(m0) - offset(m0 - 1) < L2 - 1 - j2 ? 2 : 1;
}

std::int64_t StageSchedule::tail_time(std::int32_t stage) const {
  return backward_time(stage, micro_batches - 1, steps - 1) + 1;
}

std::int64_t StageSchedule::length() const { return tail_time(0) + 1; }

void StageSchedule::group(std::int64_t o, std::int32_t &first, std::int32_t &end) const {
  // floor(m 2L / N) == o  <=>  ceil(o N / 2L) <= m < ceil((o+1) N / 2L)
  const std::int64_t n = micro_batches, l2 = 2 * std::int64_t(stages);
  first = std::int32_t(std::min(n, (o * n + l2 - 1) / l2));
  end = std::int32_t(std::min(n, ((o + 1) * n + l2 - 1) / l2));
}

flatmem_cyclic_stages_action StageSchedule::make(std::int64_t tau, flatmem_cyclic_action_kind kind,
                                                 std::int32_t stage, std::int32_t m,
                                                 std::int64_t s) const {
  flatmem_cyclic_stages_action a{};
  a.time_step = tau;
  a.kind = kind;
  a.stage = stage;
  a.micro_batch = m;
  a.step = s;
  a.version = version(m, stage, s);
  a.update_step = -1;
  const bool forward = kind == FLATMEM_CYCLIC_FORWARD;
  if (forward && a.version >= 1) {
    // The first use of a version: micro-batch m0 of its step, or (no
    // undelayed micro-batch) micro-batch 0 of the step after.
    const std::int32_t m0 = first_undelayed(stage);
    if ((m0 < micro_batches && m == m0) || (m0 == micro_batches && m == 0)) a.update_step = a.version - 1;
  }
  a.receives = forward ? stage > 0 : stage + 1 < stages;
  a.sends = forward ? stage + 1 < stages : stage > 0;
  a.accumulates = forward ? 0 : 1;
  return a;
}

std::vector<flatmem_cyclic_stages_action> StageSchedule::actions(std::int32_t stage,
                                                                 std::int64_t tau) const {
  std::vector<flatmem_cyclic_stages_action> out;
  if (tau == tail_time(stage)) {
    // Update-only actions: the versions after the last one used, up to S.
    const std::int64_t used = std::max<std::int64_t>(0, steps - 1 - delay(micro_batches - 1, stage));
    for (std::int64_t v = used; v < steps; ++v) {
      flatmem_cyclic_stages_action a{};
      a.time_step = tau;
      a.kind = FLATMEM_CYCLIC_IDLE;
      a.stage = stage;
      a.micro_batch = -1;
      a.step = -1;
      a.version = -1;
      a.update_step = v;
      out.push_back(a);
    }
  }
  const std::int64_t p = period(), last_offset = offset(micro_batches - 1);
  // Backwards first, then forwards; each (one step at most: offsets < P) by micro-batch.
  for (const auto kind : {FLATMEM_CYCLIC_BACKWARD, FLATMEM_CYCLIC_FORWARD}) {
    const std::int64_t phase = kind == FLATMEM_CYCLIC_FORWARD ? stage : 2 * std::int64_t(stages) - 1 - stage;
    const std::int64_t t = tau - phase;
    if (t < 0) continue;
    const std::int64_t s = t / p, o = t % p;
    if (s >= steps || o > last_offset) continue;
    std::int32_t first = 0, end = 0;
    group(o, first, end);
    for (std::int32_t m = first; m < end; ++m) out.push_back(make(tau, kind, stage, m, s));
  }
  const std::int32_t held = out.empty() ? 0 : activations_held(stage, tau);
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i].index_in_time_step = std::int32_t(i);
    out[i].actions_in_time_step = std::int32_t(out.size());
    out[i].activations_held = held;
  }
  return out;
}

std::int32_t StageSchedule::activations_held(std::int32_t stage, std::int64_t tau) const {
  // Micro-batch m holds during F(j, m, s) <= tau <= B(j, m, s): 2L - 2j time
  // steps of each period, so at most one step s per micro-batch.
  const std::int64_t p = period(), window = 2 * std::int64_t(stages) - 2 * std::int64_t(stage);
  std::int32_t held = 0;
  for (std::int32_t m = 0; m < micro_batches; ++m) {
    const std::int64_t t = tau - offset(m) - stage;
    if (t < 0) break;  // offsets grow with m
    if (t / p < steps && t % p < window) ++held;
  }
  return held;
}

flatmem_cyclic_stages_occupancy StageSchedule::occupancy(std::int32_t stage) const {
  // One period of the infinite schedule: every micro-batch's forward and
  // backward residue mod P, and its holding window [F, B] folded mod P.
  const std::int64_t p = period(), window = 2 * std::int64_t(stages) - 2 * std::int64_t(stage);
  std::vector<std::int32_t> actions(static_cast<std::size_t>(p), 0);
  std::vector<std::int64_t> held_delta(static_cast<std::size_t>(2 * p + 1), 0);
  for (std::int32_t m = 0; m < micro_batches; ++m) {
    const std::int64_t f = offset(m) + stage, b = offset(m) + 2 * std::int64_t(stages) - 1 - stage;
    ++actions[std::size_t(f % p)];
    ++actions[std::size_t(b % p)];
    ++held_delta[std::size_t(f)];
    --held_delta[std::size_t(f + window)];
  }
  flatmem_cyclic_stages_occupancy o{};
  std::int64_t busy = 0, running = 0;
  std::vector<std::int64_t> held(static_cast<std::size_t>(p), 0);
  for (std::int64_t t = 0; t < 2 * p; ++t) {
    running += held_delta[std::size_t(t)];
    held[std::size_t(t % p)] += running;
  }
  std::int64_t total = 0;
  for (std::int64_t t = 0; t < p; ++t) {
    busy += actions[std::size_t(t)] > 0;
    o.peak_actions = std::max(o.peak_actions, actions[std::size_t(t)]);
    o.peak_activations_held = std::max(o.peak_activations_held, std::int32_t(held[std::size_t(t)]));
    total += held[std::size_t(t)];
  }
  o.busy_fraction = double(busy) / double(p);
  o.mean_activations_held = double(total) / double(p);
  return o;
}

StageSchedule make_stage_schedule(std::int32_t stages, std::int32_t micro_batches, std::int64_t steps,
                                  std::int32_t rule, const char *what) {
  if (stages < 1 || stages > max_stages)
    invalid(what, ".stages: ", stages, "; expected 1 .. ", max_stages);
  if (micro_batches < 1 || micro_batches > max_micro_batches)
    invalid(what, ".micro_batches: ", micro_batches, "; expected 1 .. ", max_micro_batches);
  StageSchedule s;
  s.stages = stages;
  s.micro_batches = micro_batches;
  s.steps = steps;
  s.rule = checked_steps_and_rule(steps, rule, what);
  return s;
}

StageSchedule read_stage_schedule(const flatmem_cyclic_stages_schedule *schedule) {
  if (schedule == nullptr) invalid("schedule: NULL");
  const auto o = read_sized(schedule, "schedule", "FLATMEM_CYCLIC_STAGES_SCHEDULE_INIT or flatmem_cyclic_stages_get_schedule");
  return make_stage_schedule(o.stages, o.micro_batches, o.steps, enum_value(o.rule), "schedule");
}

}  // namespace flatmem::cyclic::stages
