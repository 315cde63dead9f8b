// Per-time-step statistics of one stage rank (flatmem_cyclic_stages_stats):
// actions, activations held, bytes sent, time; a ring of the most recent
// `history` time steps plus totals. Not thread-safe (one caller thread).
#pragma once

#include <flatmem/cyclic_stages.h>

#include <chrono>
#include <cstdint>
#include <vector>

#include "core/abi_struct.hpp"

namespace flatmem::cyclic::stages {

class StageAccounting {
 public:
  using Clock = std::chrono::steady_clock;

  StageAccounting(std::vector<std::int64_t> activation_bytes_per_micro_batch, std::int32_t stage,
                  std::int64_t history, double steady_busy_fraction);

  // Time step `tau` begins now (closes the previous one).
  void begin(std::int64_t tau, std::int32_t actions, std::int32_t held, Clock::time_point now);
  void sent(std::int64_t bytes);
  void waited(double seconds);

  std::int64_t copy(std::int64_t first, std::int64_t count,
                    const StructArrayOut<flatmem_cyclic_stages_time_step_stats> &out) const;
  flatmem_cyclic_stages_summary summary(Clock::time_point now) const;

 private:
  flatmem_cyclic_stages_time_step_stats &current() { return ring_[std::size_t(begun_ - 1) % ring_.size()]; }

  std::int64_t bytes_per_micro_batch_;
  std::vector<flatmem_cyclic_stages_time_step_stats> ring_;
  std::int64_t begun_ = 0, busy_ = 0, held_total_ = 0;
  Clock::time_point current_start_{}, first_start_{};
  flatmem_cyclic_stages_summary totals_{};
};

}  // namespace flatmem::cyclic::stages
