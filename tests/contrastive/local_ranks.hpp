// Ranks as threads over an in-process communicator group
// (flatmem_comm_create_local), for the ring tests.
#pragma once

#include <doctest/doctest.h>
#include <flatmem/flatmem.h>

#include <functional>
#include <thread>
#include <vector>

#include "support/contrastive.hpp"

namespace ring_test {

// world_size local communicators, destroyed at scope exit.
struct LocalGroup {
  std::vector<flatmem_comm_t *> comms;
  explicit LocalGroup(int world, long timeout_ms = 20000) : comms(std::size_t(world)) {
    flatmem_comm_options o = FLATMEM_COMM_OPTIONS_INIT;
    o.timeout_ms = timeout_ms;
    const flatmem_status s = flatmem_comm_create_local(comms.data(), world, &o);
    REQUIRE_MESSAGE(s == FLATMEM_STATUS_SUCCESS, flatmem_test::describe(s));
  }
  ~LocalGroup() {
    for (flatmem_comm_t *c : comms) flatmem_comm_destroy(c);
  }
  LocalGroup(const LocalGroup &) = delete;
  LocalGroup &operator=(const LocalGroup &) = delete;
};

// body(rank) on one thread per rank; results in rank order.
template <typename Result>
std::vector<Result> on_ranks(int world, const std::function<Result(int)> &body) {
  std::vector<Result> results(static_cast<std::size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) threads.emplace_back([&, r] { results[std::size_t(r)] = body(r); });
  for (auto &t : threads) t.join();
  return results;
}

}  // namespace ring_test
