// Per-time-step statistics of one rank (flatmem_cyclic_stats): the schedule's
// activation accounting and the measured bytes sent, in a ring of the most
// recent `history` time steps, plus totals since create. Not thread-safe:
// the runtime guards it with its mutex.
#pragma once

#include <flatmem/cyclic.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <vector>

#include "core/abi_struct.hpp"

namespace flatmem::cyclic {

class Accounting {
 public:
  using Clock = std::chrono::steady_clock;

  // activation_bytes: L entries (bytes of stage j's activations).
  Accounting(std::vector<std::int64_t> activation_bytes, std::int64_t history);

  // A new time step begins now (closes the previous one).
  void begin(const flatmem_cyclic_action &action, Clock::time_point now);
  // Gradient bytes posted for sending during the current time step, which
  // the protocol assigns to time step `scheduled`. That step may not have
  // begun on this rank yet (NEWEST forwards an average as soon as it
  // arrives, by the clock of rank N-1): its bytes then wait for it.
  void sent(std::int64_t bytes, std::int64_t scheduled);
  void waited(double seconds);

  // Copies kept records with time_step in [first, first + count).
  std::int64_t copy(std::int64_t first, std::int64_t count, const StructArrayOut<flatmem_cyclic_time_step_stats> &out) const;
  flatmem_cyclic_summary summary(Clock::time_point now) const;

  // ZeRO relay records, kept beside the time-step records (same ring).
  // The protocol's parameter bytes of the current time step (at begin).
  void relay_enable() { relay_ring_.resize(ring_.size()); }
  void relay_scheduled(std::int64_t parameter_bytes);
  // Parameter bytes held now (the time step keeps the most).
  void relay_held(std::int64_t parameter_bytes);
  void relay_sent(std::int64_t bytes);
  // Element i at (char *)out + i * stride, min(stride, sizeof) bytes each.
  std::int64_t copy_relay(std::int64_t first, std::int64_t count,
                          const StructArrayOut<flatmem_cyclic_relay_time_step> &out) const;
  // Totals (peaks and bytes; the sizes are the runtime's).
  void relay_totals(flatmem_cyclic_relay_summary &summary) const;

 private:
  flatmem_cyclic_time_step_stats &current() { return ring_[std::size_t(begun_ - 1) % ring_.size()]; }
  flatmem_cyclic_relay_time_step &relay_current() { return relay_ring_[std::size_t(begun_ - 1) % ring_.size()]; }
  // Calls f(slot) for the kept records in [first, first + count), oldest first.
  template <typename F>
  void for_kept(std::int64_t first, std::int64_t count, F f) const;

  std::vector<std::int64_t> held_bytes_;  // [k] = bytes of stages 0 .. k-1
  std::vector<flatmem_cyclic_time_step_stats> ring_;
  std::int64_t begun_ = 0;  // records ever begun
  std::map<std::int64_t, std::int64_t> ahead_;  // bytes_scheduled of time steps not begun yet
  Clock::time_point current_start_{}, first_start_{};
  flatmem_cyclic_summary totals_{};
  std::vector<flatmem_cyclic_relay_time_step> relay_ring_;  // empty unless relayed
  flatmem_cyclic_relay_summary relay_totals_{};
};

}  // namespace flatmem::cyclic
