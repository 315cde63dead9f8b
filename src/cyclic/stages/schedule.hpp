// The stage-parallel schedule as closed forms (see flatmem/cyclic_stages.h):
// when stage j runs micro-batch m's forward and backward of step s, which
// parameter version each uses, how many versions a stage keeps, its
// occupancy. Pure arithmetic; the offsets and NEWEST delays are the
// data-parallel schedule's (src/cyclic/schedule.hpp).
#pragma once

#include <flatmem/cyclic_stages.h>

#include <cstdint>
#include <vector>

namespace flatmem::cyclic::stages {

inline constexpr std::int32_t max_stages = 65535;
inline constexpr std::int32_t max_micro_batches = 65535;

struct StageSchedule {
  std::int32_t stages = 1;         // L
  std::int32_t micro_batches = 1;  // N
  std::int64_t steps = 1;          // S
  flatmem_cyclic_rule rule = FLATMEM_CYCLIC_DELAY1;

  // floor(m 2L / N), under every rule.
  std::int64_t offset(std::int32_t m) const;
  // 2L; SYNC: 2L + offset(N-1).
  std::int64_t period() const;
  // 0 (SYNC), 1 (DELAY1), the data-parallel NEWEST delay of rank m of N.
  std::int32_t delay(std::int32_t m, std::int32_t stage) const;
  // max(0, s - delay(m, stage)).
  std::int64_t version(std::int32_t m, std::int32_t stage, std::int64_t s) const;
  // F(j, m, s) and B(j, m, s).
  std::int64_t forward_time(std::int32_t stage, std::int32_t m, std::int64_t s) const;
  std::int64_t backward_time(std::int32_t stage, std::int32_t m, std::int64_t s) const;
  // The first micro-batch with delay 0 at the stage (N if none).
  std::int32_t first_undelayed(std::int32_t stage) const;
  std::int32_t versions_kept(std::int32_t stage) const;
  // The time step of the stage's update-only actions: B(j, N-1, S-1) + 1.
  std::int64_t tail_time(std::int32_t stage) const;
  std::int64_t length() const;  // tail_time(0) + 1
  // The stage's actions at tau, in order (empty at and after its tail unless
  // tau is the tail time step).
  std::vector<flatmem_cyclic_stages_action> actions(std::int32_t stage, std::int64_t tau) const;
  std::int32_t activations_held(std::int32_t stage, std::int64_t tau) const;
  flatmem_cyclic_stages_occupancy occupancy(std::int32_t stage) const;

 private:
  // Micro-batches m with offset(m) == o: [first, end).
  void group(std::int64_t o, std::int32_t &first, std::int32_t &end) const;
  flatmem_cyclic_stages_action make(std::int64_t tau, flatmem_cyclic_action_kind kind,
                                    std::int32_t stage, std::int32_t m, std::int64_t s) const;
};

// Checks ranges (INVALID_ARGUMENT naming `what`.field).
StageSchedule make_stage_schedule(std::int32_t stages, std::int32_t micro_batches,
                                  std::int64_t steps, std::int32_t rule, const char *what);
StageSchedule read_stage_schedule(const flatmem_cyclic_stages_schedule *schedule);

}  // namespace flatmem::cyclic::stages
