#include "cyclic/accounting.hpp"

#include <algorithm>
#include <cstring>

#include "cyclic/kept.hpp"

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

template <typename F>
void Accounting::for_kept(std::int64_t first, std::int64_t count, F f) const {
  cyclic::for_kept(ring_, begun_, first, count, f);
}

std::int64_t Accounting::copy(std::int64_t first, std::int64_t count,
                              const StructArrayOut<flatmem_cyclic_time_step_stats> &out) const {
  std::int64_t written = 0;
  for_kept(first, count, [&](std::size_t slot) { out.put(written++, ring_[slot]); });
  return written;
}

void Accounting::relay_scheduled(std::int64_t parameter_bytes) {
  if (relay_ring_.empty() || begun_ == 0) return;
  flatmem_cyclic_relay_time_step &r = relay_current();
  r = flatmem_cyclic_relay_time_step{};
  r.time_step = current().time_step;
  r.parameter_bytes_scheduled = parameter_bytes;
  relay_totals_.peak_parameter_bytes_scheduled =
      std::max(relay_totals_.peak_parameter_bytes_scheduled, parameter_bytes);
}

void Accounting::relay_held(std::int64_t parameter_bytes) {
  if (relay_ring_.empty() || begun_ == 0) return;
  flatmem_cyclic_relay_time_step &r = relay_current();
  r.parameter_bytes = std::max(r.parameter_bytes, parameter_bytes);
  relay_totals_.peak_parameter_bytes = std::max(relay_totals_.peak_parameter_bytes, parameter_bytes);
}

void Accounting::relay_sent(std::int64_t bytes) {
  relay_totals_.relay_bytes_sent += bytes;
  relay_totals_.relay_messages_sent += 1;
  if (!relay_ring_.empty() && begun_ > 0) relay_current().relay_bytes_sent += bytes;
}

std::int64_t Accounting::copy_relay(std::int64_t first, std::int64_t count,
                                    const StructArrayOut<flatmem_cyclic_relay_time_step> &out) const {
  if (relay_ring_.empty()) return 0;
  std::int64_t written = 0;
  for_kept(first, count, [&](std::size_t slot) { out.put(written++, relay_ring_[slot]); });
  return written;
}

void Accounting::relay_totals(flatmem_cyclic_relay_summary &summary) const {
  summary.peak_parameter_bytes = relay_totals_.peak_parameter_bytes;
  summary.peak_parameter_bytes_scheduled = relay_totals_.peak_parameter_bytes_scheduled;
  summary.relay_bytes_sent = relay_totals_.relay_bytes_sent;
  summary.relay_messages_sent = relay_totals_.relay_messages_sent;
}

flatmem_cyclic_summary Accounting::summary(Clock::time_point now) const {
  flatmem_cyclic_summary s = totals_;
  s.seconds = begun_ > 0 ? std::chrono::duration<double>(now - first_start_).count() : 0.0;
  return s;
}

}  // namespace flatmem::cyclic
