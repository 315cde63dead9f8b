// The ZeRO relay on the device (options.parameters = RELAYED, options.memory
// = CUDA) against the host relay's training (tests/cyclic/relay_run.hpp,
// itself checked against the replicated DELAY1 run in test_cyclic_relay.cpp),
// and both against the single-process simulation of the DELAY1 rule
// (support/cyclic_train.hpp). Label gpu; exits 77 (skipped) without a CUDA
// device.
//
// The caller's compute stays on the host (StageMlp): each rank keeps its
// shards, full stages and gradients in device memory, and
//  - registers every shard with flatmem_cyclic_set_shard_stream on a
//    non-blocking stream of its own, and applies each update to the device
//    shard on that stream: the average is read back when flatmem_cyclic_next
//    returns the update, the SGD expression of the host relay is applied on
//    the host, and the new shard is copied in by a cudaMemcpyAsync queued
//    behind a 20 ms host function on the stream (a relay copy of the shard
//    that did not run on that stream, after the update, would read the old
//    version and change the bits);
//  - takes each stage with flatmem_cyclic_parameters_stream on the same
//    stream and copies it to the host there (one stream synchronize);
//  - writes each gradient into its device buffer on the stream and hands it
//    over with flatmem_cyclic_reduce_stream.
// Checked bitwise: the final shards (read from the device), the losses, and
// the assembled model against the simulation, fp32 and fp64.
//  - One GPU: a world of 1 (an in-process group of 1 with its device
//    transport on device 0), L = 1, 2, 3. Rank 0 gathers its own shard: the
//    handle's copies of the shard on the caller's stream (ordered behind the
//    held update), the group clock (a time step's marks and event; with one
//    rank a group has no transfer, so no NCCL send / receive is enqueued),
//    the host wait of the take and the copy into `full`, the device staging,
//    and the device gradient chain (no NCCL transfer in a world of 1) run;
//    no relay byte moves between ranks.
//  - Two or more GPUs (one thread per rank, rank r on device r): N = 2 with
//    L = 1 and 2; N = 3 and 4 with L = 2 when that many devices exist (the
//    device relay needs N <= 2L). Skipped with a message otherwise.
//  - A `full` of the wrong size (n + 1 elements) is INVALID_ARGUMENT naming
//    both sizes, writes nothing, and the action is served by the next call.
// What one GPU leaves untested: every transfer of the device relay -- rank
// 0's gather receives and the owners' sends from the shard copies (copy
// slots, contribution one time step early), the pass-on from rank r to r + 1
// out of the K staging slots (slot reuse, offset gaps > 1), the NCCL
// connection handshake at create, the relay's part of the gradient scatter
// between ranks, and a peer's failure seen by a group or by the take -- i.e.
// every N >= 2 case above, which needs as many GPUs as ranks. Nothing here
// has run on a GPU yet (written and compiled on a machine without one).
// Over flatmem's NCCL stand-in (FLATMEM_NCCL_LIBRARY names it; ctest
// gpu/nccl-stand-in/*; docs/nccl-stand-in.md) the multi-rank cases run with
// every rank a thread on device 0: flatmem's side of them, not NCCL's.
#include <cuda_runtime_api.h>
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cyclic/gpu/device_ramp_buffers.hpp"
#include "cyclic/relay_run.hpp"
#include "support/gpu.hpp"

using namespace test;

namespace {

constexpr std::int64_t timeout_ms = 20000;

// cudaLaunchHostFunc callback: holds the stream for 20 ms.
void CUDART_CB hold_stream(void *) { std::this_thread::sleep_for(std::chrono::milliseconds(20)); }

template <typename T>
DLTensor device_tensor(void *data, int device, std::int64_t *shape) {
  DLTensor t{};
  t.data = data;
  t.device = {kDLCUDA, device};
  t.ndim = 1;
  t.dtype = {kDLFloat, std::uint8_t(8 * sizeof(T)), 1};
  t.shape = shape;
  return t;
}

// One rank's device relay training: its final shards (read back from the
// device), losses, and what the wrong-size `full` got.
template <typename T>
struct DeviceRelayRank {
  std::vector<std::vector<T>> shards;
  std::vector<double> losses;
  std::string error;           // "" = DONE
  std::string wrong_size;      // the refusal of the first FORWARD's `full` of n + 1 elements
  bool wrong_size_wrote = false;
  int updates = 0, served = 0;
};

// Forward / backward buffers of one rank (support/cyclic_train.cpp's loop).
template <typename T>
struct Activations {
  const TrainSetup &setup;
  std::vector<std::vector<T>> acts;
  std::vector<T> target, dprev, dnext;
  explicit Activations(const TrainSetup &s) : setup(s), acts(std::size_t(s.stages()) + 1) {
    for (int j = 0; j <= s.stages(); ++j)
      acts[std::size_t(j)].resize(std::size_t(s.rows) * std::size_t(s.widths[std::size_t(j)]));
    target.resize(acts.back().size());
  }
};

// One rank's device memory: a non-blocking stream of the caller, and per
// stage the shard, a `full` (one element more: room for the wrong-size
// tensor) and the gradient, with the host copies that feed them. Made before
// the handle and released after it (the handle may still hold them).
template <typename T>
struct RankDevice {
  int device;
  cudaStream_t stream = nullptr;
  StageMlp<T> model;    // the working model: each stage as the relay delivered it last
  RelayRun<T> mirror;   // the shards' values, on the host too
  std::vector<std::vector<T>> staged;  // the source of each queued shard update
  std::vector<std::vector<T>> host_grads;
  std::vector<flatmem_test::DeviceBuffer> shards, fulls, grads;
  std::vector<std::int64_t> shard_shapes, full_shapes;
  std::vector<DLTensor> shard_t, full_t, grad_t;

  RankDevice(const TrainSetup &setup, int rank, int world, int on)
      : device(on), model(StageMlp<T>::make(setup.widths, setup.seed)), mirror(RelayRun<T>::initial(setup, rank, world)) {
    const int L = setup.stages();
    cuda_check(cudaSetDevice(device), "cudaSetDevice");
    cuda_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    for (auto &p : model.params) std::fill(p.begin(), p.end(), T(0));
    staged = mirror.shards;
    host_grads.resize(std::size_t(L));
    shard_shapes.resize(std::size_t(L));
    full_shapes.resize(std::size_t(L));
    for (int j = 0; j < L; ++j) {
      const auto i = std::size_t(j);
      const std::size_t n = model.param_count(j), own = mirror.shards[i].size();
      shard_shapes[i] = std::int64_t(own);
      full_shapes[i] = std::int64_t(n);
      host_grads[i].resize(n);
      shards.emplace_back(std::max<std::size_t>(own, 1) * sizeof(T));
      fulls.emplace_back((n + 1) * sizeof(T));
      grads.emplace_back(n * sizeof(T));
      if (own > 0)
        cuda_check(cudaMemcpy(shards[i].data(), mirror.shards[i].data(), own * sizeof(T), cudaMemcpyHostToDevice),
                   "cudaMemcpy initial shard");
    }
    for (int j = 0; j < L; ++j) {
      const auto i = std::size_t(j);
      shard_t.push_back(device_tensor<T>(shards[i].data(), device, &shard_shapes[i]));
      full_t.push_back(device_tensor<T>(fulls[i].data(), device, &full_shapes[i]));
      grad_t.push_back(device_tensor<T>(grads[i].data(), device, &full_shapes[i]));
    }
  }
  ~RankDevice() {
    if (stream != nullptr) {
      cudaStreamSynchronize(stream);
      cudaStreamDestroy(stream);
    }
  }
  RankDevice(const RankDevice &) = delete;
  RankDevice &operator=(const RankDevice &) = delete;
};

// The relay loop of train_rank_relayed (support/cyclic_train.cpp) with the
// shards, the stages and the gradients in `dev` (see the file comment).
template <typename T>
void train_rank_on_device(flatmem_cyclic_t *h, const TrainSetup &setup, int rank, int world, RankDevice<T> &dev,
                          DeviceRelayRank<T> &out) {
  const int L = setup.stages();
  const T lr = T(setup.lr);
  cuda_check(cudaSetDevice(dev.device), "cudaSetDevice");
  cudaStream_t stream = dev.stream;
  StageMlp<T> &model = dev.model;
  RelayRun<T> &mirror = dev.mirror;
  std::vector<std::vector<T>> &staged = dev.staged, &host_grads = dev.host_grads;
  std::vector<flatmem_test::DeviceBuffer> &shards = dev.shards, &fulls = dev.fulls, &grads = dev.grads;
  std::vector<DLTensor> &shard_t = dev.shard_t, &full_t = dev.full_t, &grad_t = dev.grad_t;
  for (int j = 0; j < L; ++j)
    if (const flatmem_status st = flatmem_cyclic_set_shard_stream(h, j, &shard_t[std::size_t(j)], stream);
        st != FLATMEM_STATUS_SUCCESS) {
      out.error = call_failed("flatmem_cyclic_set_shard_stream", st);
      return;
    }

  Activations<T> b(setup);
  bool tried_wrong_size = false;
  for (;;) {
    flatmem_cyclic_action a{};
    if (const flatmem_status st = flatmem_cyclic_next(h, &a, sizeof(flatmem_cyclic_action)); st != FLATMEM_STATUS_SUCCESS) {
      out.error = call_failed("flatmem_cyclic_next", st);
      return;
    }
    if (a.kind == FLATMEM_CYCLIC_DONE) break;
    if (a.update_stage >= 0) {
      // The average is complete in device memory (flatmem/cyclic.h); valid in this rank's range.
      const auto i = std::size_t(a.update_stage);
      std::vector<T> &g = host_grads[i];
      cuda_check(cudaMemcpy(g.data(), grads[i].data(), g.size() * sizeof(T), cudaMemcpyDeviceToHost),
                 "cudaMemcpy average");
      const ShardRange r = shard_of(g.size(), rank, world);
      std::vector<T> &shard = mirror.shards[i];
      for (std::size_t k = 0; k < shard.size(); ++k) shard[k] -= lr * g[r.begin + k];
      // staged[i] was last read by the copy of the previous update of this stage,
      // which a later stream synchronize (a take) has seen finish.
      staged[i] = shard;
      if (!shard.empty()) {
        cuda_check(cudaLaunchHostFunc(stream, hold_stream, nullptr), "cudaLaunchHostFunc");
        cuda_check(cudaMemcpyAsync(shards[i].data(), staged[i].data(), shard.size() * sizeof(T),
                                   cudaMemcpyHostToDevice, stream),
                   "cudaMemcpyAsync shard update");
      }
      ++out.updates;
    }
    if (a.kind != FLATMEM_CYCLIC_FORWARD && a.kind != FLATMEM_CYCLIC_BACKWARD) continue;
    const auto i = std::size_t(a.stage);
    const std::size_t n = model.param_count(a.stage);
    if (!tried_wrong_size && a.kind == FLATMEM_CYCLIC_FORWARD) {
      tried_wrong_size = true;
      std::int64_t wrong_shape = std::int64_t(n) + 1;
      DLTensor wrong = full_t[i];
      wrong.shape = &wrong_shape;
      cuda_check(cudaMemsetAsync(fulls[i].data(), 0xab, (n + 1) * sizeof(T), stream), "cudaMemsetAsync");
      const flatmem_status st = flatmem_cyclic_parameters_stream(h, &wrong, stream);
      out.wrong_size = std::string(flatmem_status_string(st)) + ": " + flatmem_last_error();
      std::vector<unsigned char> bytes((n + 1) * sizeof(T));
      cuda_check(cudaMemcpyAsync(bytes.data(), fulls[i].data(), bytes.size(), cudaMemcpyDeviceToHost, stream),
                 "cudaMemcpyAsync");
      cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      for (unsigned char c : bytes) out.wrong_size_wrote = out.wrong_size_wrote || c != 0xab;
    }
    if (const flatmem_status st = flatmem_cyclic_parameters_stream(h, &full_t[i], stream);
        st != FLATMEM_STATUS_SUCCESS) {
      out.error = call_failed("flatmem_cyclic_parameters_stream", st);
      return;
    }
    ++out.served;
    cuda_check(cudaMemcpyAsync(model.params[i].data(), fulls[i].data(), n * sizeof(T), cudaMemcpyDeviceToHost, stream),
               "cudaMemcpyAsync full");
    cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    const int j = a.stage;
    if (a.kind == FLATMEM_CYCLIC_FORWARD) {
      if (j == 0)
        task_batch<T>((a.step * world + rank) * setup.rows, setup.rows, setup.widths[0],
                      setup.widths[std::size_t(L)], b.acts[0].data(), b.target.data());
      model.forward(j, b.acts[i].data(), b.acts[i + 1].data(), setup.rows);
      if (model.last(j)) {
        b.dnext.resize(b.acts.back().size());
        out.losses.push_back(
            mse_loss<T>(b.acts.back().data(), b.target.data(), setup.rows, setup.widths.back(), b.dnext.data()));
      }
    } else {
      b.dprev.resize(b.acts[i].size());
      std::vector<T> &g = host_grads[i];  // its previous average was applied at this stage's update
      model.backward(j, b.acts[i].data(), b.acts[i + 1].data(), b.dnext.data(), j > 0 ? b.dprev.data() : nullptr,
                     g.data(), setup.rows);
      b.dnext.swap(b.dprev);
      cuda_check(cudaMemcpyAsync(grads[i].data(), g.data(), n * sizeof(T), cudaMemcpyHostToDevice, stream),
                 "cudaMemcpyAsync gradient");
      if (const flatmem_status st = flatmem_cyclic_reduce_stream(h, j, &grad_t[i], stream);
          st != FLATMEM_STATUS_SUCCESS) {
        out.error = call_failed("flatmem_cyclic_reduce_stream", st);
        return;
      }
      // The host copy of the gradient is rewritten at this stage's update; the stream
      // has copied it by then (a take synchronizes the stream in between).
    }
  }
  cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  for (int j = 0; j < L; ++j) {
    std::vector<T> s(mirror.shards[std::size_t(j)].size());
    if (!s.empty())
      cuda_check(cudaMemcpy(s.data(), shards[std::size_t(j)].data(), s.size() * sizeof(T), cudaMemcpyDeviceToHost),
                 "cudaMemcpy final shard");
    out.shards.push_back(std::move(s));
  }
}

// `world` ranks on threads over an in-process group, rank r on device r (0 over the NCCL stand-in).
template <typename T>
std::vector<DeviceRelayRank<T>> train_on_devices(const TrainSetup &setup, int world) {
  std::vector<DeviceRelayRank<T>> ranks(static_cast<std::size_t>(world));
  std::vector<flatmem_comm_t *> comms(static_cast<std::size_t>(world), nullptr);
  if (const flatmem_status st = flatmem_comm_create_local(comms.data(), world, nullptr); st != FLATMEM_STATUS_SUCCESS) {
    for (auto &r : ranks) r.error = call_failed("flatmem_comm_create_local", st);
    return ranks;
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      DeviceRelayRank<T> &out = ranks[std::size_t(r)];
      flatmem_comm_t *comm = comms[std::size_t(r)];
      const int device = flatmem_test::device_of_rank(r);
      cudaSetDevice(device);
      if (const flatmem_status st = flatmem_comm_init_device(comm, device, timeout_ms); st != FLATMEM_STATUS_SUCCESS) {
        out.error = call_failed("flatmem_comm_init_device", st);
        flatmem_comm_abort(comm);  // the peers fail fast instead of waiting
        return;
      }
      bool created = false;
      try {
        RankDevice<T> dev(setup, r, world, device);  // outlives the handle
        CyclicOptions o = relayed_options(setup, sizeof(T), timeout_ms);
        o.options.memory = FLATMEM_CYCLIC_MEMORY_CUDA;
        flatmem_cyclic_t *h = nullptr;
        if (const flatmem_status st = flatmem_cyclic_create(&h, comm, &o.options); st != FLATMEM_STATUS_SUCCESS) {
          out.error = call_failed("flatmem_cyclic_create", st);
          return;
        }
        created = true;
        const std::unique_ptr<flatmem_cyclic_t, flatmem_status (*)(flatmem_cyclic_t *)> handle(h, flatmem_cyclic_destroy);
        train_rank_on_device<T>(h, setup, r, world, dev, out);
      } catch (const std::exception &e) {
        out.error = e.what();
        if (!created) flatmem_comm_abort(comm);  // the peers fail fast in create instead of waiting
      }
    });
  for (auto &t : threads) t.join();
  for (flatmem_comm_t *c : comms) flatmem_comm_destroy(c);
  return ranks;
}

template <typename T>
void check_device_relay_equals_host(const TrainSetup &setup, int world) {
  CAPTURE(describe(setup, world));
  CAPTURE(sizeof(T));
  const RelayTraining<T> host = train_local_relayed<T>(setup, world, timeout_ms);
  REQUIRE_MESSAGE(host.ok(), host.first_error());
  const std::vector<DeviceRelayRank<T>> device = train_on_devices<T>(setup, world);
  const std::vector<RankRun<T>> simulated = simulate<T>(setup, world);
  std::vector<RelayRun<T>> device_runs;
  const int L = setup.stages();
  for (int r = 0; r < world; ++r) {
    CAPTURE(r);
    const auto i = std::size_t(r);
    const DeviceRelayRank<T> &d = device[i];
    REQUIRE_MESSAGE(d.error == "", d.error);
    CHECK(d.updates == L * int(setup.steps));
    CHECK(d.served == 2 * L * int(setup.steps));
    CHECK_MESSAGE(has(d.wrong_size, "FLATMEM_STATUS_INVALID_ARGUMENT: full: "), d.wrong_size);
    // The first FORWARD is stage 0's: n + 1 elements given, n expected.
    const std::size_t n0 = std::size_t(setup.widths[1]) * std::size_t(setup.widths[0] + 1);
    CHECK_MESSAGE(has(d.wrong_size, std::to_string(n0 + 1) + " elements; stage 0 has " + std::to_string(n0)), d.wrong_size);
    CHECK_FALSE(d.wrong_size_wrote);
    REQUIRE(d.shards.size() == host.runs[i].shards.size());
    for (std::size_t j = 0; j < d.shards.size(); ++j) {
      CAPTURE(j);
      CHECK(same_bits(d.shards[j], host.runs[i].shards[j]));
    }
    CHECK(same_bits(d.losses, host.runs[i].losses));
    CHECK(d.losses == simulated[i].losses);
    device_runs.push_back(RelayRun<T>{d.shards, d.losses});
  }
  const StageMlp<T> model = assemble(setup, device_runs);
  for (int r = 0; r < world; ++r) CHECK(model.params == simulated[std::size_t(r)].model.params);
}

}  // namespace

TEST_CASE("cyclic/gpu/relay/world 1: device shards and stages on the caller's stream, bitwise the host relay "
          "(L = 1, 2, 3, fp32 and fp64)") {
  for (int stages : {1, 2, 3}) {
    check_device_relay_equals_host<float>(mlp_setup(stages, 3, FLATMEM_CYCLIC_DELAY1), 1);
    check_device_relay_equals_host<double>(mlp_setup(stages, 3, FLATMEM_CYCLIC_DELAY1), 1);
  }
}

namespace {

// A world of `world` ranks needs as many devices (or the NCCL stand-in): skipped otherwise.
void require_ranks(int world) {
  const int count = flatmem_test::device_ranks(4);  // 4 over the NCCL stand-in (all on device 0)
  if (count < world)
    flatmem_test::skip_this_case("only " + std::to_string(count) + " CUDA device(s): the device relay of N = " +
                                 std::to_string(world) + " did not run");
}

}  // namespace

TEST_CASE("cyclic/gpu/relay/world 2 on as many GPUs: bitwise the host relay (L = 1, 2, needs 2 devices)") {
  require_ranks(2);
  for (int stages : {1, 2}) {
    check_device_relay_equals_host<float>(mlp_setup(stages, 3, FLATMEM_CYCLIC_DELAY1), 2);
    check_device_relay_equals_host<double>(mlp_setup(stages, 3, FLATMEM_CYCLIC_DELAY1), 2);
  }
}

TEST_CASE("cyclic/gpu/relay/world 3 on as many GPUs: bitwise the host relay (L = 2, needs 3 devices)") {
  require_ranks(3);
  check_device_relay_equals_host<float>(mlp_setup(2, 3, FLATMEM_CYCLIC_DELAY1), 3);
  check_device_relay_equals_host<double>(mlp_setup(2, 3, FLATMEM_CYCLIC_DELAY1), 3);
}

TEST_CASE("cyclic/gpu/relay/world 4 on as many GPUs: bitwise the host relay (L = 2, needs 4 devices)") {
  require_ranks(4);
  check_device_relay_equals_host<float>(mlp_setup(2, 3, FLATMEM_CYCLIC_DELAY1), 4);
  check_device_relay_equals_host<double>(mlp_setup(2, 3, FLATMEM_CYCLIC_DELAY1), 4);
}
