#include "cyclic/stages/accounting.hpp"

#include <algorithm>

#include "cyclic/kept.hpp"

namespace flatmem::cyclic::stages {

StageAccounting::StageAccounting(std::vector<std::int64_t> activation_bytes, std::int32_t stage,
                                 std::int64_t history, double steady_busy_fraction)
    : bytes_per_micro_batch_(activation_bytes[std::size_t(stage)]),
      ring_(static_cast<std::size_t>(history)) {
  totals_.steady_busy_fraction = steady_busy_fraction;
}

void StageAccounting::begin(std::int64_t tau, std::int32_t actions, std::int32_t held,
                            Clock::time_point now) {
  if (begun_ > 0)
    current().seconds = std::chrono::duration<double>(now - current_start_).count();
  else
    first_start_ = now;
  ++begun_;
  flatmem_cyclic_stages_time_step_stats &r = current();
  r = flatmem_cyclic_stages_time_step_stats{};
  r.time_step = tau;
  r.actions = actions;
  r.activations_held = held;
  r.activation_bytes = held * bytes_per_micro_batch_;
  current_start_ = now;
  busy_ += actions > 0;
  held_total_ += held;
  totals_.time_steps = begun_;
  totals_.actions += actions;
  totals_.peak_activations_held = std::max(totals_.peak_activations_held, held);
  totals_.peak_activation_bytes = std::max(totals_.peak_activation_bytes, r.activation_bytes);
}

void StageAccounting::sent(std::int64_t bytes) {
  totals_.bytes_sent += bytes;
  totals_.messages_sent += 1;
  if (begun_ == 0) return;
  flatmem_cyclic_stages_time_step_stats &r = current();
  r.bytes_sent += bytes;
  totals_.max_bytes_sent_per_time_step = std::max(totals_.max_bytes_sent_per_time_step, r.bytes_sent);
}

void StageAccounting::waited(double seconds) {
  totals_.wait_seconds += seconds;
  if (begun_ > 0) current().wait_seconds += seconds;
}

std::int64_t StageAccounting::copy(std::int64_t first, std::int64_t count,
                                   const StructArrayOut<flatmem_cyclic_stages_time_step_stats> &out) const {
  std::int64_t written = 0;
  for_kept(ring_, begun_, first, count, [&](std::size_t slot) { out.put(written++, ring_[slot]); });
  return written;
}

flatmem_cyclic_stages_summary StageAccounting::summary(Clock::time_point now) const {
  flatmem_cyclic_stages_summary s = totals_;
  if (begun_ > 0) {
    s.seconds = std::chrono::duration<double>(now - first_start_).count();
    s.busy_fraction = double(busy_) / double(begun_);
    s.mean_activations_held = double(held_total_) / double(begun_);
  }
  return s;
}

}  // namespace flatmem::cyclic::stages
