// The NCCL device transport on what one GPU allows: a world of one rank (an
// in-process group of 1), where NCCL still runs its real communicator,
// all-reduce, self send/receive groups and the stream deadline of
// flatmem_comm_synchronize. Two or more GPUs add a world of 2 in one process
// (one thread per rank, each on its own device); one GPU cannot host two
// ranks of one NCCL communicator, so multi-rank device traffic is otherwise
// untested here. Label gpu; exits 77 (skipped) without a CUDA device.
// Over flatmem's NCCL stand-in (FLATMEM_NCCL_LIBRARY names it; ctest
// gpu/nccl-stand-in/*; docs/nccl-stand-in.md) the multi-rank cases run with
// every rank a thread on device 0: flatmem's side of them, not NCCL's.
#include <cuda_runtime_api.h>
#include <doctest/doctest.h>
#include <flatmem/flatmem.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "support/gpu.hpp"
#include "support/tensor.hpp"

using namespace flatmem_test;

namespace {

constexpr std::int64_t timeout_ms = 20000;

std::string last_error() { return flatmem_last_error(); }

#define FLATMEM_OK(call)                                                                    \
  do {                                                                                      \
    const flatmem_status status_ = (call);                                                  \
    REQUIRE_MESSAGE(status_ == FLATMEM_STATUS_SUCCESS, #call, " -> ",                       \
                    flatmem_status_string(status_), ": ", last_error());                    \
  } while (0)

#define CUDA_OK(call)                                                                       \
  do {                                                                                      \
    const cudaError_t error_ = (call);                                                      \
    REQUIRE_MESSAGE(error_ == cudaSuccess, #call, " -> ", cudaGetErrorString(error_));      \
  } while (0)

// A communicator of one rank with its device transport on CUDA device 0.
struct OneRank {
  flatmem_comm_t *comm = nullptr;
  OneRank() {
    FLATMEM_OK(flatmem_comm_create_local(&comm, 1, nullptr));
    FLATMEM_OK(flatmem_comm_init_device(comm, 0, timeout_ms));
  }
  ~OneRank() { flatmem_comm_destroy(comm); }
  OneRank(const OneRank &) = delete;
  OneRank &operator=(const OneRank &) = delete;
};

HostTensor ramp(Dtype t, std::int64_t n, double scale, double offset) {
  HostTensor h = HostTensor::vector(t, n);
  for (std::int64_t i = 0; i < n; ++i) h.set(i, offset + scale * double(i % 97));
  return h;
}

void check_equal(const HostTensor &got, const HostTensor &want) {
  REQUIRE(got.elements() == want.elements());
  for (std::int64_t i = 0; i < got.elements(); ++i) {
    INFO("element ", i);
    REQUIRE(got.get(i) == want.get(i));
  }
}

// cudaLaunchHostFunc callback: holds the stream for the given milliseconds.
void CUDART_CB sleep_on_stream(void *ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(*static_cast<int *>(ms)));
}

}  // namespace

TEST_CASE("comm/gpu/init_device: a world of 1, a second call is INVALID_ARGUMENT") {
  OneRank r;
  CHECK(flatmem_comm_health(r.comm) == FLATMEM_STATUS_SUCCESS);
  CHECK(flatmem_comm_init_device(r.comm, 0, timeout_ms) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(std::string(flatmem_last_error()).find("already") != std::string::npos);
  CHECK(flatmem_comm_health(r.comm) == FLATMEM_STATUS_SUCCESS);
}

TEST_CASE("comm/gpu/init_device: a device id that does not exist fails and leaves the handle usable") {
  int count = 0;
  CUDA_OK(cudaGetDeviceCount(&count));
  flatmem_comm_t *comm = nullptr;
  FLATMEM_OK(flatmem_comm_create_local(&comm, 1, nullptr));
  CHECK(flatmem_comm_init_device(comm, count, timeout_ms) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(std::string(flatmem_last_error()).find("cuda_device") != std::string::npos);
  CHECK(flatmem_comm_health(comm) == FLATMEM_STATUS_SUCCESS);
  FLATMEM_OK(flatmem_comm_init_device(comm, 0, timeout_ms));  // a correct retry works
  flatmem_comm_destroy(comm);
}

TEST_CASE("comm/gpu/all_reduce: fp32, bf16, int64 (out of place and in place) equal the host sums") {
  OneRank r;
  for (Dtype t : {Dtype::f32, Dtype::bf16, Dtype::i64}) {
    INFO("dtype ", dtype_name(t));
    const std::int64_t n = 1000;
    // Small integers times a power of two: exact in every dtype, so the sum
    // over the one rank is exactly the input.
    const HostTensor input = ramp(t, n, t == Dtype::i64 ? 3.0 : 0.25, -7.0);
    HostTensor want = ramp(t, n, t == Dtype::i64 ? 3.0 : 0.25, -7.0);
    DeviceTensor send(input);
    HostTensor out = HostTensor::vector(t, n);
    DeviceTensor recv(out);
    FLATMEM_OK(flatmem_comm_all_reduce(r.comm, send.dl(), recv.dl(), timeout_ms, nullptr));
    FLATMEM_OK(flatmem_comm_synchronize(r.comm, nullptr, timeout_ms));
    recv.download(out);
    check_equal(out, want);

    FLATMEM_OK(flatmem_comm_all_reduce(r.comm, send.dl(), send.dl(), timeout_ms, nullptr));
    FLATMEM_OK(flatmem_comm_synchronize(r.comm, nullptr, timeout_ms));
    HostTensor in_place = HostTensor::vector(t, n);
    send.download(in_place);
    check_equal(in_place, want);
  }
}

TEST_CASE("comm/gpu/all_reduce: on a caller's stream") {
  OneRank r;
  cudaStream_t stream = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const HostTensor input = ramp(Dtype::f32, 4096, 0.5, 1.0);
  DeviceTensor send(input);
  HostTensor out = HostTensor::vector(Dtype::f32, 4096);
  DeviceTensor recv(out);
  FLATMEM_OK(flatmem_comm_all_reduce(r.comm, send.dl(), recv.dl(), timeout_ms, stream));
  FLATMEM_OK(flatmem_comm_synchronize(r.comm, stream, timeout_ms));
  CHECK(cudaStreamQuery(stream) == cudaSuccess);
  recv.download(out);
  check_equal(out, input);
  CUDA_OK(cudaStreamDestroy(stream));
}

TEST_CASE("comm/gpu/ring_shift: a world of 1 copies send into recv") {
  OneRank r;
  const HostTensor input = ramp(Dtype::f32, 777, 1.0, 3.0);
  DeviceTensor send(input);
  HostTensor out = HostTensor::vector(Dtype::f32, 777);
  DeviceTensor recv(out);
  FLATMEM_OK(flatmem_comm_ring_shift(r.comm, send.dl(), recv.dl(), timeout_ms, nullptr));
  FLATMEM_OK(flatmem_comm_synchronize(r.comm, nullptr, timeout_ms));
  recv.download(out);
  check_equal(out, input);
}

TEST_CASE("comm/gpu/isend/irecv: to self inside group_start/group_end") {
  OneRank r;
  const HostTensor a = ramp(Dtype::f32, 2048, 0.125, -2.0);
  const HostTensor b = ramp(Dtype::i32, 333, 5.0, 11.0);
  DeviceTensor send_a(a), send_b(b);
  HostTensor got_a = HostTensor::vector(Dtype::f32, 2048), got_b = HostTensor::vector(Dtype::i32, 333);
  DeviceTensor recv_a(got_a), recv_b(got_b);
  flatmem_comm_request_t *requests[4] = {};
  FLATMEM_OK(flatmem_comm_group_start(r.comm));
  FLATMEM_OK(flatmem_comm_isend(r.comm, send_a.dl(), 0, 1, &requests[0], nullptr));
  FLATMEM_OK(flatmem_comm_irecv(r.comm, recv_a.dl(), 0, 1, &requests[1], nullptr));
  FLATMEM_OK(flatmem_comm_isend(r.comm, send_b.dl(), 0, 2, &requests[2], nullptr));
  FLATMEM_OK(flatmem_comm_irecv(r.comm, recv_b.dl(), 0, 2, &requests[3], nullptr));
  FLATMEM_OK(flatmem_comm_group_end(r.comm, timeout_ms));
  for (flatmem_comm_request_t *q : requests) {
    std::int32_t done = 0;
    FLATMEM_OK(flatmem_comm_test(r.comm, q, &done));
    CHECK(done == 1);  // device requests are complete once enqueued
    FLATMEM_OK(flatmem_comm_wait(r.comm, q, timeout_ms));
  }
  FLATMEM_OK(flatmem_comm_synchronize(r.comm, nullptr, timeout_ms));
  recv_a.download(got_a);
  recv_b.download(got_b);
  check_equal(got_a, a);
  check_equal(got_b, b);
}

TEST_CASE("comm/gpu/group: misuse is INVALID_ARGUMENT and leaves the handle healthy") {
  OneRank r;
  CHECK(flatmem_comm_group_end(r.comm, timeout_ms) == FLATMEM_STATUS_INVALID_ARGUMENT);
  FLATMEM_OK(flatmem_comm_group_start(r.comm));
  CHECK(flatmem_comm_synchronize(r.comm, nullptr, timeout_ms) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(std::string(flatmem_last_error()).find("group") != std::string::npos);
  FLATMEM_OK(flatmem_comm_group_end(r.comm, timeout_ms));  // an empty group
  CHECK(flatmem_comm_health(r.comm) == FLATMEM_STATUS_SUCCESS);
}

TEST_CASE("comm/gpu/buffers: host memory labelled kDLCUDA, or another device id, is INVALID_ARGUMENT") {
  OneRank r;
  HostTensor host = ramp(Dtype::f32, 64, 1.0, 0.0);
  DLTensor lying = *host.dl();
  lying.device = {kDLCUDA, 0};
  HostTensor out = HostTensor::vector(Dtype::f32, 64);
  DeviceTensor recv(out);
  flatmem_comm_request_t *request = nullptr;

  CHECK(flatmem_comm_isend(r.comm, &lying, 0, 0, &request, nullptr) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(std::string(flatmem_last_error()).find("buffer") != std::string::npos);
  CHECK(flatmem_comm_all_reduce(r.comm, &lying, recv.dl(), timeout_ms, nullptr) ==
        FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(std::string(flatmem_last_error()).find("send") != std::string::npos);
  CHECK(flatmem_comm_ring_shift(r.comm, recv.dl(), &lying, timeout_ms, nullptr) ==
        FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(std::string(flatmem_last_error()).find("recv") != std::string::npos);

  DLTensor other_device = *recv.dl();
  other_device.device.device_id = 1;
  CHECK(flatmem_comm_irecv(r.comm, &other_device, 0, 0, &request, nullptr) ==
        FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(flatmem_comm_health(r.comm) == FLATMEM_STATUS_SUCCESS);
  FLATMEM_OK(flatmem_comm_synchronize(r.comm, nullptr, timeout_ms));
}

TEST_CASE("comm/gpu/synchronize: a stream held past the deadline is TIMEOUT and poisons the handle") {
  OneRank r;
  cudaStream_t stream = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  static int hold_ms = 3000;
  CUDA_OK(cudaLaunchHostFunc(stream, sleep_on_stream, &hold_ms));
  const auto start = std::chrono::steady_clock::now();
  CHECK(flatmem_comm_synchronize(r.comm, stream, 200) == FLATMEM_STATUS_TIMEOUT);
  const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - start);
  const std::string message = flatmem_last_error();
  CHECK(message.find("synchronize") != std::string::npos);
  CHECK(message.find("200 ms") != std::string::npos);
  CHECK(waited.count() >= 200);
  CHECK(waited.count() < 2500);  // the deadline, not the stream, ended the wait
  CHECK(flatmem_comm_health(r.comm) == FLATMEM_STATUS_TIMEOUT);

  HostTensor v = ramp(Dtype::f32, 16, 1.0, 0.0);
  DeviceTensor d(v);
  CHECK(flatmem_comm_all_reduce(r.comm, d.dl(), d.dl(), timeout_ms, nullptr) == FLATMEM_STATUS_COMM_POISONED);
  CHECK(flatmem_comm_group_start(r.comm) == FLATMEM_STATUS_COMM_POISONED);
  CUDA_OK(cudaStreamSynchronize(stream));  // the host function ends on its own
  CUDA_OK(cudaStreamDestroy(stream));
}

TEST_CASE("comm/gpu/destroy: a healthy transport is finalised promptly") {
  const auto start = std::chrono::steady_clock::now();
  {
    OneRank r;
    HostTensor v = ramp(Dtype::f32, 256, 1.0, 0.0);
    DeviceTensor d(v);
    FLATMEM_OK(flatmem_comm_all_reduce(r.comm, d.dl(), d.dl(), timeout_ms, nullptr));
    FLATMEM_OK(flatmem_comm_synchronize(r.comm, nullptr, timeout_ms));
  }
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - start);
  CHECK(took.count() < timeout_ms);
}

// --- two ranks, when the machine has two GPUs (or over the NCCL stand-in) -----------

namespace {

// n floats on `device`, filled with value + i.
struct DeviceVector {
  int device;
  std::int64_t n;
  void *data = nullptr;
  std::int64_t shape[1];
  DLTensor t{};
  DeviceVector(int dev, std::int64_t count, float value) : device(dev), n(count), shape{count} {
    cudaSetDevice(device);
    cudaMalloc(&data, std::size_t(n) * sizeof(float));
    std::vector<float> h(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) h[std::size_t(i)] = value + float(i % 31);
    cudaMemcpy(data, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice);
    t.data = data;
    t.device = {kDLCUDA, device};
    t.ndim = 1;
    t.dtype = {kDLFloat, 32, 1};
    t.shape = shape;
  }
  ~DeviceVector() {
    cudaSetDevice(device);
    cudaFree(data);
  }
  std::vector<float> read() const {
    std::vector<float> h(static_cast<std::size_t>(n));
    cudaSetDevice(device);
    cudaDeviceSynchronize();
    cudaMemcpy(h.data(), data, h.size() * sizeof(float), cudaMemcpyDeviceToHost);
    return h;
  }
};

}  // namespace

TEST_CASE("comm/gpu/two ranks on two GPUs: all_reduce, ring_shift, send/recv (needs 2 devices)") {
  const int count = flatmem_test::device_ranks(2);  // 2 over the NCCL stand-in (both on device 0)
  if (count < 2) {
    flatmem_test::skip_this_case("only " + std::to_string(count) + " CUDA device(s): the two-rank device test did not run");
  }
  flatmem_comm_t *comms[2] = {};
  FLATMEM_OK(flatmem_comm_create_local(comms, 2, nullptr));
  flatmem_status status[2] = {FLATMEM_STATUS_INTERNAL, FLATMEM_STATUS_INTERNAL};
  std::string errors[2];
  std::vector<float> reduced[2], shifted[2], received[2];
  auto rank_main = [&](int rank) {
    flatmem_comm_t *c = comms[rank];
    auto step = [&](flatmem_status s) {
      if (s != FLATMEM_STATUS_SUCCESS && status[rank] == FLATMEM_STATUS_SUCCESS) {
        status[rank] = s;
        errors[rank] = flatmem_last_error();
      }
    };
    status[rank] = FLATMEM_STATUS_SUCCESS;
    const int device = flatmem_test::device_of_rank(rank);
    cudaSetDevice(device);
    step(flatmem_comm_init_device(c, device, timeout_ms));
    if (status[rank] != FLATMEM_STATUS_SUCCESS) return;
    DeviceVector a(device, 1000, float(rank * 100)), shift_in(device, 1000, 0.0f), p2p(device, 1000, -1.0f);
    step(flatmem_comm_all_reduce(c, &a.t, &a.t, timeout_ms, nullptr));
    step(flatmem_comm_ring_shift(c, &a.t, &shift_in.t, timeout_ms, nullptr));
    flatmem_comm_request_t *q[2] = {};
    DeviceVector mine(device, 1000, float(rank + 1));
    step(flatmem_comm_group_start(c));
    step(flatmem_comm_isend(c, &mine.t, 1 - rank, 7, &q[0], nullptr));
    step(flatmem_comm_irecv(c, &p2p.t, 1 - rank, 7, &q[1], nullptr));
    step(flatmem_comm_group_end(c, timeout_ms));
    for (auto *r : q)
      if (r) step(flatmem_comm_wait(c, r, timeout_ms));
    step(flatmem_comm_synchronize(c, nullptr, timeout_ms));
    reduced[rank] = a.read();
    shifted[rank] = shift_in.read();
    received[rank] = p2p.read();
  };
  std::thread t0(rank_main, 0), t1(rank_main, 1);
  t0.join();
  t1.join();
  for (int rank = 0; rank < 2; ++rank) {
    INFO("rank ", rank, ": ", errors[rank]);
    REQUIRE(status[rank] == FLATMEM_STATUS_SUCCESS);
    for (std::int64_t i = 0; i < 1000; ++i) {
      const float base = float(i % 31);
      REQUIRE(reduced[rank][std::size_t(i)] == 100.0f + 2.0f * base);  // (0 + b) + (100 + b)
      REQUIRE(shifted[rank][std::size_t(i)] == 100.0f + 2.0f * base);  // the reduced vector of rank - 1
      REQUIRE(received[rank][std::size_t(i)] == float(1 - rank + 1) + base);
    }
  }
  flatmem_comm_destroy(comms[0]);
  flatmem_comm_destroy(comms[1]);
}
