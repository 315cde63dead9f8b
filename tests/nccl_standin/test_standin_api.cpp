// The NCCL stand-in's C entry points on the CPU: the library's nccl_api.cpp
// over the host executor (host buffers; ranks are threads), driven as
// flatmem's transport drives NCCL: non-blocking calls settled by polling
// ncclCommGetAsyncError. The CUDA executor runs in the GPU tests.
#include <doctest/doctest.h>
#include <nccl.h>

#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "nccl_standin/host_executor.hpp"

namespace nccl_standin {
Executor &library_executor() {
  static HostExecutor host;
  return host;
}
}  // namespace nccl_standin

namespace {

using namespace std::chrono_literals;

// The state of `comm` once `issued` (a call's result) has settled.
ncclResult_t settle(ncclComm_t comm, ncclResult_t issued) {
  if (issued != ncclSuccess && issued != ncclInProgress) return issued;
  const auto until = std::chrono::steady_clock::now() + 10s;
  ncclResult_t state = ncclInProgress;
  while (ncclCommGetAsyncError(comm, &state) == ncclSuccess && state == ncclInProgress &&
         std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(100us);
  return state;
}

// n ranks of one fresh unique id, each initialised on its own thread.
std::vector<ncclComm_t> init_ranks(int n) {
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  std::vector<ncclComm_t> comms(static_cast<std::size_t>(n), nullptr);
  std::vector<ncclResult_t> results(static_cast<std::size_t>(n), ncclInternalError);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 0;
      const auto i = std::size_t(r);
      results[i] = ncclCommInitRankConfig(&comms[i], n, id, r, &config);
      if (results[i] == ncclSuccess || results[i] == ncclInProgress) results[i] = settle(comms[i], results[i]);
    });
  for (std::thread &t : threads) t.join();
  for (ncclResult_t r : results) REQUIRE(r == ncclSuccess);
  return comms;
}

void on_threads(int n, const std::function<void(int)> &body) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(body, r);
  for (std::thread &t : threads) t.join();
}

bool has(const char *text, const char *part) { return text != nullptr && std::string(text).find(part) != std::string::npos; }

}  // namespace

TEST_CASE("nccl-stand-in/api: version and error strings name the stand-in") {
  int version = 0;
  CHECK(ncclGetVersion(&version) == ncclSuccess);
  CHECK(version == NCCL_VERSION_CODE);
  CHECK(version >= 21900);  // flatmem's minimum
  CHECK(has(ncclGetErrorString(ncclRemoteError), "stand-in"));
}

TEST_CASE("nccl-stand-in/api: a ring exchange in a group and an all-reduce, as flatmem issues them (3 ranks)") {
  constexpr int n = 3;
  std::vector<ncclComm_t> comms = init_ranks(n);
  std::vector<double> out(n), in(n, -1.0), sums(n);
  std::vector<ncclResult_t> ring(n), reduced(n);
  on_threads(n, [&](int r) {
    const auto i = std::size_t(r);
    out[i] = 1.5 * (r + 1);
    ncclComm_t c = comms[i];
    CHECK(ncclGroupStart() == ncclSuccess);
    CHECK(ncclSend(&out[i], sizeof(double), ncclUint8, (r + 1) % n, c, nullptr) == ncclSuccess);
    CHECK(ncclRecv(&in[i], sizeof(double), ncclUint8, (r + n - 1) % n, c, nullptr) == ncclSuccess);
    ring[i] = settle(c, ncclGroupEnd());
    sums[i] = out[i];
    reduced[i] = settle(c, ncclAllReduce(&sums[i], &sums[i], 1, ncclFloat64, ncclSum, c, nullptr));
  });
  for (int r = 0; r < n; ++r) {
    CAPTURE(r);
    const auto i = std::size_t(r);
    CHECK(ring[i] == ncclSuccess);
    CHECK(reduced[i] == ncclSuccess);
    CHECK(in[i] == out[std::size_t((r + n - 1) % n)]);
    CHECK(sums[i] == (1.5 + 3.0) + 4.5);
  }
  for (ncclComm_t c : comms) {
    CHECK(ncclCommFinalize(c) == ncclSuccess);
    CHECK(settle(c, ncclSuccess) == ncclSuccess);
    CHECK(ncclCommDestroy(c) == ncclSuccess);
  }
}

TEST_CASE("nccl-stand-in/api: a receive of the wrong size and an abort fail the ranks through the async error") {
  std::vector<ncclComm_t> comms = init_ranks(2);
  std::int32_t out[4] = {1, 2, 3, 4}, in[3] = {};
  ncclResult_t receiver = ncclSuccess;
  on_threads(2, [&](int r) {
    if (r == 0) CHECK(ncclSend(out, 4, ncclInt32, 1, comms[0], nullptr) == ncclSuccess);  // done when posted
    else receiver = settle(comms[1], ncclRecv(in, 3, ncclInt32, 0, comms[1], nullptr));
  });
  CHECK(receiver == ncclInvalidUsage);
  CHECK(has(ncclGetLastError(comms[1]), "expects 12 bytes but the matching send has 16"));
  CHECK(settle(comms[0], ncclSuccess) == ncclRemoteError);  // the sender learns of it
  for (ncclComm_t c : comms) CHECK(ncclCommAbort(c) == ncclSuccess);

  comms = init_ranks(2);
  ncclResult_t waiting = ncclSuccess;
  double x = 0;
  std::thread receive([&] { waiting = settle(comms[1], ncclRecv(&x, 1, ncclFloat64, 0, comms[1], nullptr)); });
  std::this_thread::sleep_for(50ms);
  CHECK(ncclCommAbort(comms[0]) == ncclSuccess);
  receive.join();
  CHECK(waiting == ncclRemoteError);
  CHECK(has(ncclGetLastError(comms[1]), "rank 0 aborted its communicator"));
  CHECK(ncclCommAbort(comms[1]) == ncclSuccess);
}
