// Cyclic data parallelism with device gradients (options.memory = CUDA)
// against the same schedules on host memory (tests/cyclic/ramp_run.hpp; the
// host runs are checked against the header's average in
// tests/cyclic/test_cyclic_memory.cpp, and here again). One GPU: a world of 1
// (an in-process group of 1 with its device transport on device 0), where
// the chains still run their NCCL communicators, streams, event waits and
// scans. Two or more GPUs add a world of 2 in one process (one thread per
// rank, rank r on device r); one GPU cannot host two NCCL ranks. Label gpu;
// exits 77 (skipped) without a CUDA device.
// Over flatmem's NCCL stand-in (FLATMEM_NCCL_LIBRARY names it; ctest
// gpu/nccl-stand-in/*; docs/nccl-stand-in.md) the multi-rank cases run with
// every rank a thread on device 0: flatmem's side of them, not NCCL's.
#include <cuda_runtime_api.h>
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cyclic/gpu/device_ramp_buffers.hpp"
#include "cyclic/ramp_run.hpp"
#include "support/gpu.hpp"

using namespace test;

namespace {

constexpr std::int64_t timeout_ms = 20000;


// Rank r: device transport and gradients on CUDA device r (0 over the NCCL stand-in).
template <typename T>
RampRankSetup<T> on_devices(int stages) {
  RampRankSetup<T> setup;
  setup.init_comm = [](flatmem_comm_t *comm, int rank) {
    cudaSetDevice(flatmem_test::device_of_rank(rank));
    return flatmem_comm_init_device(comm, flatmem_test::device_of_rank(rank), timeout_ms);
  };
  setup.buffers = [stages](int rank) -> std::unique_ptr<RampBuffers<T>> {
    return std::make_unique<DeviceRampBuffers<T>>(stages, flatmem_test::device_of_rank(rank));
  };
  return setup;
}

// The same schedule over host and device memory in a world of `world`: the
// same updates in the same order, bitwise equal, and equal to the header's
// average ((g_0 + g_1) * 1/2 for N = 2; the gradient itself for N = 1).
template <typename T>
void check_device_equals_host(flatmem_cyclic_rule rule, int world) {
  RampSetup s;
  s.rule = rule;
  s.timeout_ms = timeout_ms;
  const std::vector<RampRank<T>> host = run_ramp_world<T>(s, world);
  s.memory = FLATMEM_CYCLIC_MEMORY_CUDA;
  const std::vector<RampRank<T>> device = run_ramp_world<T>(s, world, on_devices<T>(s.stages));
  for (int r = 0; r < world; ++r) {
    CAPTURE(r);
    const RampRank<T> &h = host[std::size_t(r)], &d = device[std::size_t(r)];
    REQUIRE_MESSAGE(h.error == "", h.error);
    REQUIRE_MESSAGE(d.error == "", d.error);
    REQUIRE_MESSAGE(ramp_updates_complete(d.updates, s.stages, s.steps) == "",
                    ramp_updates_complete(d.updates, s.stages, s.steps));
    REQUIRE(d.updates.size() == h.updates.size());
    for (std::size_t k = 0; k < d.updates.size(); ++k) {
      const RampUpdate<T> &du = d.updates[k], &hu = h.updates[k];
      CAPTURE(du.stage);
      CAPTURE(du.step);
      REQUIRE(du.stage == hu.stage);
      REQUIRE(du.step == hu.step);
      CHECK(ramp_bits_differ(du.values, hu.values) == "");
      CHECK(ramp_bits_differ(du.values, ramp_average<T>(world, du.stage, du.step)) == "");
    }
  }
}

// cudaLaunchHostFunc callback: holds the stream for the given milliseconds.
void CUDART_CB sleep_on_stream(void *ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(*static_cast<int *>(ms)));
}

}  // namespace

TEST_CASE("cyclic/gpu/world 1: device gradients, DELAY1 / NEWEST / SYNC, fp32 and fp64, bitwise the host run") {
  for (const flatmem_cyclic_rule rule : {FLATMEM_CYCLIC_DELAY1, FLATMEM_CYCLIC_NEWEST, FLATMEM_CYCLIC_SYNC}) {
    CAPTURE(rule);
    check_device_equals_host<float>(rule, 1);
    check_device_equals_host<double>(rule, 1);
  }
}

TEST_CASE("cyclic/gpu/reduce_stream: the chain waits for the caller's stream (a write queued behind 200 ms)") {
  // Each gradient is overwritten with NaN on the caller's stream, which is
  // then held for 200 ms before a cudaMemcpyAsync puts the right values
  // back. A chain that read the buffer before the stream got there would scan
  // NaN (NON_FINITE under the default FLATMEM_NONFINITE_ERROR) or return an
  // update without the late values; flatmem_cyclic_reduce_stream itself must
  // not wait on the host.
  static int hold_ms = 200;
  for (const flatmem_cyclic_rule rule : {FLATMEM_CYCLIC_SYNC, FLATMEM_CYCLIC_DELAY1}) {
    CAPTURE(rule);
    RampSetup s;
    s.stages = 2;
    s.steps = 3;
    s.rule = rule;
    s.memory = FLATMEM_CYCLIC_MEMORY_CUDA;
    s.timeout_ms = timeout_ms;
    REQUIRE(cudaSetDevice(0) == cudaSuccess);
    cudaStream_t stream = nullptr;
    REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
    // One staging copy per gradient buffer: reused two steps later, after the
    // stream (serial) finished the copy out of it.
    std::vector<flatmem_test::DeviceBuffer> staging;
    for (int j = 0; j < s.stages; ++j)
      for (int p = 0; p < 2; ++p) staging.emplace_back(std::size_t(ramp_size(j)) * sizeof(float));
    double slowest_call = 0;
    int late_writes = 0;
    RampRankSetup<float> setup = on_devices<float>(s.stages);
    setup.hand_over = [&](int) -> RampHandOver {
      return [&](flatmem_cyclic_t *h, const flatmem_cyclic_action &a, DLTensor *t) {
        const std::size_t bytes = std::size_t(t->shape[0]) * sizeof(float);
        void *keep = staging[std::size_t(2 * a.stage + a.step % 2)].data();
        // The buffer's right values were written on the legacy stream (write()).
        cuda_check(cudaStreamSynchronize(cudaStreamLegacy), "cudaStreamSynchronize");
        cuda_check(cudaMemcpyAsync(keep, t->data, bytes, cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync keep");
        cuda_check(cudaMemsetAsync(t->data, 0xff, bytes, stream), "cudaMemsetAsync NaN");
        cuda_check(cudaLaunchHostFunc(stream, sleep_on_stream, &hold_ms), "cudaLaunchHostFunc");
        cuda_check(cudaMemcpyAsync(t->data, keep, bytes, cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync late");
        ++late_writes;
        const auto start = std::chrono::steady_clock::now();
        const flatmem_status st = flatmem_cyclic_reduce_stream(h, a.stage, t, stream);
        slowest_call = std::max(slowest_call, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
        return st;
      };
    };
    const auto start = std::chrono::steady_clock::now();
    const std::vector<RampRank<float>> run = run_ramp_world<float>(s, 1, setup);
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    REQUIRE_MESSAGE(run[0].error == "", run[0].error);
    CHECK(late_writes == s.stages * s.steps);
    REQUIRE(ramp_updates_complete(run[0].updates, s.stages, s.steps) == "");
    for (const RampUpdate<float> &u : run[0].updates) {
      CAPTURE(u.stage);
      CAPTURE(u.step);
      CHECK(ramp_bits_differ(u.values, ramp<float>(0, u.stage, u.step)) == "");
    }
    CHECK(slowest_call < 0.1);  // an event recorded, no host wait for the 200 ms
    // The last update needed the last late write, queued behind every hold.
    CHECK(took >= 0.2 * double(late_writes));
    REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
    REQUIRE(cudaStreamDestroy(stream) == cudaSuccess);
  }
}

TEST_CASE("cyclic/gpu/non-finite: a NaN at element k of a float32 device gradient") {
  constexpr std::int64_t k = 1234;  // of stage 1, step 1 (4099 + 1000 elements)
  auto nan_at_k = [](int) -> RampHandOver {
    return [](flatmem_cyclic_t *h, const flatmem_cyclic_action &a, DLTensor *t) {
      if (a.stage == 1 && a.step == 1) {
        const float nan = std::numeric_limits<float>::quiet_NaN();
        cuda_check(cudaMemcpy(static_cast<float *>(t->data) + k, &nan, sizeof nan, cudaMemcpyHostToDevice),
                   "cudaMemcpy NaN");
      }
      return flatmem_cyclic_reduce(h, a.stage, t);
    };
  };
  const std::string named = "FLATMEM_STATUS_NON_FINITE: cyclic: rank 0: gradient of stage 1, step 1: element " +
                            std::to_string(k) + " is not finite";
  RampSetup s;  // L = 3, S = 4
  s.memory = FLATMEM_CYCLIC_MEMORY_CUDA;
  s.timeout_ms = timeout_ms;
  RampRankSetup<float> setup = on_devices<float>(s.stages);
  setup.hand_over = nan_at_k;

  SUBCASE("ERROR, SYNC: the very next flatmem_cyclic_next (it waits for the step's all-reduce)") {
    s.rule = FLATMEM_CYCLIC_SYNC;
    const RampRank<float> run = run_ramp_world<float>(s, 1, setup)[0];
    CHECK_MESSAGE(run.error.rfind("flatmem_cyclic_next: " + named, 0) == 0, run.error);
    // The backward of stage 0 in step 1 ended the step; the next call (the
    // forward of step 2 with the update of stage 0) reported the NaN.
    CHECK(run.last.kind == FLATMEM_CYCLIC_BACKWARD);
    CHECK(run.last.stage == 0);
    CHECK(run.last.step == 1);
  }
  SUBCASE("ERROR, DELAY1: reported no later than the flatmem_cyclic_next that would return the update") {
    // The scan runs on the chain thread: the failure is reported by the first
    // call after the chain found it -- a flatmem_cyclic_next, or a hand-over
    // (flatmem_cyclic_reduce reports a failed handle too; the backwards of
    // time steps 11, 15, 16, 17 hand over) -- at the latest by the
    // flatmem_cyclic_next of the update of (1, 1): the forward of stage 1 in
    // step 3, time step 3 * 2L + 1 = 19. The hand-over was at 1 * 2L + 4 = 10.
    s.rule = FLATMEM_CYCLIC_DELAY1;
    const RampRank<float> run = run_ramp_world<float>(s, 1, setup)[0];
    const bool by_next = run.error.rfind("flatmem_cyclic_next: " + named, 0) == 0;
    const bool by_reduce = run.error.rfind("hand-over (flatmem_cyclic_reduce): " + named, 0) == 0;
    CHECK_MESSAGE((by_next || by_reduce), run.error);
    if (by_reduce) CHECK(run.last.kind == FLATMEM_CYCLIC_BACKWARD);
    CHECK(run.last.time_step >= 10);
    CHECK(run.last.time_step <= 18);
    MESSAGE("reported by ", by_next ? "the flatmem_cyclic_next after" : "the hand-over of", " time step ",
            run.last.time_step);
  }
  SUBCASE("PROPAGATE: the NaN passes through, the rest is exact") {
    for (const flatmem_cyclic_rule rule : {FLATMEM_CYCLIC_DELAY1, FLATMEM_CYCLIC_SYNC}) {
      CAPTURE(rule);
      s.rule = rule;
      s.nonfinite = FLATMEM_NONFINITE_PROPAGATE;
      const RampRank<float> run = run_ramp_world<float>(s, 1, setup)[0];
      REQUIRE_MESSAGE(run.error == "", run.error);
      REQUIRE(ramp_updates_complete(run.updates, s.stages, s.steps) == "");
      for (const RampUpdate<float> &u : run.updates) {
        CAPTURE(u.stage);
        CAPTURE(u.step);
        std::vector<float> want = ramp<float>(0, u.stage, u.step);
        if (u.stage == 1 && u.step == 1) {
          CHECK(std::isnan(u.values[std::size_t(k)]));
          want[std::size_t(k)] = u.values[std::size_t(k)];  // the rest bitwise
        }
        CHECK(ramp_bits_differ(u.values, want) == "");
      }
    }
  }
}

TEST_CASE("cyclic/gpu/reduce: wrong memory is INVALID_ARGUMENT naming it, nothing written, the run goes on") {
  RampSetup s;
  s.memory = FLATMEM_CYCLIC_MEMORY_CUDA;
  s.timeout_ms = timeout_ms;
  std::vector<std::string> refusals;
  bool host_copy_intact = false, device_buffer_intact = false;
  RampRankSetup<float> setup = on_devices<float>(s.stages);
  setup.hand_over = [&](int) -> RampHandOver {
    return [&](flatmem_cyclic_t *h, const flatmem_cyclic_action &a, DLTensor *t) {
      if (a.stage == s.stages - 1 && a.step == 0) {
        auto refuse = [&](DLTensor bad) {
          const flatmem_status st = flatmem_cyclic_reduce(h, a.stage, &bad);
          refusals.push_back(std::string(flatmem_status_string(st)) + ": " + flatmem_last_error());
        };
        const std::vector<float> want = ramp<float>(0, a.stage, a.step);
        std::vector<float> host = want;
        DLTensor lying = *t;  // host memory described as kDLCUDA
        lying.data = host.data();
        refuse(lying);
        DLTensor other_device = *t;  // the communicator is on device 0
        other_device.device.device_id = 1;
        refuse(other_device);
        DLTensor cpu = *t;  // device memory described as kDLCPU (never dereferenced)
        cpu.device = {kDLCPU, 0};
        refuse(cpu);
        host_copy_intact = host == want;
        std::vector<float> now(want.size());
        cuda_check(cudaMemcpy(now.data(), t->data, now.size() * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy");
        device_buffer_intact = ramp_bits_differ(now, want) == "";
      }
      return flatmem_cyclic_reduce(h, a.stage, t);
    };
  };
  const RampRank<float> run = run_ramp_world<float>(s, 1, setup)[0];
  REQUIRE(refusals.size() == 3);
  CHECK_MESSAGE(has(refusals[0], "FLATMEM_STATUS_INVALID_ARGUMENT: gradient: data "), refusals[0]);
  CHECK_MESSAGE((has(refusals[0], "host memory, not device memory") || has(refusals[0], "not a CUDA pointer")),
                refusals[0]);
  CHECK_MESSAGE(has(refusals[1], "FLATMEM_STATUS_INVALID_ARGUMENT: gradient: on CUDA device 1"), refusals[1]);
  CHECK_MESSAGE(has(refusals[1], "device 0"), refusals[1]);
  CHECK_MESSAGE(has(refusals[2], "FLATMEM_STATUS_INVALID_ARGUMENT: gradient: device type 1"), refusals[2]);
  CHECK_MESSAGE(has(refusals[2], "options.memory = CUDA takes kDLCUDA"), refusals[2]);
  CHECK(host_copy_intact);
  CHECK(device_buffer_intact);
  REQUIRE_MESSAGE(run.error == "", run.error);
  REQUIRE(ramp_updates_complete(run.updates, s.stages, s.steps) == "");
  for (const RampUpdate<float> &u : run.updates) CHECK(ramp_bits_differ(u.values, ramp<float>(0, u.stage, u.step)) == "");
}

TEST_CASE("cyclic/gpu/world 2 on two GPUs: DELAY1 / NEWEST / SYNC bitwise the host world of 2 (needs 2 devices)") {
  const int count = flatmem_test::device_ranks(2);  // 2 over the NCCL stand-in (both on device 0)
  if (count < 2) {
    flatmem_test::skip_this_case("only " + std::to_string(count) + " CUDA device(s): the two-rank device test did not run");
  }
  // DELAY1 / NEWEST: the device chains add in the host chains' order and
  // scale by the same factor. SYNC: NCCL sums in an order of its own, but
  // the sum of two ranks is the one rounded addition g_0 + g_1 whatever the
  // algorithm (IEEE addition is commutative), and * 1/2 is exact: bitwise too.
  for (const flatmem_cyclic_rule rule : {FLATMEM_CYCLIC_DELAY1, FLATMEM_CYCLIC_NEWEST, FLATMEM_CYCLIC_SYNC}) {
    CAPTURE(rule);
    check_device_equals_host<float>(rule, 2);
    check_device_equals_host<double>(rule, 2);
  }
}
