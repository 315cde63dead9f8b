// The cyclic schedule as closed forms (see flatmem/cyclic.h): offsets, update
// delays, the action of any rank at any global time step. Pure arithmetic,
// shared by the C query functions, the runtime and the accounting.
#pragma once

#include <flatmem/cyclic.h>

#include <cstdint>

namespace flatmem::cyclic {

// The stagger: floor(index * 2L / count), index 0 .. count-1 -- rank `index` of
// `count` data-parallel ranks, or micro-batch `index` of `count` in the
// stage-parallel schedule (src/cyclic/stages/).
inline std::int64_t stagger_offset(std::int64_t index, std::int64_t count, std::int32_t stages) {
  return index * 2 * std::int64_t(stages) / count;
}

// NEWEST: 0 when the average of step s (complete the time step after the
// last-offset rank's backward of `stage`) arrives before the forward of `stage`
// in step s + 1 of the rank `gap` time steps earlier than the last one; else 1.
inline std::int32_t newest_delay(std::int64_t gap, std::int32_t stage) {
  return gap <= 2 * std::int64_t(stage) ? 0 : 1;
}

struct Schedule {
  std::int32_t world = 1;    // N
  std::int32_t stages = 1;   // L
  std::int64_t steps = 1;    // S
  flatmem_cyclic_rule rule = FLATMEM_CYCLIC_DELAY1;

  // Time steps per training step (2L).
  std::int64_t period() const { return 2 * std::int64_t(stages); }
  bool staggered() const { return rule != FLATMEM_CYCLIC_SYNC; }
  // floor(rank * 2L / N); 0 under SYNC.
  std::int64_t offset(std::int32_t rank) const;
  // 0 or 1: the average of step s is applied before stage's forward in step s + 1 + delay.
  std::int32_t delay(std::int32_t rank, std::int32_t stage) const;
  // Local time steps of `rank` up to and including its last update.
  std::int64_t local_length(std::int32_t rank) const;
  // Global time steps until every rank is done.
  std::int64_t length() const;
  flatmem_cyclic_action action(std::int32_t rank, std::int64_t time_step) const;
};

inline constexpr std::int32_t max_world = 1 << 20;
inline constexpr std::int32_t max_stages = 65535;
inline constexpr std::int64_t max_steps = std::int64_t(1) << 40;

// Checks ranges (INVALID_ARGUMENT naming `what`.field) and returns the schedule.
Schedule make_schedule(std::int32_t world, std::int32_t stages, std::int64_t steps,
                       std::int32_t rule, const char *what);
// what.steps in 1 .. 2^40 and what.rule a flatmem_cyclic_rule, else
// INVALID_ARGUMENT naming the field; returns the rule (shared by both schedules).
flatmem_cyclic_rule checked_steps_and_rule(std::int64_t steps, std::int32_t rule, const char *what);
// From the C struct (struct_size rules of the ABI).
Schedule read_schedule(const flatmem_cyclic_schedule *schedule);

}  // namespace flatmem::cyclic
