// The ZeRO relay's schedule as closed forms (see "ZeRO relay" in
// flatmem/cyclic.h): shard ranges, versions, update time steps, when an owner
// contributes its shard to rank 0's gather, and the staging a rank needs.
// Pure arithmetic over the DP schedule (DELAY1), shared by the runtime, the
// accounting and the C queries.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "cyclic/schedule.hpp"

namespace flatmem::cyclic {

// A FORWARD or BACKWARD of one rank: the relay it needs.
struct RelayItem {
  std::int64_t time = 0;  // global time step of the action
  std::int32_t stage = 0;
  std::int64_t step = 0;
  bool forward = true;
  std::int64_t version() const { return step > 0 ? step - 1 : 0; }
};

struct RelayPlan {
  Schedule schedule;                     // DELAY1
  std::vector<std::int64_t> count;       // n_j, L entries

  // [begin, end) of stage j owned by `rank`: c = ceil(n / N).
  std::pair<std::int64_t, std::int64_t> shard(std::int32_t stage, std::int32_t rank) const;
  // T_upd(j, v) = 2L (v + 1) + 2L - 1 - j.
  std::int64_t update_time(std::int32_t stage, std::int64_t version) const;
  // The (stage, v) whose update falls on time step tau, if any (v < S).
  std::optional<std::pair<std::int32_t, std::int64_t>> update_at(std::int64_t tau) const;
  // Versions of stage j an owner holds inside flatmem_cyclic_next(tau): the
  // updates at time steps before tau, clamp(floor((tau + j) / 2L) - 1, 0, S).
  std::int64_t version_held(std::int32_t stage, std::int64_t tau) const;
  // The relay `rank` needs at time step tau (none when idle / past the end).
  std::optional<RelayItem> item(std::int32_t rank, std::int64_t tau) const;
  // The time step inside whose next() an owner sends its shard for rank 0's
  // gather at g: g - 1 when it already holds the version there, else g.
  std::int64_t contribution_time(const RelayItem &gather) const;
  // Time steps after its use that `rank` keeps a relay until rank + 1 posts
  // its receive (one step before its own use): offset(r+1) - offset(r) - 1,
  // at least 0; 0 for rank N-1 (it does not send on).
  std::int64_t kept_after_use(std::int32_t rank) const;
  // Staging buffers a rank needs: max(1, D) + 1, D = max_r offset(r+1) - offset(r).
  std::int64_t staging_buffers() const;
  // Largest n_j.
  std::int64_t largest() const;
  // Stage elements `rank` holds in staging during time step tau by the
  // protocol: relays posted (tau >= use - 1) and not yet taken
  // (tau <= use + kept_after_use).
  std::int64_t staged_elements(std::int32_t rank, std::int64_t tau) const;
};

}  // namespace flatmem::cyclic
