// Runs a relayed cyclic training (options.parameters = RELAYED) on `world`
// threads over an in-process communicator group: one handle per thread, the
// shards, losses and statistics of every rank.
#pragma once

#include <string>
#include <thread>
#include <vector>

#include "support/cyclic_train.hpp"

namespace test {

// A 3-stage model whose middle stage has 2 elements (empty shards for N = 3, 4).
inline TrainSetup tiny(std::int64_t steps) {
  TrainSetup s;
  s.widths = {3, 1, 1, 2};  // 4, 2, 4 elements
  s.steps = steps;
  s.rows = 2;
  return s;
}

// "world 3, widths 3 1 1 2 steps 4" for messages.
inline std::string describe(const TrainSetup &s, int world) {
  std::string w;
  for (int x : s.widths) w += std::to_string(x) + " ";
  return "world " + std::to_string(world) + ", widths " + w + "steps " + std::to_string(s.steps);
}

template <typename T>
struct RelayTraining {
  std::vector<RelayRun<T>> runs;
  std::vector<std::string> errors;  // per rank, "" = fine
  std::vector<std::vector<flatmem_cyclic_time_step_stats>> stats;
  std::vector<std::vector<flatmem_cyclic_relay_time_step>> relay_stats;
  std::vector<flatmem_cyclic_relay_summary> summaries;
  bool ok() const {
    for (const std::string &e : errors)
      if (!e.empty()) return false;
    return true;
  }
  std::string first_error() const {
    for (std::size_t r = 0; r < errors.size(); ++r)
      if (!errors[r].empty()) return "rank " + std::to_string(r) + ": " + errors[r];
    return "";
  }
};

// `hook(rank)` gives each rank's action hook (nullptr: none); `calls(rank)`
// each rank's relay calls (nullptr: the plain ones; see RelayCalls).
template <typename T>
RelayTraining<T> train_local_relayed(const TrainSetup &setup, int world, std::int64_t timeout_ms = 20000,
                                     const std::function<ActionHook(int)> &hook = nullptr,
                                     const std::function<RelayCalls(int)> &calls = nullptr) {
  RelayTraining<T> out;
  const auto n = std::size_t(world);
  for (int r = 0; r < world; ++r) out.runs.push_back(RelayRun<T>::initial(setup, r, world));
  out.errors.assign(n, "");
  out.stats.resize(n);
  out.relay_stats.resize(n);
  out.summaries.assign(n, flatmem_cyclic_relay_summary{});
  std::vector<flatmem_comm_t *> comms(n, nullptr);
  if (flatmem_comm_create_local(comms.data(), world, nullptr) != FLATMEM_STATUS_SUCCESS) {
    out.errors[0] = std::string("flatmem_comm_create_local: ") + flatmem_last_error();
    return out;
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      const std::size_t i = std::size_t(r);
      CyclicOptions o = relayed_options(setup, sizeof(T), timeout_ms);
      flatmem_cyclic_t *h = nullptr;
      if (flatmem_cyclic_create(&h, comms[i], &o.options) != FLATMEM_STATUS_SUCCESS) {
        out.errors[i] = std::string("flatmem_cyclic_create: ") + flatmem_last_error();
        return;
      }
      out.errors[i] = train_rank_relayed<T>(h, setup, r, world, out.runs[i], hook ? hook(r) : nullptr,
                                             calls ? calls(r) : RelayCalls{});
      flatmem_cyclic_summary summary{};
      flatmem_cyclic_summary_get(h, &summary, sizeof(flatmem_cyclic_summary));
      std::int64_t written = 0;
      out.stats[i].resize(std::size_t(summary.time_steps));
      flatmem_cyclic_stats(h, 0, summary.time_steps, out.stats[i].data(), sizeof(flatmem_cyclic_time_step_stats), &written);
      out.stats[i].resize(std::size_t(written));
      out.relay_stats[i].resize(std::size_t(summary.time_steps));
      flatmem_cyclic_relay_stats(h, 0, summary.time_steps, out.relay_stats[i].data(), sizeof(flatmem_cyclic_relay_time_step), &written);
      out.relay_stats[i].resize(std::size_t(written));
      flatmem_cyclic_relay_summary_get(h, &out.summaries[i], sizeof(flatmem_cyclic_relay_summary));
      flatmem_cyclic_destroy(h);
    });
  for (auto &t : threads) t.join();
  for (flatmem_comm_t *c : comms) flatmem_comm_destroy(c);
  return out;
}

}  // namespace test
