// Runs a cyclic training on `world` threads over an in-process communicator
// group (flatmem_comm_create_local): one handle per thread.
#pragma once

#include <string>
#include <thread>
#include <vector>

#include "support/cyclic_train.hpp"

namespace test {

template <typename T>
struct LocalTraining {
  std::vector<RankRun<T>> runs;
  std::vector<std::string> errors;        // per rank, "" = fine
  std::vector<flatmem_cyclic_summary> summaries;
  std::vector<std::vector<flatmem_cyclic_time_step_stats>> stats;
};

template <typename T>
LocalTraining<T> train_local(const TrainSetup &setup, int world, std::int64_t timeout_ms = 20000) {
  LocalTraining<T> out;
  out.runs.assign(std::size_t(world), RankRun<T>{StageMlp<T>::make(setup.widths, setup.seed), {}});
  out.errors.assign(std::size_t(world), "");
  out.summaries.assign(std::size_t(world), flatmem_cyclic_summary{});
  out.stats.resize(std::size_t(world));
  std::vector<flatmem_comm_t *> comms(std::size_t(world), nullptr);
  if (flatmem_comm_create_local(comms.data(), world, nullptr) != FLATMEM_STATUS_SUCCESS) {
    out.errors[0] = std::string("flatmem_comm_create_local: ") + flatmem_last_error();
    return out;
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      const std::size_t i = std::size_t(r);
      CyclicOptions o = cyclic_options(setup, sizeof(T), timeout_ms);
      flatmem_cyclic_t *h = nullptr;
      if (flatmem_cyclic_create(&h, comms[i], &o.options) != FLATMEM_STATUS_SUCCESS) {
        out.errors[i] = std::string("flatmem_cyclic_create: ") + flatmem_last_error();
        return;
      }
      out.errors[i] = train_rank<T>(h, setup, r, world, out.runs[i]);
      flatmem_cyclic_summary_get(h, &out.summaries[i], sizeof(flatmem_cyclic_summary));
      out.stats[i].resize(std::size_t(out.summaries[i].time_steps));
      std::int64_t written = 0;
      flatmem_cyclic_stats(h, 0, std::int64_t(out.stats[i].size()), out.stats[i].data(), sizeof(flatmem_cyclic_time_step_stats), &written);
      out.stats[i].resize(std::size_t(written));
      flatmem_cyclic_destroy(h);
    });
  for (auto &t : threads) t.join();
  for (flatmem_comm_t *c : comms) flatmem_comm_destroy(c);
  return out;
}

}  // namespace test
