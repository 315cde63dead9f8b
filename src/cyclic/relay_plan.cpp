#include "cyclic/relay_plan.hpp"

#include <algorithm>

namespace flatmem::cyclic {

std::pair<std::int64_t, std::int64_t> RelayPlan::shard(std::int32_t stage, std::int32_t rank) const {
  const std::int64_t n = count[std::size_t(stage)], c = (n + schedule.world - 1) / schedule.world;
  return {std::min(rank * c, n), std::min((rank + 1) * c, n)};
}

std::int64_t RelayPlan::update_time(std::int32_t stage, std::int64_t version) const {
  const std::int64_t P = schedule.period();
  return P * (version + 1) + P - 1 - stage;
}

std::optional<std::pair<std::int32_t, std::int64_t>> RelayPlan::update_at(std::int64_t tau) const {
  // tau = P (v + 2) - 1 - j  <=>  tau + 1 + j = P (v + 2), 0 <= j < L.
  const std::int64_t P = schedule.period(), rest = (tau + 1) % P;
  const std::int64_t j = rest == 0 ? 0 : P - rest;
  if (j >= schedule.stages) return std::nullopt;
  const std::int64_t v = (tau + 1 + j) / P - 2;
  if (v < 0 || v >= schedule.steps) return std::nullopt;
  return std::make_pair(std::int32_t(j), v);
}

std::int64_t RelayPlan::version_held(std::int32_t stage, std::int64_t tau) const {
  // T_upd(j, v) < tau  <=>  P (v + 2) < tau + 1 + j  <=>  P (v + 2) <= tau + j
  // <=>  v <= floor((tau + j) / P) - 2: that many plus one versions past 0.
  const std::int64_t v = (tau + stage) / schedule.period() - 1;
  return std::clamp<std::int64_t>(v, 0, schedule.steps);
}

std::optional<RelayItem> RelayPlan::item(std::int32_t rank, std::int64_t tau) const {
  if (tau < 0) return std::nullopt;
  const flatmem_cyclic_action a = schedule.action(rank, tau);
  if (a.kind != FLATMEM_CYCLIC_FORWARD && a.kind != FLATMEM_CYCLIC_BACKWARD) return std::nullopt;
  return RelayItem{tau, a.stage, a.step, a.kind == FLATMEM_CYCLIC_FORWARD};
}

std::int64_t RelayPlan::contribution_time(const RelayItem &gather) const {
  const std::int64_t g = gather.time;
  return g > 0 && version_held(gather.stage, g - 1) == gather.version() ? g - 1 : g;
}

std::int64_t RelayPlan::kept_after_use(std::int32_t rank) const {
  if (rank + 1 >= schedule.world) return 0;
  return std::max<std::int64_t>(0, schedule.offset(rank + 1) - schedule.offset(rank) - 1);
}

std::int64_t RelayPlan::staging_buffers() const {
  std::int64_t gap = 1;
  for (std::int32_t r = 0; r + 1 < schedule.world; ++r)
    gap = std::max(gap, schedule.offset(r + 1) - schedule.offset(r));
  return gap + 1;
}

std::int64_t RelayPlan::largest() const { return *std::max_element(count.begin(), count.end()); }

std::int64_t RelayPlan::staged_elements(std::int32_t rank, std::int64_t tau) const {
  std::int64_t total = 0;
  for (std::int64_t use = tau - kept_after_use(rank); use <= tau + 1; ++use)
    if (const auto it = item(rank, use)) total += count[std::size_t(it->stage)];
  return total;
}

}  // namespace flatmem::cyclic
