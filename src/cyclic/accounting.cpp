#include "cyclic/accounting.hpp"

#include <algorithm>

namespace flatmem::cyclic {

Accounting::Accounting(std::vector<std::int64_t> activation_bytes, std::int64_t history)
    : held_bytes_(activation_bytes.size() + 1, 0), ring_(static_cast<std::size_t>(history)) {
  for (std::size_t j = 0; j < activation_bytes.size(); ++j)
    held_bytes_[j + 1] = held_bytes_[j] + activation_bytes[j];
}

void Accounting::begin(const flatmem_cyclic_action &action, Clock::time_point now) {
  if (begun_ > 0) {
    current().seconds = std::chrono::duration<double>(now - current_start_).count();
  } else {
    first_start_ = now;
  }
  ++begun_;
  flatmem_cyclic_time_step_stats &r = current();
  r = flatmem_cyclic_time_step_stats{};
  r.time_step = action.time_step;
  r.kind = action.kind;
  r.stage = action.stage;
  r.step = action.step;
  r.activations_held = action.activations_held;
  r.activation_bytes = held_bytes_[std::size_t(action.activations_held)];
  if (auto early = ahead_.find(action.time_step); early != ahead_.end()) {
    r.bytes_scheduled = early->second;
    ahead_.erase(early);
  }
  current_start_ = now;
  totals_.time_steps = begun_;
  totals_.peak_activation_bytes = std::max(totals_.peak_activation_bytes, r.activation_bytes);
}

void Accounting::sent(std::int64_t bytes, std::int64_t scheduled) {
  totals_.bytes_sent += bytes;
  totals_.messages_sent += 1;
  if (begun_ == 0) return;  // before the first time step (cannot happen: sends follow a backward)
  // Record k is time step k (next() begins them one by one from 0).
  const std::int64_t kept = std::min<std::int64_t>(begun_, std::int64_t(ring_.size()));
  if (scheduled >= begun_ - kept && scheduled < begun_)
    ring_[std::size_t(scheduled) % ring_.size()].bytes_scheduled += bytes;
  else if (scheduled >= begun_)
    ahead_[scheduled] += bytes;
  flatmem_cyclic_time_step_stats &r = current();
  r.bytes_sent += bytes;
  totals_.max_bytes_sent_per_time_step =
      std::max(totals_.max_bytes_sent_per_time_step, r.bytes_sent);
}

void Accounting::waited(double seconds) {
  totals_.wait_seconds += seconds;
  if (begun_ > 0) current().wait_seconds += seconds;
}

std::int64_t Accounting::copy(std::int64_t first, std::int64_t count,
                              flatmem_cyclic_time_step_stats *out) const {
  const std::int64_t kept = std::min<std::int64_t>(begun_, std::int64_t(ring_.size()));
  std::int64_t written = 0;
  for (std::int64_t i = begun_ - kept; i < begun_; ++i) {
    const flatmem_cyclic_time_step_stats &r = ring_[std::size_t(i) % ring_.size()];
    if (r.time_step >= first && r.time_step - first < count) out[written++] = r;
  }
  return written;
}

flatmem_cyclic_summary Accounting::summary(Clock::time_point now) const {
  flatmem_cyclic_summary s = totals_;
  s.seconds = begun_ > 0 ? std::chrono::duration<double>(now - first_start_).count() : 0.0;
  return s;
}

}  // namespace flatmem::cyclic
