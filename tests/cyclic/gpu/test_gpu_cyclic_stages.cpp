// Stage-parallel cyclic training with device tensors (options.memory = CUDA)
// against the same runs on host memory. Label gpu; exits 77 (skipped)
// without a CUDA device.
//
// A stage world has one rank per stage and one GPU cannot host two NCCL
// ranks, so:
//  - one GPU: only L = 1 runs (a world of 1, an in-process group of 1 with
//    its device transport on device 0): the device accumulators (copy, add
//    and scale kernels) and the device average against the host run,
//    bitwise, fp32 and fp64, N in {1, 2, 3, 5}, DELAY1 / NEWEST / SYNC, with
//    ramp gradients of several thousand elements (stage_ramp_run.hpp; the
//    host run is checked against the header's average in
//    test_cyclic_stages_memory.cpp, and here again) and with the StageMlp
//    training; a world of 1 moves no boundary tensor.
//  - two or more GPUs (one thread per stage, stage j on device j): L = 2
//    (and L = 3 with three GPUs) training with device boundary tensors,
//    gradients and averages equals the host training bitwise (the caller's
//    compute stays on the host: its tensors are copied to the device before
//    send / accumulate and back after receive / average), N in {1, L, 2L}
//    (2L: two actions per time step), with the plain calls and with the
//    _stream calls on a stream of the caller's; a receive into a device
//    tensor of the wrong size fails INVALID_ARGUMENT naming both sizes,
//    writes nothing, and the neighbour fails well within the timeout.
// What one GPU leaves untested: everything of the boundaries on the device
// (the NCCL groups per time step, the transfer stream, the device staging
// slots and headers, receive's host wait, DONE's wait for the last group,
// the wrong-size receive and the poisoning of a neighbour, a dead
// neighbour seen by receive), i.e. every L >= 2 case above.
// Over flatmem's NCCL stand-in (FLATMEM_NCCL_LIBRARY names it; ctest
// gpu/nccl-stand-in/*; docs/nccl-stand-in.md) the L >= 2 cases run with
// every stage a thread on device 0: flatmem's side of them, not NCCL's.
#include <cuda_runtime_api.h>
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cyclic/gpu/device_ramp_buffers.hpp"
#include "cyclic/ramp_run.hpp"
#include "cyclic/stage_ramp_run.hpp"
#include "support/gpu.hpp"
#include "support/stage_train.hpp"

using namespace test;

namespace {

using Clock = std::chrono::steady_clock;

constexpr std::int64_t timeout_ms = 20000;

std::string describe(const TrainSetup &s, int n) {
  return "L " + std::to_string(s.stages()) + ", N " + std::to_string(n) + ", steps " + std::to_string(s.steps) +
         ", rule " + std::to_string(int(s.rule));
}


// A world of 1 with ramp gradients on host or device memory: the averages.
template <typename T>
std::vector<RampUpdate<T>> stage_ramp_world_of_1(flatmem_cyclic_rule rule, int n, std::int64_t steps, bool device) {
  flatmem_comm_t *comm = nullptr;
  REQUIRE(flatmem_comm_create_local(&comm, 1, nullptr) == FLATMEM_STATUS_SUCCESS);
  std::unique_ptr<RampBuffers<T>> buffers;
  StageOptions o = stage_ramp_options(rule, n, steps, timeout_ms);
  if (device) {
    cuda_check(cudaSetDevice(0), "cudaSetDevice");
    REQUIRE_MESSAGE(flatmem_comm_init_device(comm, 0, timeout_ms) == FLATMEM_STATUS_SUCCESS,
                  std::string(flatmem_last_error()));
    o.options.memory = FLATMEM_CYCLIC_MEMORY_CUDA;
    buffers = std::make_unique<DeviceRampBuffers<T>>(1, 0);
  } else {
    buffers = std::make_unique<HostRampBuffers<T>>(1);
  }
  flatmem_cyclic_stages_t *h = nullptr;
  REQUIRE_MESSAGE(flatmem_cyclic_stages_create(&h, comm, &o.options) == FLATMEM_STATUS_SUCCESS,
                  std::string(flatmem_last_error()));
  std::vector<RampUpdate<T>> updates;
  const std::string error = run_stage_ramp<T>(h, *buffers, updates);
  CHECK(flatmem_cyclic_stages_destroy(h) == FLATMEM_STATUS_SUCCESS);
  flatmem_comm_destroy(comm);
  REQUIRE_MESSAGE(error == "", error);
  REQUIRE_MESSAGE(stage_ramp_complete(updates, steps) == "", stage_ramp_complete(updates, steps));
  return updates;
}

template <typename T>
void check_ramp_device_equals_host(flatmem_cyclic_rule rule, int n) {
  CAPTURE(rule);
  CAPTURE(n);
  const std::int64_t steps = 4;
  const auto host = stage_ramp_world_of_1<T>(rule, n, steps, false);
  const auto device = stage_ramp_world_of_1<T>(rule, n, steps, true);
  for (std::size_t k = 0; k < device.size(); ++k) {
    CAPTURE(k);
    CHECK(ramp_bits_differ(device[k].values, host[k].values) == "");
    CHECK(ramp_bits_differ(device[k].values, ramp_average<T>(n, 0, device[k].step)) == "");
  }
}

// --- training with device tensors ----------------------------------------------------

// The tensor calls of train_stage on stage `device`'s GPU: each host tensor
// is copied to a device buffer before send / accumulate and back after
// receive / average; with `streams` the _stream calls on a non-blocking
// stream of the caller's (the copies on it too), else the plain calls
// (the legacy default stream).
template <typename T>
class DeviceCalls {
 public:
  DeviceCalls(int device, bool streams, std::size_t max_bytes) : device_(device) {
    cuda_check(cudaSetDevice(device), "cudaSetDevice");
    if (streams) cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    for (auto &b : buffers_) b = flatmem_test::DeviceBuffer(max_bytes);
  }
  ~DeviceCalls() {
    if (stream_) {
      cudaStreamSynchronize(stream_);
      cudaStreamDestroy(stream_);
    }
  }
  DeviceCalls(const DeviceCalls &) = delete;
  DeviceCalls &operator=(const DeviceCalls &) = delete;

  // A receive of this (0-based, counted over the stage's receives) goes into
  // a tensor one element too large first (the test of the wrong size).
  int oversize_receive = -1;
  std::string oversize_result;      // "<status>: <message>", and whether it wrote
  Clock::time_point oversize_at{};

  StageCalls calls() {
    StageCalls c;
    c.send = [this](flatmem_cyclic_stages_t *h, const flatmem_cyclic_stages_action &, DLTensor *t) {
      DLTensor d = upload(0, t);
      return stream_ ? flatmem_cyclic_stages_send_stream(h, &d, stream_) : flatmem_cyclic_stages_send(h, &d);
    };
    c.accumulate = [this](flatmem_cyclic_stages_t *h, const flatmem_cyclic_stages_action &, DLTensor *t) {
      DLTensor d = upload(1, t);
      return stream_ ? flatmem_cyclic_stages_accumulate_stream(h, &d, stream_) : flatmem_cyclic_stages_accumulate(h, &d);
    };
    c.receive = [this](flatmem_cyclic_stages_t *h, const flatmem_cyclic_stages_action &, DLTensor *t) {
      if (receives_++ == oversize_receive) return receive_oversize(h, t);
      DLTensor d = on_device(2, t);
      const flatmem_status s =
          stream_ ? flatmem_cyclic_stages_receive_stream(h, &d, stream_) : flatmem_cyclic_stages_receive(h, &d);
      if (s == FLATMEM_STATUS_SUCCESS) download(2, t);
      return s;
    };
    c.average = [this](flatmem_cyclic_stages_t *h, const flatmem_cyclic_stages_action &, DLTensor *t) {
      DLTensor d = on_device(3, t);
      const flatmem_status s =
          stream_ ? flatmem_cyclic_stages_average_stream(h, &d, stream_) : flatmem_cyclic_stages_average(h, &d);
      if (s == FLATMEM_STATUS_SUCCESS) download(3, t);
      return s;
    };
    return c;
  }

 private:
  static std::size_t bytes(const DLTensor *t) { return std::size_t(t->shape[0]) * sizeof(T); }
  DLTensor on_device(int k, const DLTensor *t) const {
    DLTensor d = *t;
    d.data = buffers_[std::size_t(k)].data();
    d.device = {kDLCUDA, device_};
    return d;
  }
  DLTensor upload(int k, const DLTensor *t) {
    // Ordered after the previous call's use of the buffer: the same stream
    // (stream_, or the legacy default stream of the plain calls).
    cuda_check(cudaMemcpyAsync(buffers_[std::size_t(k)].data(), t->data, bytes(t), cudaMemcpyHostToDevice, stream_),
               "cudaMemcpyAsync to the device");
    cuda_check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");  // the host buffer is reused
    return on_device(k, t);
  }
  void download(int k, DLTensor *t) {
    cuda_check(cudaMemcpyAsync(t->data, buffers_[std::size_t(k)].data(), bytes(t), cudaMemcpyDeviceToHost, stream_),
               "cudaMemcpyAsync from the device");
    cuda_check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }
  flatmem_status receive_oversize(flatmem_cyclic_stages_t *h, DLTensor *t) {
    std::int64_t shape = t->shape[0] + 1;
    const std::size_t n = std::size_t(shape) * sizeof(T);
    flatmem_test::DeviceBuffer big(n);
    cuda_check(cudaMemset(big.data(), 0xA5, n), "cudaMemset");
    DLTensor d = *t;
    d.data = big.data();
    d.device = {kDLCUDA, device_};
    d.shape = &shape;
    const flatmem_status s =
        stream_ ? flatmem_cyclic_stages_receive_stream(h, &d, stream_) : flatmem_cyclic_stages_receive(h, &d);
    oversize_at = Clock::now();
    oversize_result = std::string(flatmem_status_string(s)) + ": " + flatmem_last_error();
    cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    std::vector<unsigned char> after(n);
    cuda_check(cudaMemcpy(after.data(), big.data(), n, cudaMemcpyDeviceToHost), "cudaMemcpy");
    for (unsigned char c : after)
      if (c != 0xA5) {
        oversize_result += " [the refused tensor was written]";
        break;
      }
    return s;
  }

  int device_;
  cudaStream_t stream_ = nullptr;
  flatmem_test::DeviceBuffer buffers_[4];  // send, gradient, receive, average
  int receives_ = 0;
};

template <typename T>
struct DeviceTraining {
  std::vector<StageRun<T>> runs;
  std::vector<std::string> errors;
  std::vector<flatmem_cyclic_stages_summary> summaries;
  std::vector<Clock::time_point> ended;
  std::vector<std::string> oversize;  // per stage: the wrong-size receive's result ("" = none)
  std::vector<Clock::time_point> oversize_at;
};

// L threads, stage j on CUDA device j, options.memory = CUDA. The wrong-size
// receive: stage `oversize_stage` makes its receive number `oversize_receive`
// into a tensor one element too large.
template <typename T>
DeviceTraining<T> train_stages_device(const TrainSetup &setup, int n, bool streams, std::int64_t timeout = timeout_ms,
                                      int oversize_stage = -1, int oversize_receive = -1) {
  const int L = setup.stages();
  DeviceTraining<T> out;
  out.runs.resize(std::size_t(L));
  out.errors.assign(std::size_t(L), "");
  out.summaries.assign(std::size_t(L), flatmem_cyclic_stages_summary{});
  out.ended.resize(std::size_t(L));
  out.oversize.assign(std::size_t(L), "");
  out.oversize_at.resize(std::size_t(L));
  std::vector<flatmem_comm_t *> comms(std::size_t(L), nullptr);
  REQUIRE(flatmem_comm_create_local(comms.data(), L, nullptr) == FLATMEM_STATUS_SUCCESS);
  std::size_t max_bytes = 0;
  for (int j = 0; j < L; ++j) {
    const std::size_t params = StageMlp<T>::make(setup.widths, setup.seed).param_count(j);
    max_bytes = std::max({max_bytes, params * sizeof(T),
                          std::size_t(setup.rows) * std::size_t(setup.widths[std::size_t(j) + 1]) * sizeof(T),
                          std::size_t(setup.rows) * std::size_t(setup.widths[std::size_t(j)]) * sizeof(T)});
  }
  // A stage whose training failed keeps its handle (and its poisoned
  // communicator) until the others have ended, so that they learn of the
  // failure from the poisoning, not from a destroyed handle.
  // `running`: the stages still training (each counts itself out once).
  std::atomic<int> running{L};
  const auto hold_until_others_end = [&] {
    const auto until = Clock::now() + std::chrono::milliseconds(timeout + 5000);
    while (running.load() > 0 && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  };
  std::vector<std::thread> threads;
  for (int j = 0; j < L; ++j)
    threads.emplace_back([&, j] {
      const std::size_t i = std::size_t(j);
      try {
        cuda_check(cudaSetDevice(flatmem_test::device_of_rank(j)), "cudaSetDevice");
        if (flatmem_comm_init_device(comms[i], flatmem_test::device_of_rank(j), timeout) != FLATMEM_STATUS_SUCCESS) {
          out.errors[i] = std::string("flatmem_comm_init_device: ") + flatmem_last_error();
          out.ended[i] = Clock::now();
          --running;
          flatmem_comm_abort(comms[i]);
          return;
        }
        StageOptions o = stage_options(setup, n, sizeof(T), timeout);
        o.options.memory = FLATMEM_CYCLIC_MEMORY_CUDA;
        flatmem_cyclic_stages_t *h = nullptr;
        if (flatmem_cyclic_stages_create(&h, comms[i], &o.options) != FLATMEM_STATUS_SUCCESS) {
          out.errors[i] = std::string("flatmem_cyclic_stages_create: ") + flatmem_last_error();
          out.ended[i] = Clock::now();
          --running;
          flatmem_comm_abort(comms[i]);
          return;
        }
        DeviceCalls<T> calls(flatmem_test::device_of_rank(j), streams, max_bytes);
        if (j == oversize_stage) calls.oversize_receive = oversize_receive;
        out.errors[i] = train_stage<T>(h, setup, n, j, out.runs[i], nullptr, calls.calls());
        out.ended[i] = Clock::now();
        --running;
        if (!out.errors[i].empty()) hold_until_others_end();
        out.oversize[i] = calls.oversize_result;
        out.oversize_at[i] = calls.oversize_at;
        flatmem_cyclic_stages_summary_get(h, &out.summaries[i], sizeof(flatmem_cyclic_stages_summary));
        flatmem_cyclic_stages_destroy(h);
        if (!out.errors[i].empty()) flatmem_comm_abort(comms[i]);  // a failed rank leaves its group
      } catch (const std::exception &e) {
        out.errors[i] = std::string("exception: ") + e.what();
        out.ended[i] = Clock::now();
        --running;
        flatmem_comm_abort(comms[i]);
      }
    });
  for (std::thread &t : threads) t.join();
  for (std::size_t i = 0; i < comms.size(); ++i)
    if (out.errors[i].empty()) flatmem_comm_destroy(comms[i]);
  return out;
}

// Device training equals host training (train_stages_local: the same model,
// the plain calls on host tensors) bitwise: parameters, losses, messages.
template <typename T>
void check_device_training_equals_host(const TrainSetup &setup, int n, bool streams) {
  CAPTURE(describe(setup, n));
  CAPTURE(streams);
  const StageTraining<T> host = train_stages_local<T>(setup, n, timeout_ms);
  const DeviceTraining<T> device = train_stages_device<T>(setup, n, streams);
  for (int j = 0; j < setup.stages(); ++j) {
    CAPTURE(j);
    const std::size_t i = std::size_t(j);
    REQUIRE_MESSAGE(host.errors[i] == "", host.errors[i]);
    REQUIRE_MESSAGE(device.errors[i] == "", device.errors[i]);
    CHECK(same_bits(device.runs[i].params, host.runs[i].params));
    REQUIRE(device.runs[i].losses.size() == host.runs[i].losses.size());
    for (std::size_t m = 0; m < host.runs[i].losses.size(); ++m)
      CHECK(same_bits(device.runs[i].losses[m], host.runs[i].losses[m]));
    CHECK(device.summaries[i].messages_sent == host.summaries[i].messages_sent);
    CHECK(device.summaries[i].actions == host.summaries[i].actions);
  }
  // the training moved the parameters (the comparison means something)
  CHECK(!same_bits(host.runs[0].params, StageMlp<T>::make(setup.widths, setup.seed).params[0]));
}

}  // namespace

TEST_CASE("cyclic_stages/gpu/world 1: device accumulators and averages of ramps, N = 1, 2, 3, 5, bitwise the host run") {
  for (const flatmem_cyclic_rule rule : {FLATMEM_CYCLIC_DELAY1, FLATMEM_CYCLIC_NEWEST, FLATMEM_CYCLIC_SYNC})
    for (const int n : {1, 2, 3, 5}) {
      check_ramp_device_equals_host<float>(rule, n);
      check_ramp_device_equals_host<double>(rule, n);
    }
}

TEST_CASE("cyclic_stages/gpu/world 1: StageMlp training with device gradients and averages equals the host training") {
  for (const flatmem_cyclic_rule rule : {FLATMEM_CYCLIC_DELAY1, FLATMEM_CYCLIC_NEWEST, FLATMEM_CYCLIC_SYNC})
    for (const int n : {1, 2, 3, 5})
      for (const bool streams : {false, true}) {
        check_device_training_equals_host<float>(mlp_setup(1, 3, rule), n, streams);
        check_device_training_equals_host<double>(mlp_setup(1, 3, rule), n, streams);
      }
}

namespace {

// L stages on L devices (or all on device 0 over the NCCL stand-in), bitwise the host run under
// every rule and micro-batch count; skipped with fewer devices.
void check_stages_on_devices(int L) {
  const int count = flatmem_test::device_ranks(3);  // 3 over the NCCL stand-in (all on device 0)
  if (count < L)
    flatmem_test::skip_this_case("only " + std::to_string(count) + " CUDA device(s): the stage-parallel device "
                                 "test of L = " + std::to_string(L) + " did not run");
  for (const flatmem_cyclic_rule rule : {FLATMEM_CYCLIC_DELAY1, FLATMEM_CYCLIC_NEWEST, FLATMEM_CYCLIC_SYNC})
    for (const int n : {1, L, 2 * L})  // 2L: two actions per time step
      for (const bool streams : {false, true}) {
        check_device_training_equals_host<float>(mlp_setup(L, 4, rule), n, streams);
        check_device_training_equals_host<double>(mlp_setup(L, 4, rule), n, streams);
      }
}

}  // namespace

TEST_CASE("cyclic_stages/gpu/L = 2 on as many GPUs: device boundaries train bitwise as host ones (needs 2 devices)") {
  check_stages_on_devices(2);
}

TEST_CASE("cyclic_stages/gpu/L = 3 on as many GPUs: device boundaries train bitwise as host ones (needs 3 devices)") {
  check_stages_on_devices(3);
}

TEST_CASE("cyclic_stages/gpu/L = 2: a device receive of the wrong size names both sizes, writes nothing, fails the neighbour quickly") {
  const int count = flatmem_test::device_ranks(2);  // 2 over the NCCL stand-in (both on device 0)
  if (count < 2) {
    flatmem_test::skip_this_case("only " + std::to_string(count) + " CUDA device(s): the wrong-size device receive did not run");
  }
  const std::int64_t timeout = 30000;
  for (const int n : {2, 4})  // 4 = 2L: two actions per time step
    for (const bool streams : {false, true}) {
      CAPTURE(n);
      CAPTURE(streams);
      const TrainSetup setup = mlp_setup(2, 3, FLATMEM_CYCLIC_DELAY1);
      // Stage 1's first receive: the activation of micro-batch 0, step 0.
      const DeviceTraining<float> run = train_stages_device<float>(setup, n, streams, timeout, 1, 0);
      const std::string &refusal = run.oversize[1];
      const std::int64_t sent = std::int64_t(setup.rows) * setup.widths[1] * std::int64_t(sizeof(float));
      CAPTURE(refusal);
      CHECK(has(refusal, "FLATMEM_STATUS_INVALID_ARGUMENT: "));
      CHECK(has(refusal, "the sender sent " + std::to_string(sent) + " bytes but `into` has " +
                             std::to_string(sent + std::int64_t(sizeof(float))) + " bytes"));
      CHECK(!has(refusal, "was written"));
      CHECK_MESSAGE(has(run.errors[1], "flatmem_cyclic_stages_receive"), run.errors[1]);
      // stage 0 is told (the poisoned communicator), long before the timeout
      CHECK_MESSAGE(run.errors[0] != "", "stage 0 finished its training");
      MESSAGE("stage 0: ", run.errors[0]);
      const double seconds = std::chrono::duration<double>(run.ended[0] - run.oversize_at[1]).count();
      MESSAGE("stage 0 failed ", seconds, " s after the refused receive");
      CHECK(seconds < 5.0);
    }
}
