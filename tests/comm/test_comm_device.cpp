// The device-transport entry points on any machine (no GPU needed, no label):
// flatmem_comm_init_device and the kDLCUDA paths fail cleanly -- UNSUPPORTED
// in a build without NCCL; in an NCCL build without a usable GPU a clear
// error that names init_device, with the handle left healthy -- and never
// crash or hang. On a machine whose GPU works, init_device succeeds instead;
// each test says which case it saw (doctest MESSAGE), so a log shows what
// actually ran.
//
// FLATMEM_TEST_NCCL_BUILT (1 / 0) comes from tests/CMakeLists.txt: whether
// this flatmem was configured with the NCCL transport.
#include <doctest/doctest.h>
#include <flatmem/flatmem.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>

#include "support/tensor.hpp"

using namespace flatmem_test;

namespace {

constexpr std::int64_t timeout_ms = 20000;

bool contains(const std::string &text, const char *part) { return text.find(part) != std::string::npos; }

// A host all-reduce on `comm` (SUCCESS unless it was poisoned). Callable from
// rank threads (no doctest assertion inside).
flatmem_status host_all_reduce(flatmem_comm_t *comm) {
  HostTensor v = HostTensor::vector(Dtype::f32, 8);
  for (int i = 0; i < 8; ++i) v.set(i, i);
  return flatmem_comm_all_reduce(comm, v.dl(), v.dl(), timeout_ms, nullptr);
}

}  // namespace

TEST_CASE("comm/device/before init_device: kDLCUDA buffers and groups fail with a clear status") {
  flatmem_comm_t *comm = nullptr;
  REQUIRE(flatmem_comm_create_local(&comm, 1, nullptr) == FLATMEM_STATUS_SUCCESS);
  const flatmem_status expected = FLATMEM_TEST_NCCL_BUILT ? FLATMEM_STATUS_INVALID_ARGUMENT
                                                          : FLATMEM_STATUS_UNSUPPORTED;
  HostTensor v = HostTensor::vector(Dtype::f32, 4);
  DLTensor cuda = *v.dl();
  cuda.device = {kDLCUDA, 0};  // never dereferenced: rejected before any transfer
  flatmem_comm_request_t *request = nullptr;
  CHECK(flatmem_comm_isend(comm, &cuda, 0, 0, &request, nullptr) == expected);
  CHECK(contains(flatmem_last_error(), "buffer"));
  CHECK(flatmem_comm_all_reduce(comm, &cuda, &cuda, timeout_ms, nullptr) == expected);
  CHECK(flatmem_comm_group_start(comm) == expected);
  CHECK(flatmem_comm_group_end(comm, timeout_ms) == expected);
  CHECK(flatmem_comm_synchronize(comm, nullptr, timeout_ms) == expected);
  CHECK(flatmem_comm_health(comm) == FLATMEM_STATUS_SUCCESS);
  CHECK(host_all_reduce(comm) == FLATMEM_STATUS_SUCCESS);
  flatmem_comm_destroy(comm);
}

TEST_CASE("comm/device/init_device: UNSUPPORTED without NCCL, a clear error or success with it") {
  flatmem_comm_t *comm = nullptr;
  REQUIRE(flatmem_comm_create_local(&comm, 1, nullptr) == FLATMEM_STATUS_SUCCESS);
  CHECK(flatmem_comm_init_device(comm, -1, timeout_ms) == FLATMEM_STATUS_INVALID_ARGUMENT);
  const flatmem_status s = flatmem_comm_init_device(comm, 0, timeout_ms);
  const std::string message = flatmem_last_error();
  if (!FLATMEM_TEST_NCCL_BUILT) {
    MESSAGE("built without NCCL: init_device -> ", std::string(flatmem_status_string(s)), ": ", message);
    CHECK(s == FLATMEM_STATUS_UNSUPPORTED);
    CHECK(contains(message, "NCCL"));
  } else if (s == FLATMEM_STATUS_SUCCESS) {
    MESSAGE("NCCL build with a usable CUDA device 0: init_device succeeded");
    CHECK(flatmem_comm_init_device(comm, 0, timeout_ms) == FLATMEM_STATUS_INVALID_ARGUMENT);
  } else {
    MESSAGE("NCCL build, init_device on device 0 failed (no usable GPU or NCCL here): ",
            std::string(flatmem_status_string(s)), ": ", message);
    // Local preparation failed: not a transport failure, so the handle is not poisoned.
    // comm.h: UNSUPPORTED when NCCL does not load or no CUDA driver / device is usable,
    // INVALID_ARGUMENT when cuda_device does not exist; the message says which.
    const bool no_such_device = contains(message, "does not exist");
    CHECK(s == (no_such_device ? FLATMEM_STATUS_INVALID_ARGUMENT : FLATMEM_STATUS_UNSUPPORTED));
    if (!no_such_device)
      CHECK((contains(message, "cannot be loaded") || contains(message, "no usable device") ||
             contains(message, "cannot be used")));
    CHECK(contains(message, "init_device"));
    CHECK(flatmem_comm_health(comm) == FLATMEM_STATUS_SUCCESS);
  }
  CHECK(host_all_reduce(comm) == FLATMEM_STATUS_SUCCESS);
  flatmem_comm_destroy(comm);
}

TEST_CASE("comm/device/init_device: two ranks agree (both succeed or both fail, no hang, no poison)") {
  flatmem_comm_t *comms[2] = {};
  REQUIRE(flatmem_comm_create_local(comms, 2, nullptr) == FLATMEM_STATUS_SUCCESS);
  flatmem_status status[2] = {FLATMEM_STATUS_INTERNAL, FLATMEM_STATUS_INTERNAL};
  std::string messages[2];
  const auto start = std::chrono::steady_clock::now();
  // Rank r asks for device r: with no GPU both fail their preparation; with one
  // GPU rank 1's device does not exist and both fail (rank 0 learns it from the
  // readiness exchange); with two they succeed.
  auto rank_main = [&](int rank) {
    status[rank] = flatmem_comm_init_device(comms[rank], rank, timeout_ms);
    messages[rank] = flatmem_last_error();
  };
  std::thread t0(rank_main, 0), t1(rank_main, 1);
  t0.join();
  t1.join();
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - start);
  MESSAGE("rank 0: ", std::string(flatmem_status_string(status[0])), " ", messages[0]);
  MESSAGE("rank 1: ", std::string(flatmem_status_string(status[1])), " ", messages[1]);
  CHECK(took.count() < timeout_ms);
  CHECK((status[0] == FLATMEM_STATUS_SUCCESS) == (status[1] == FLATMEM_STATUS_SUCCESS));
  if (!FLATMEM_TEST_NCCL_BUILT) {
    CHECK(status[0] == FLATMEM_STATUS_UNSUPPORTED);
    CHECK(status[1] == FLATMEM_STATUS_UNSUPPORTED);
  } else if (status[0] != FLATMEM_STATUS_SUCCESS) {
    for (int r = 0; r < 2; ++r) {
      INFO("rank ", r);
      CHECK(status[r] != FLATMEM_STATUS_TIMEOUT);
      CHECK(contains(messages[r], "init_device"));
      CHECK(flatmem_comm_health(comms[r]) == FLATMEM_STATUS_SUCCESS);
    }
  }
  // Both handles still do host work together.
  flatmem_status host[2] = {FLATMEM_STATUS_INTERNAL, FLATMEM_STATUS_INTERNAL};
  std::thread h0([&] { host[0] = host_all_reduce(comms[0]); }), h1([&] { host[1] = host_all_reduce(comms[1]); });
  h0.join();
  h1.join();
  CHECK(host[0] == FLATMEM_STATUS_SUCCESS);
  CHECK(host[1] == FLATMEM_STATUS_SUCCESS);
  flatmem_comm_destroy(comms[0]);
  flatmem_comm_destroy(comms[1]);
}
