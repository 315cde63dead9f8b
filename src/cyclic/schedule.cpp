#include "cyclic/schedule.hpp"

#include <algorithm>

#include "core/error.hpp"
#include "core/options.hpp"

namespace flatmem::cyclic {

std::int64_t Schedule::offset(std::int32_t rank) const {
  if (!staggered()) return 0;
  return stagger_offset(rank, world, stages);
}

std::int32_t Schedule::delay(std::int32_t rank, std::int32_t stage) const {
  switch (rule) {
    case FLATMEM_CYCLIC_SYNC: return 0;
    case FLATMEM_CYCLIC_NEWEST:
      // The chain of stage j in step s completes (in schedule time) the time
      // step after rank N-1's backward of j: offset(N-1) + (s+1)2L - j. The
      // rank needs it at its forward of j in step s+1: offset(r) + (s+1)2L + j.
      return newest_delay(offset(world - 1) - offset(rank), stage);
    default: return 1;
  }
}

std::int64_t Schedule::local_length(std::int32_t rank) const {
  // The last update of stage j is the average of step S-1, before the forward
  // slot of j in step S + delay(j). Delays are 1 for the stages below some
  // bound and 0 above it (NEWEST), so the latest such slot is that of the
  // highest stage with delay 1 in step S + 1, else that of stage L-1 in step S.
  std::int32_t highest_delayed = -1;
  if (rule == FLATMEM_CYCLIC_DELAY1) {
    highest_delayed = stages - 1;
  } else if (rule == FLATMEM_CYCLIC_NEWEST) {
    const std::int64_t gap = offset(world - 1) - offset(rank);  // delay 1 iff 2j < gap
    highest_delayed = std::int32_t(std::min<std::int64_t>(stages - 1, (gap + 1) / 2 - 1));
  }
  if (highest_delayed >= 0) return (steps + 1) * period() + highest_delayed + 1;
  return steps * period() + stages;
}

std::int64_t Schedule::length() const {
  std::int64_t total = 0;
  for (std::int32_t r = 0; r < world; ++r) total = std::max(total, offset(r) + local_length(r));
  return total;
}

flatmem_cyclic_action Schedule::action(std::int32_t rank, std::int64_t time_step) const {
  flatmem_cyclic_action a{};
  a.time_step = time_step;
  a.kind = FLATMEM_CYCLIC_IDLE;
  a.stage = -1;
  a.step = -1;
  a.update_stage = -1;
  a.update_step = -1;
  a.activations_held = 0;
  a.phase = -1;
  const std::int64_t t = time_step - offset(rank);
  if (t < 0) return a;
  if (t >= local_length(rank)) {
    a.kind = time_step >= length() ? FLATMEM_CYCLIC_DONE : FLATMEM_CYCLIC_IDLE;
    return a;
  }
  const std::int64_t s = t / period();
  const auto p = std::int32_t(t % period());
  if (p < stages) {
    // The forward slot of stage p carries its update, also after the last step.
    const std::int64_t u = s - 1 - delay(rank, p);
    if (u >= 0 && u < steps) {
      a.update_stage = p;
      a.update_step = u;
    }
  }
  if (s >= steps) return a;
  a.step = s;
  a.phase = p;
  a.kind = p < stages ? FLATMEM_CYCLIC_FORWARD : FLATMEM_CYCLIC_BACKWARD;
  a.stage = p < stages ? p : std::int32_t(period() - 1 - p);
  a.activations_held = a.stage + 1;
  return a;
}

Schedule make_schedule(std::int32_t world, std::int32_t stages, std::int64_t steps,
                       std::int32_t rule, const char *what) {
  if (world < 1 || world > max_world)
    invalid(what, ".world_size: ", world, "; expected 1 .. ", max_world);
  if (stages < 1 || stages > max_stages)
    invalid(what, ".stages: ", stages, "; expected 1 .. ", max_stages);
  Schedule s;
  s.world = world;
  s.stages = stages;
  s.steps = steps;
  s.rule = checked_steps_and_rule(steps, rule, what);
  return s;
}

flatmem_cyclic_rule checked_steps_and_rule(std::int64_t steps, std::int32_t rule, const char *what) {
  if (steps < 1 || steps > max_steps) invalid(what, ".steps: ", steps, "; expected 1 .. 2^40");
  if (rule != FLATMEM_CYCLIC_DELAY1 && rule != FLATMEM_CYCLIC_NEWEST && rule != FLATMEM_CYCLIC_SYNC)
    invalid(what, ".rule: ", rule,
            "; expected FLATMEM_CYCLIC_DELAY1 (0), FLATMEM_CYCLIC_NEWEST (1) or FLATMEM_CYCLIC_SYNC (2)");
  return flatmem_cyclic_rule(rule);
}

Schedule read_schedule(const flatmem_cyclic_schedule *schedule) {
  if (schedule == nullptr) invalid("schedule: NULL");
  const auto o = read_sized(schedule, "schedule", "FLATMEM_CYCLIC_SCHEDULE_INIT or flatmem_cyclic_get_schedule");
  return make_schedule(o.world_size, o.stages, o.steps, enum_value(o.rule), "schedule");
}

}  // namespace flatmem::cyclic
