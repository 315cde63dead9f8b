// The stage-parallel handle's options.memory and the *_stream calls on any
// machine (no GPU): the option's refusals (out of range; CUDA without a
// device transport or in a build without NCCL; ranks that disagree), kDLCUDA
// tensors on a HOST handle for every tensor call and its _stream variant
// (INVALID_ARGUMENT naming options.memory, nothing written, the run goes on
// and trains as the reference), and the _stream variants on a HOST handle
// bitwise the plain calls (the stream is ignored). The reference is
// simulate() (support/cyclic_train.hpp: the rule simulated in one process,
// micro-batch order sums), as in test_cyclic_stages_train.cpp.
//
// A world of 1 driven with ramp gradients (stage_ramp_run.hpp), checked here
// against the header's average, is the GPU tests' reference for L = 1.
//
// FLATMEM_TEST_NCCL_BUILT (1 / 0) comes from tests/CMakeLists.txt: whether
// this flatmem was configured with the NCCL transport. Each test that
// depends on it says which branch it took (doctest MESSAGE).
#include <doctest/doctest.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cyclic/stage_ramp_run.hpp"
#include "support/stage_train.hpp"

using namespace test;

namespace {

bool has(const std::string &text, const char *part) { return text.find(part) != std::string::npos; }

flatmem_cyclic_stages_t *const sentinel = reinterpret_cast<flatmem_cyclic_stages_t *>(0x1);
void *const bogus_stream = reinterpret_cast<void *>(0x1234);  // never a stream: a HOST handle ignores it

std::string describe(const TrainSetup &s, int n) {
  return "L " + std::to_string(s.stages()) + ", N " + std::to_string(n) + ", steps " + std::to_string(s.steps) +
         ", rule " + std::to_string(int(s.rule));
}

template <typename T>
bool same_bits(const std::vector<T> &a, const std::vector<T> &b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

// Every stage's parameters and the last stage's losses, bitwise, against the
// simulation of the rule.
template <typename T>
void check_against_simulation(const StageTraining<T> &got, const TrainSetup &setup, int n) {
  const int L = setup.stages();
  for (int j = 0; j < L; ++j) REQUIRE_MESSAGE(got.errors[std::size_t(j)] == "", got.errors[std::size_t(j)]);
  const std::vector<RankRun<T>> want = simulate<T>(setup, n);
  for (int j = 0; j < L; ++j) {
    CAPTURE(j);
    CHECK(same_bits(got.runs[std::size_t(j)].params, want[0].model.params[std::size_t(j)]));
  }
  const auto &losses = got.runs[std::size_t(L - 1)].losses;
  REQUIRE(losses.size() == want.size());
  for (std::size_t m = 0; m < want.size(); ++m) {
    CAPTURE(m);
    CHECK(losses[m] == want[m].losses);
  }
  // the training moved the parameters (the comparison means something)
  CHECK(!same_bits(got.runs[0].params, StageMlp<T>::make(setup.widths, setup.seed).params[0]));
}

// Two runs bitwise the same: parameters, losses, messages and bytes sent.
template <typename T>
void check_same_runs(const StageTraining<T> &a, const StageTraining<T> &b, const TrainSetup &setup) {
  for (int j = 0; j < setup.stages(); ++j) {
    CAPTURE(j);
    const std::size_t i = std::size_t(j);
    REQUIRE_MESSAGE(a.errors[i] == "", a.errors[i]);
    REQUIRE_MESSAGE(b.errors[i] == "", b.errors[i]);
    CHECK(same_bits(a.runs[i].params, b.runs[i].params));
    REQUIRE(a.runs[i].losses.size() == b.runs[i].losses.size());
    for (std::size_t m = 0; m < a.runs[i].losses.size(); ++m) CHECK(same_bits(a.runs[i].losses[m], b.runs[i].losses[m]));
    CHECK(a.summaries[i].messages_sent == b.summaries[i].messages_sent);
    CHECK(a.summaries[i].actions == b.summaries[i].actions);
    CHECK(a.summaries[i].time_steps == b.summaries[i].time_steps);
  }
}

// After a refused create: the communicators still carry a HOST stage world
// to DONE, training as the simulation.
void check_host_world_works(const std::vector<flatmem_comm_t *> &comms) {
  const int L = int(comms.size());
  for (flatmem_comm_t *c : comms) CHECK(flatmem_comm_health(c) == FLATMEM_STATUS_SUCCESS);
  const TrainSetup setup = mlp_setup(L, 3, FLATMEM_CYCLIC_DELAY1);
  const int n = 2;
  StageTraining<double> got;
  got.runs.resize(std::size_t(L));
  got.errors.assign(std::size_t(L), "");
  std::vector<std::thread> threads;
  for (int j = 0; j < L; ++j)
    threads.emplace_back([&, j] {
      StageOptions o = stage_options(setup, n, sizeof(double), 5000);
      flatmem_cyclic_stages_t *h = nullptr;
      if (flatmem_cyclic_stages_create(&h, comms[std::size_t(j)], &o.options) != FLATMEM_STATUS_SUCCESS) {
        got.errors[std::size_t(j)] = std::string("flatmem_cyclic_stages_create: ") + flatmem_last_error();
        return;
      }
      got.errors[std::size_t(j)] = train_stage<double>(h, setup, n, j, got.runs[std::size_t(j)]);
      flatmem_cyclic_stages_destroy(h);
    });
  for (std::thread &t : threads) t.join();
  check_against_simulation(got, setup, n);
}

// Creates on `world` threads over a fresh in-process group; options.memory
// and timeout per rank. Statuses, messages, whether *out stayed untouched.
struct Creates {
  std::vector<flatmem_comm_t *> comms;
  std::vector<flatmem_status> status;
  std::vector<std::string> message;
  // one byte per rank: each rank's thread writes its own element, and the
  // bits of a std::vector<bool> share bytes (a data race that failed CI)
  std::vector<char> untouched;
  double seconds = 0;
  Creates(int world, const std::function<flatmem_cyclic_memory(int)> &memory, std::int64_t timeout_ms) {
    comms.assign(std::size_t(world), nullptr);
    status.assign(std::size_t(world), FLATMEM_STATUS_INTERNAL);
    message.assign(std::size_t(world), "");
    untouched.assign(std::size_t(world), 0);
    REQUIRE(flatmem_comm_create_local(comms.data(), world, nullptr) == FLATMEM_STATUS_SUCCESS);
    const TrainSetup setup = mlp_setup(world, 3, FLATMEM_CYCLIC_DELAY1);
    const auto start = std::chrono::steady_clock::now();
    std::vector<std::thread> threads;
    for (int r = 0; r < world; ++r)
      threads.emplace_back([&, r] {
        const std::size_t i = std::size_t(r);
        StageOptions o = stage_options(setup, 2, sizeof(double), timeout_ms);
        o.options.memory = memory(r);
        flatmem_cyclic_stages_t *h = sentinel;
        status[i] = flatmem_cyclic_stages_create(&h, comms[i], &o.options);
        message[i] = flatmem_last_error();
        untouched[i] = char(h == sentinel);
        if (h != sentinel) flatmem_cyclic_stages_destroy(h);
      });
    for (std::thread &t : threads) t.join();
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  ~Creates() {
    for (flatmem_comm_t *c : comms) flatmem_comm_abort(c);
  }
  Creates(const Creates &) = delete;
  Creates &operator=(const Creates &) = delete;
};

// --- kDLCUDA tensors on a HOST handle -----------------------------------------------

// What a stage saw of its refused calls.
struct Refusals {
  int count[8] = {};       // per call: send, send_stream, receive, receive_stream, accumulate, ..._stream, average, ..._stream
  std::string wrong;       // the first refusal that was not as expected
};

const char *const call_names[8] = {"send", "send_stream", "receive", "receive_stream",
                                   "accumulate", "accumulate_stream", "average", "average_stream"};
const char *const tensor_names[4] = {"tensor", "into", "gradient", "out"};

// Calls that first try a kDLCUDA-labelled copy of the tensor (host memory,
// never dereferenced by a HOST handle) with the plain call and its _stream
// variant, expect INVALID_ARGUMENT naming the tensor and options.memory with
// the copy unchanged, then make the real plain call.
template <typename T>
StageCalls refusing_calls(Refusals &seen) {
  using Plain = flatmem_status (*)(flatmem_cyclic_stages_t *, DLTensor *);
  using Streamed = flatmem_status (*)(flatmem_cyclic_stages_t *, DLTensor *, void *);
  const auto wrap = [&seen](int which, Plain plain, Streamed streamed) -> StageCall {
    return [&seen, which, plain, streamed](flatmem_cyclic_stages_t *h, const flatmem_cyclic_stages_action &a,
                                           DLTensor *t) {
      const std::size_t n = std::size_t(t->shape[0]) * sizeof(T);
      // Receive and average would write: a copy full of a byte pattern that no
      // result has; send and accumulate read: a copy of the real tensor.
      std::vector<unsigned char> copy(n, 0xA5);
      if (which == 0 || which == 2) std::memcpy(copy.data(), t->data, n);
      const std::vector<unsigned char> before = copy;
      DLTensor device = *t;
      device.data = copy.data();
      device.device = {kDLCUDA, 0};
      for (int variant = 0; variant < 2; ++variant) {
        const flatmem_status s = variant == 0 ? plain(h, &device) : streamed(h, &device, bogus_stream);
        const std::string message = flatmem_last_error();
        ++seen.count[2 * which + variant];
        const std::string what = std::string(call_names[2 * which + variant]) + " at step " +
                                 std::to_string(a.step) + ", micro-batch " + std::to_string(a.micro_batch) + ": " +
                                 flatmem_status_string(s) + ": " + message;
        const std::string named = std::string(tensor_names[which]) + ": device type 2";
        if (seen.wrong.empty() &&
            (s != FLATMEM_STATUS_INVALID_ARGUMENT || !has(message, named.c_str()) ||
             !has(message, "options.memory = HOST takes kDLCPU") || copy != before))
          seen.wrong = what + (copy != before ? " [the refused buffer was written]" : "");
      }
      return plain(h, t);
    };
  };
  StageCalls c;
  c.send = wrap(0, [](flatmem_cyclic_stages_t *h, DLTensor *t) { return flatmem_cyclic_stages_send(h, t); },
                [](flatmem_cyclic_stages_t *h, DLTensor *t, void *s) { return flatmem_cyclic_stages_send_stream(h, t, s); });
  c.receive = wrap(1, flatmem_cyclic_stages_receive, flatmem_cyclic_stages_receive_stream);
  c.accumulate =
      wrap(2, [](flatmem_cyclic_stages_t *h, DLTensor *t) { return flatmem_cyclic_stages_accumulate(h, t); },
           [](flatmem_cyclic_stages_t *h, DLTensor *t, void *s) {
             return flatmem_cyclic_stages_accumulate_stream(h, t, s);
           });
  c.average = wrap(3, [](flatmem_cyclic_stages_t *h, DLTensor *t) { return flatmem_cyclic_stages_average(h, t); },
                   [](flatmem_cyclic_stages_t *h, DLTensor *t, void *s) {
                     return flatmem_cyclic_stages_average_stream(h, t, s);
                   });
  return c;
}

// The _stream variants (stream: bogus_stream, or NULL) for every call, or
// alternating with the plain calls (alternate: call k is _stream when k is odd).
StageCalls stream_calls(void *stream, bool alternate) {
  StageCalls c;
  auto counter = std::make_shared<std::int64_t>(0);
  const auto streamed = [alternate, counter]() { return !alternate || ((*counter)++ % 2) == 1; };
  c.send = [=](flatmem_cyclic_stages_t *h, const flatmem_cyclic_stages_action &, DLTensor *t) {
    return streamed() ? flatmem_cyclic_stages_send_stream(h, t, stream) : flatmem_cyclic_stages_send(h, t);
  };
  c.receive = [=](flatmem_cyclic_stages_t *h, const flatmem_cyclic_stages_action &, DLTensor *t) {
    return streamed() ? flatmem_cyclic_stages_receive_stream(h, t, stream) : flatmem_cyclic_stages_receive(h, t);
  };
  c.accumulate = [=](flatmem_cyclic_stages_t *h, const flatmem_cyclic_stages_action &, DLTensor *t) {
    return streamed() ? flatmem_cyclic_stages_accumulate_stream(h, t, stream) : flatmem_cyclic_stages_accumulate(h, t);
  };
  c.average = [=](flatmem_cyclic_stages_t *h, const flatmem_cyclic_stages_action &, DLTensor *t) {
    return streamed() ? flatmem_cyclic_stages_average_stream(h, t, stream) : flatmem_cyclic_stages_average(h, t);
  };
  return c;
}

template <typename T>
void check_refusals_keep_training(const TrainSetup &setup, int n) {
  CAPTURE(describe(setup, n));
  const int L = setup.stages();
  std::vector<Refusals> seen(static_cast<std::size_t>(L));
  const StageTraining<T> got = train_stages_local<T>(setup, n, 20000, nullptr,
                                                     [&](int j) { return refusing_calls<T>(seen[std::size_t(j)]); });
  for (int j = 0; j < L; ++j) {
    CAPTURE(j);
    const Refusals &r = seen[std::size_t(j)];
    CHECK_MESSAGE(r.wrong == "", r.wrong);
    // Every stage accumulates N gradients and takes an average per step; a
    // stage sends (receives) one boundary tensor per micro-batch and step
    // and direction it has a neighbour in.
    const int neighbours = (j > 0) + (j + 1 < L);
    for (int v = 0; v < 2; ++v) {
      CAPTURE(v);
      CHECK(r.count[0 + v] == n * setup.steps * neighbours);
      CHECK(r.count[2 + v] == n * setup.steps * neighbours);
      CHECK(r.count[4 + v] == n * setup.steps);
      CHECK(r.count[6 + v] == setup.steps);
    }
    CHECK(got.summaries[std::size_t(j)].messages_sent == n * setup.steps * neighbours);
  }
  check_against_simulation(got, setup, n);
  check_same_runs(got, train_stages_local<T>(setup, n), setup);
}

}  // namespace

TEST_CASE("cyclic_stages/memory/create: options.memory out of range is INVALID_ARGUMENT naming it, out untouched") {
  for (const int value : {7, -1, 2, 0x7fffffff}) {
    CAPTURE(value);
    Creates c(2, [value](int) { return flatmem_cyclic_memory(value); }, 5000);
    for (int r = 0; r < 2; ++r) {
      CAPTURE(r);
      CAPTURE(c.message[std::size_t(r)]);
      CHECK(c.status[std::size_t(r)] == FLATMEM_STATUS_INVALID_ARGUMENT);
      CHECK(has(c.message[std::size_t(r)], ("options.memory: " + std::to_string(value)).c_str()));
      CHECK(c.untouched[std::size_t(r)]);
    }
    check_host_world_works(c.comms);
  }
}

TEST_CASE("cyclic_stages/memory/create: CUDA without flatmem_comm_init_device (NCCL build) or without NCCL") {
  Creates c(2, [](int) { return FLATMEM_CYCLIC_MEMORY_CUDA; }, 5000);
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    const std::string &message = c.message[std::size_t(r)];
    CAPTURE(message);
    CHECK(c.untouched[std::size_t(r)]);
    CHECK(has(message, "options.memory"));
    if (FLATMEM_TEST_NCCL_BUILT) {
      MESSAGE("NCCL build: ", message);
      CHECK(c.status[std::size_t(r)] == FLATMEM_STATUS_INVALID_ARGUMENT);
      // every rank lacks it: each names the first, rank 0
      CHECK(has(message, "rank 0 has no device transport"));
      CHECK(has(message, "flatmem_comm_init_device"));
    } else {
      MESSAGE("built without NCCL: ", message);
      CHECK(c.status[std::size_t(r)] == FLATMEM_STATUS_UNSUPPORTED);
      CHECK(has(message, "NCCL"));
    }
  }
  CHECK(c.seconds < 4.0);
  check_host_world_works(c.comms);
}

TEST_CASE("cyclic_stages/memory/create: ranks that pass different options.memory all fail, naming the rank") {
  // NCCL build: the agreement at create sees the difference; every rank gets
  // INVALID_ARGUMENT naming options.memory and rank 1 (the first that differs
  // from rank 0), before any device transport is asked for. Without NCCL the
  // CUDA rank is refused locally (UNSUPPORTED) and never joins the agreement:
  // its peer waits for it until options.timeout_ms (TIMEOUT).
  const std::int64_t timeout_ms = FLATMEM_TEST_NCCL_BUILT ? 5000 : 400;
  for (const int cuda_rank : {0, 1}) {
    CAPTURE(cuda_rank);
    Creates c(2,
              [cuda_rank](int r) { return r == cuda_rank ? FLATMEM_CYCLIC_MEMORY_CUDA : FLATMEM_CYCLIC_MEMORY_HOST; },
              timeout_ms);
    for (int r = 0; r < 2; ++r) {
      CAPTURE(r);
      const std::string &message = c.message[std::size_t(r)];
      CAPTURE(message);
      CHECK(c.untouched[std::size_t(r)]);
      if (FLATMEM_TEST_NCCL_BUILT) {
        CHECK(c.status[std::size_t(r)] == FLATMEM_STATUS_INVALID_ARGUMENT);
        CHECK(has(message, "options.memory: rank 1 passes"));
        CHECK(has(message, cuda_rank == 1 ? "rank 1 passes CUDA, rank 0 HOST" : "rank 1 passes HOST, rank 0 CUDA"));
      } else if (r == cuda_rank) {
        CHECK(c.status[std::size_t(r)] == FLATMEM_STATUS_UNSUPPORTED);
        CHECK(has(message, "options.memory"));
        CHECK(has(message, "NCCL"));
      } else {
        MESSAGE("built without NCCL: the HOST rank waited for the refused one: ", message);
        CHECK(c.status[std::size_t(r)] == FLATMEM_STATUS_TIMEOUT);
        CHECK(has(message, "agreement"));
        CHECK(has(message, ("waiting for rank " + std::to_string(cuda_rank)).c_str()));
      }
    }
    CHECK(c.seconds < 4.0);  // both within the deadline: nobody hangs
  }
}

TEST_CASE("cyclic_stages/memory/host handle: kDLCUDA tensors refused by every call and _stream variant, the run trains on") {
  for (const flatmem_cyclic_rule rule : {FLATMEM_CYCLIC_DELAY1, FLATMEM_CYCLIC_NEWEST, FLATMEM_CYCLIC_SYNC}) {
    check_refusals_keep_training<double>(mlp_setup(2, 3, rule), 2);
    check_refusals_keep_training<float>(mlp_setup(3, 3, rule), 6);
    check_refusals_keep_training<double>(mlp_setup(1, 3, rule), 3);  // a world of 1: no boundaries
  }
}

TEST_CASE("cyclic_stages/memory/host handle: the _stream variants are the plain calls, bitwise (the stream ignored)") {
  for (const flatmem_cyclic_rule rule : {FLATMEM_CYCLIC_DELAY1, FLATMEM_CYCLIC_NEWEST, FLATMEM_CYCLIC_SYNC})
    for (const int L : {1, 2, 3})
      for (const int n : {1, 2, 2 * L + 1}) {
        const TrainSetup setup = mlp_setup(L, 3, rule);
        CAPTURE(describe(setup, n));
        const StageTraining<double> plain64 = train_stages_local<double>(setup, n);
        const StageTraining<float> plain32 = train_stages_local<float>(setup, n);
        check_against_simulation(plain64, setup, n);
        check_against_simulation(plain32, setup, n);
        for (void *stream : {bogus_stream, static_cast<void *>(nullptr)})
          for (const bool alternate : {false, true}) {
            CAPTURE(stream);
            CAPTURE(alternate);
            const auto calls = [&](int) { return stream_calls(stream, alternate); };
            check_same_runs(plain64, train_stages_local<double>(setup, n, 20000, nullptr, calls), setup);
            check_same_runs(plain32, train_stages_local<float>(setup, n, 20000, nullptr, calls), setup);
          }
      }
}

TEST_CASE("cyclic_stages/memory/host: a world of 1 averages ramps bitwise as the header defines (the GPU tests' reference)") {
  for (const flatmem_cyclic_rule rule : {FLATMEM_CYCLIC_DELAY1, FLATMEM_CYCLIC_NEWEST, FLATMEM_CYCLIC_SYNC})
    for (const int n : {1, 2, 3, 5}) {
      CAPTURE(rule);
      CAPTURE(n);
      const std::int64_t steps = 4;
      flatmem_comm_t *comm = nullptr;
      REQUIRE(flatmem_comm_create_local(&comm, 1, nullptr) == FLATMEM_STATUS_SUCCESS);
      StageOptions o = stage_ramp_options(rule, n, steps, 5000);
      flatmem_cyclic_stages_t *h = nullptr;
      REQUIRE_MESSAGE(flatmem_cyclic_stages_create(&h, comm, &o.options) == FLATMEM_STATUS_SUCCESS, flatmem_last_error());
      HostRampBuffers<float> b32(1);
      std::vector<RampUpdate<float>> u32;
      CHECK(run_stage_ramp<float>(h, b32, u32) == "");
      CHECK(flatmem_cyclic_stages_destroy(h) == FLATMEM_STATUS_SUCCESS);
      REQUIRE_MESSAGE(flatmem_cyclic_stages_create(&h, comm, &o.options) == FLATMEM_STATUS_SUCCESS, flatmem_last_error());
      HostRampBuffers<double> b64(1);
      std::vector<RampUpdate<double>> u64;
      CHECK(run_stage_ramp<double>(h, b64, u64) == "");
      CHECK(flatmem_cyclic_stages_destroy(h) == FLATMEM_STATUS_SUCCESS);
      flatmem_comm_destroy(comm);
      CHECK(stage_ramp_complete(u32, steps) == "");
      CHECK(stage_ramp_complete(u64, steps) == "");
      for (const RampUpdate<float> &u : u32) CHECK(ramp_bits_differ(u.values, ramp_average<float>(n, 0, u.step)) == "");
      for (const RampUpdate<double> &u : u64) CHECK(ramp_bits_differ(u.values, ramp_average<double>(n, 0, u.step)) == "");
    }
}
