// options.memory and flatmem_cyclic_reduce_stream on any machine (no GPU):
// the option's refusals (out of range; CUDA without a device transport, in a
// build without NCCL, with RELAYED parameters; ranks that disagree), a device
// gradient on a host handle, and the host-memory runs that the GPU tests
// (tests/cyclic/gpu) take as their reference, checked here against the
// average computed from the header's definition.
//
// FLATMEM_TEST_NCCL_BUILT (1 / 0) comes from tests/CMakeLists.txt: whether
// this flatmem was configured with the NCCL transport. Each test that
// depends on it says which branch it took (doctest MESSAGE).
#include <doctest/doctest.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "cyclic/ramp_run.hpp"

using namespace test;

namespace {

bool has(const std::string &text, const char *part) { return text.find(part) != std::string::npos; }

flatmem_cyclic_options options_with(flatmem_cyclic_memory memory, std::int64_t timeout_ms = 5000) {
  flatmem_cyclic_options o;
  REQUIRE(flatmem_cyclic_options_init(&o, sizeof(flatmem_cyclic_options)) == FLATMEM_STATUS_SUCCESS);
  o.stages = 2;
  o.steps = 3;
  o.timeout_ms = timeout_ms;
  o.memory = memory;
  return o;
}

// One local communicator (aborted at the end: a failed create may leave it poisoned).
struct One {
  flatmem_comm_t *comm = nullptr;
  One() { REQUIRE(flatmem_comm_create_local(&comm, 1, nullptr) == FLATMEM_STATUS_SUCCESS); }
  ~One() { flatmem_comm_abort(comm); }
  One(const One &) = delete;
  One &operator=(const One &) = delete;
};

// After a refused create: the communicator still carries a HOST handle to DONE.
void check_host_handle_works(flatmem_comm_t *comm) {
  CHECK(flatmem_comm_health(comm) == FLATMEM_STATUS_SUCCESS);
  flatmem_cyclic_options o;
  REQUIRE(flatmem_cyclic_options_init(&o, sizeof(flatmem_cyclic_options)) == FLATMEM_STATUS_SUCCESS);
  o.stages = 2;
  o.steps = 2;
  flatmem_cyclic_t *h = nullptr;
  REQUIRE_MESSAGE(flatmem_cyclic_create(&h, comm, &o) == FLATMEM_STATUS_SUCCESS, flatmem_last_error());
  HostRampBuffers<double> buffers(2);
  RampRank<double> run;
  drive_ramp<double>(h, 0, buffers, run);
  CHECK(flatmem_cyclic_destroy(h) == FLATMEM_STATUS_SUCCESS);
  CHECK_MESSAGE(run.error == "", run.error);
  CHECK_MESSAGE(ramp_updates_complete(run.updates, 2, 2) == "", ramp_updates_complete(run.updates, 2, 2));
}

flatmem_cyclic_t *const sentinel = reinterpret_cast<flatmem_cyclic_t *>(0x1);

}  // namespace

TEST_CASE("cyclic/memory/create: options.memory out of range is INVALID_ARGUMENT naming it, out untouched") {
  One g;
  for (const int value : {7, -1, 2, 0x7fffffff}) {
    CAPTURE(value);
    flatmem_cyclic_options o = options_with(flatmem_cyclic_memory(value));
    flatmem_cyclic_t *h = sentinel;
    CHECK(flatmem_cyclic_create(&h, g.comm, &o) == FLATMEM_STATUS_INVALID_ARGUMENT);
    const std::string message = flatmem_last_error();
    CHECK_MESSAGE(has(message, ("options.memory: " + std::to_string(value)).c_str()), message);
    CHECK(h == sentinel);
  }
  check_host_handle_works(g.comm);
}

TEST_CASE("cyclic/memory/create: CUDA without flatmem_comm_init_device (NCCL build) or without NCCL") {
  One g;
  flatmem_cyclic_options o = options_with(FLATMEM_CYCLIC_MEMORY_CUDA);
  flatmem_cyclic_t *h = sentinel;
  const flatmem_status s = flatmem_cyclic_create(&h, g.comm, &o);
  const std::string message = flatmem_last_error();
  CHECK(h == sentinel);
  if (FLATMEM_TEST_NCCL_BUILT) {
    MESSAGE("NCCL build: ", message);
    CHECK(s == FLATMEM_STATUS_INVALID_ARGUMENT);
    CHECK_MESSAGE(has(message, "options.memory"), message);
    CHECK_MESSAGE(has(message, "rank 0 has no device transport"), message);
    CHECK_MESSAGE(has(message, "flatmem_comm_init_device"), message);
  } else {
    MESSAGE("built without NCCL: ", message);
    CHECK(s == FLATMEM_STATUS_UNSUPPORTED);
    CHECK_MESSAGE(has(message, "options.memory"), message);
    CHECK_MESSAGE(has(message, "NCCL"), message);
  }
  check_host_handle_works(g.comm);
}

TEST_CASE("cyclic/memory/create: CUDA with RELAYED parameters needs N <= 2L, else UNSUPPORTED naming options.memory") {
  // N = 1 <= 2L: the options are accepted; the create then stops at the missing
  // device transport (NCCL build) or at NCCL itself (build without).
  {
    One g;
    CyclicOptions relayed = relayed_options(mlp_setup(2, 3, FLATMEM_CYCLIC_DELAY1), sizeof(double), 5000);
    relayed.options.memory = FLATMEM_CYCLIC_MEMORY_CUDA;
    flatmem_cyclic_t *h = sentinel;
    const flatmem_status s = flatmem_cyclic_create(&h, g.comm, &relayed.options);
    const std::string message = flatmem_last_error();
    CHECK(h == sentinel);
    CHECK_MESSAGE(has(message, "options.memory"), message);
    if (FLATMEM_TEST_NCCL_BUILT) {
      CHECK(s == FLATMEM_STATUS_INVALID_ARGUMENT);
      CHECK_MESSAGE(has(message, "no device transport"), message);
    } else {
      CHECK(s == FLATMEM_STATUS_UNSUPPORTED);
      CHECK_MESSAGE(has(message, "NCCL"), message);
    }
    check_host_handle_works(g.comm);
  }
  // N = 3 > 2L = 2: refused on every rank before any rank is contacted (so one
  // after the other is enough here), naming the shape.
  std::vector<flatmem_comm_t *> comms(3, nullptr);
  REQUIRE(flatmem_comm_create_local(comms.data(), 3, nullptr) == FLATMEM_STATUS_SUCCESS);
  CyclicOptions relayed = relayed_options(mlp_setup(1, 3, FLATMEM_CYCLIC_DELAY1), sizeof(double), 5000);
  relayed.options.memory = FLATMEM_CYCLIC_MEMORY_CUDA;
  for (flatmem_comm_t *comm : comms) {
    flatmem_cyclic_t *h = sentinel;
    CHECK(flatmem_cyclic_create(&h, comm, &relayed.options) == FLATMEM_STATUS_UNSUPPORTED);
    const std::string message = flatmem_last_error();
    CHECK(h == sentinel);
    CHECK_MESSAGE(has(message, "options.memory"), message);
    CHECK_MESSAGE(has(message, FLATMEM_TEST_NCCL_BUILT ? "N <= 2L" : "NCCL"), message);
  }
  for (flatmem_comm_t *comm : comms) flatmem_comm_destroy(comm);
}

TEST_CASE("cyclic/memory/create: ranks that pass different options.memory all fail, naming the rank") {
  // NCCL build: the agreement at create sees the difference; every rank gets
  // INVALID_ARGUMENT naming options.memory and rank 1 (the first that differs
  // from rank 0), before any device transport is asked for. Without NCCL the
  // CUDA rank is refused locally (UNSUPPORTED) and never joins the agreement:
  // its peer waits for it until options.timeout_ms (TIMEOUT), like any rank
  // whose peer never calls a collective.
  const std::int64_t timeout_ms = FLATMEM_TEST_NCCL_BUILT ? 5000 : 400;
  for (const int cuda_rank : {0, 1}) {
    CAPTURE(cuda_rank);
    std::vector<flatmem_comm_t *> comms(2, nullptr);
    REQUIRE(flatmem_comm_create_local(comms.data(), 2, nullptr) == FLATMEM_STATUS_SUCCESS);
    flatmem_status status[2] = {FLATMEM_STATUS_INTERNAL, FLATMEM_STATUS_INTERNAL};
    std::string message[2];
    bool untouched[2] = {false, false};
    const auto start = std::chrono::steady_clock::now();
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r)
      threads.emplace_back([&, r] {
        flatmem_cyclic_options o;
        flatmem_cyclic_options_init(&o, sizeof(flatmem_cyclic_options));
        o.stages = 2;
        o.steps = 3;
        o.timeout_ms = timeout_ms;
        o.memory = r == cuda_rank ? FLATMEM_CYCLIC_MEMORY_CUDA : FLATMEM_CYCLIC_MEMORY_HOST;
        flatmem_cyclic_t *h = sentinel;
        status[r] = flatmem_cyclic_create(&h, comms[std::size_t(r)], &o);
        message[r] = flatmem_last_error();
        untouched[r] = h == sentinel;
        if (h != sentinel) flatmem_cyclic_destroy(h);
      });
    for (std::thread &t : threads) t.join();
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    for (int r = 0; r < 2; ++r) {
      CAPTURE(r);
      CAPTURE(message[r]);
      CHECK(untouched[r]);
      if (FLATMEM_TEST_NCCL_BUILT) {
        CHECK(status[r] == FLATMEM_STATUS_INVALID_ARGUMENT);
        CHECK(has(message[r], "options.memory: rank 1 passes"));
        CHECK(has(message[r], cuda_rank == 1 ? "rank 1 passes CUDA, rank 0 HOST" : "rank 1 passes HOST, rank 0 CUDA"));
      } else if (r == cuda_rank) {
        CHECK(status[r] == FLATMEM_STATUS_UNSUPPORTED);
        CHECK(has(message[r], "options.memory"));
        CHECK(has(message[r], "NCCL"));
      } else {
        MESSAGE("built without NCCL: the HOST rank waited for the refused one: ", message[r]);
        CHECK(status[r] == FLATMEM_STATUS_TIMEOUT);
        CHECK(has(message[r], "agreement"));
        CHECK(has(message[r], ("waiting for rank " + std::to_string(cuda_rank)).c_str()));
      }
    }
    CHECK(took < 4.0);  // both within the deadline: nobody hangs
    for (flatmem_comm_t *c : comms) flatmem_comm_abort(c);
  }
}

TEST_CASE("cyclic/memory/host: a world of 2 averages bitwise as the header defines (the GPU tests' reference)") {
  for (const flatmem_cyclic_rule rule : {FLATMEM_CYCLIC_DELAY1, FLATMEM_CYCLIC_NEWEST, FLATMEM_CYCLIC_SYNC}) {
    CAPTURE(rule);
    RampSetup s;
    s.rule = rule;
    // SYNC sums around a ring, the chains in stagger order; for 2 ranks both
    // are the one addition g_0 + g_1 (commutative), so bitwise the definition.
    const auto f32 = run_ramp_world<float>(s, 2);
    const auto f64 = run_ramp_world<double>(s, 2);
    for (int r = 0; r < 2; ++r) {
      CAPTURE(r);
      REQUIRE_MESSAGE(f32[std::size_t(r)].error == "", f32[std::size_t(r)].error);
      REQUIRE_MESSAGE(f64[std::size_t(r)].error == "", f64[std::size_t(r)].error);
      CHECK(ramp_updates_complete(f32[std::size_t(r)].updates, s.stages, s.steps) == "");
      CHECK(ramp_updates_complete(f64[std::size_t(r)].updates, s.stages, s.steps) == "");
      for (const RampUpdate<float> &u : f32[std::size_t(r)].updates)
        CHECK(ramp_bits_differ(u.values, ramp_average<float>(2, u.stage, u.step)) == "");
      for (const RampUpdate<double> &u : f64[std::size_t(r)].updates)
        CHECK(ramp_bits_differ(u.values, ramp_average<double>(2, u.stage, u.step)) == "");
    }
  }
}

TEST_CASE("cyclic/memory/reduce_stream: a kDLCUDA gradient on a HOST handle is INVALID_ARGUMENT, the run goes on") {
  // Both ranks try a device-labelled copy of their first gradient (its
  // pointer is host memory, never dereferenced; the stream is ignored for a
  // HOST handle, any value) before handing over the real one.
  RampSetup s;
  RampRankSetup<double> setup;
  std::vector<std::string> refusals(2);
  setup.hand_over = [&](int rank) -> RampHandOver {
    return [&, rank](flatmem_cyclic_t *h, const flatmem_cyclic_action &a, DLTensor *t) {
      std::string &refusal = refusals[std::size_t(rank)];
      if (a.step == 0 && a.stage == s.stages - 1) {
        std::vector<double> copy(static_cast<const double *>(t->data),
                                 static_cast<const double *>(t->data) + t->shape[0]);
        const std::vector<double> before = copy;
        DLTensor device = *t;
        device.data = copy.data();
        device.device = {kDLCUDA, 0};
        const flatmem_status st = flatmem_cyclic_reduce_stream(h, a.stage, &device, reinterpret_cast<void *>(0x1234));
        refusal = std::string(flatmem_status_string(st)) + ": " + flatmem_last_error();
        if (st == FLATMEM_STATUS_INVALID_ARGUMENT && copy != before) refusal += " [the refused buffer was written]";
      }
      return flatmem_cyclic_reduce_stream(h, a.stage, t, reinterpret_cast<void *>(0x1234));
    };
  };
  const auto ranks = run_ramp_world<double>(s, 2, setup);
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    const std::string &refusal = refusals[std::size_t(r)];
    CHECK_MESSAGE(has(refusal, "FLATMEM_STATUS_INVALID_ARGUMENT: "), refusal);
    CHECK_MESSAGE(has(refusal, "gradient: device type 2"), refusal);
    CHECK_MESSAGE(has(refusal, "options.memory = HOST takes kDLCPU"), refusal);
    CHECK_MESSAGE(!has(refusal, "was written"), refusal);
    REQUIRE_MESSAGE(ranks[std::size_t(r)].error == "", ranks[std::size_t(r)].error);
    CHECK(ramp_updates_complete(ranks[std::size_t(r)].updates, s.stages, s.steps) == "");
    for (const RampUpdate<double> &u : ranks[std::size_t(r)].updates)
      CHECK(ramp_bits_differ(u.values, ramp_average<double>(2, u.stage, u.step)) == "");
  }
}
