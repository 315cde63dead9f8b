// Bad input and failures of the cyclic runtime on threads (in-process
// group): every misuse gets a clear status naming the argument, nothing the
// caller owns is written on error, failures reach every rank within the
// timeout naming the stage, step and peer, and nothing hangs.
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "comm/comm_check.hpp"
#include "support/cyclic_train.hpp"

using namespace test;

namespace {

using Clock = std::chrono::steady_clock;

bool error_has(const char *part) { return std::strstr(flatmem_last_error(), part) != nullptr; }

// A group of `world` local communicators, destroyed at the end.
struct Group {
  std::vector<flatmem_comm_t *> comms;
  explicit Group(int world) : comms(static_cast<std::size_t>(world), nullptr) {
    REQUIRE(flatmem_comm_create_local(comms.data(), world, nullptr) == FLATMEM_STATUS_SUCCESS);
  }
  ~Group() {
    for (flatmem_comm_t *c : comms) flatmem_comm_abort(c);
  }
};

flatmem_cyclic_options options(int stages, std::int64_t steps, flatmem_cyclic_rule rule,
                               std::int64_t timeout_ms = 5000) {
  flatmem_cyclic_options o;
  REQUIRE(flatmem_cyclic_options_init(&o, sizeof(flatmem_cyclic_options)) == FLATMEM_STATUS_SUCCESS);
  o.stages = stages;
  o.steps = steps;
  o.rule = rule;
  o.timeout_ms = timeout_ms;
  return o;
}

DLTensor vec(void *data, std::int64_t *shape, DLDataTypeCode code = kDLFloat, int bits = 64) {
  return test::host_tensor(data, shape, code, bits);
}

flatmem_cyclic_action next_of(flatmem_cyclic_t *h) {
  flatmem_cyclic_action a{};
  REQUIRE_MESSAGE(flatmem_cyclic_next(h, &a, sizeof(flatmem_cyclic_action)) == FLATMEM_STATUS_SUCCESS, flatmem_last_error());
  return a;
}

// A 2-stage, 6-step DELAY1 training of a small MLP, and its handle.
TrainSetup two_stage_setup() {
  TrainSetup setup;
  setup.widths = {3, 4, 2};
  setup.steps = 6;
  return setup;
}
flatmem_cyclic_t *create_for(const TrainSetup &setup, flatmem_comm_t *comm, std::int64_t timeout_ms) {
  flatmem_cyclic_options o = options(setup.stages(), setup.steps, setup.rule, timeout_ms);
  flatmem_cyclic_t *h = nullptr;
  REQUIRE(flatmem_cyclic_create(&h, comm, &o) == FLATMEM_STATUS_SUCCESS);
  return h;
}

// Advances a one-rank handle to its next BACKWARD (handing over nothing).
flatmem_cyclic_action next_backward(flatmem_cyclic_t *h) {
  for (;;) {
    const flatmem_cyclic_action a = next_of(h);
    REQUIRE(a.kind != FLATMEM_CYCLIC_DONE);
    if (a.kind == FLATMEM_CYCLIC_BACKWARD) return a;
  }
}

}  // namespace

TEST_CASE("cyclic/errors/create: bad arguments name the field, out untouched") {
  Group g(1);
  flatmem_cyclic_t *sentinel = reinterpret_cast<flatmem_cyclic_t *>(0x1), *h = sentinel;
  flatmem_cyclic_options o = options(2, 3, FLATMEM_CYCLIC_DELAY1);
  CHECK(flatmem_cyclic_create(nullptr, g.comms[0], &o) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(error_has("out"));
  CHECK(flatmem_cyclic_create(&h, nullptr, &o) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(error_has("comm"));
  CHECK(flatmem_cyclic_create(&h, g.comms[0], nullptr) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(error_has("options"));
  struct Case {
    const char *field;
    void (*spoil)(flatmem_cyclic_options &);
  };
  static std::int64_t negative_bytes[2] = {10, -1};
  const Case cases[] = {
      {"struct_size", [](flatmem_cyclic_options &x) { x.struct_size = 0; }},
      {"stages", [](flatmem_cyclic_options &x) { x.stages = 0; }},
      {"stages", [](flatmem_cyclic_options &x) { x.stages = 65536; }},
      {"steps", [](flatmem_cyclic_options &x) { x.steps = 0; }},
      {"rule", [](flatmem_cyclic_options &x) { x.rule = flatmem_cyclic_rule(9); }},
      {"activation_bytes[1]", [](flatmem_cyclic_options &x) { x.activation_bytes = negative_bytes; }},
      {"timeout_ms", [](flatmem_cyclic_options &x) { x.timeout_ms = -5; }},
      {"nonfinite", [](flatmem_cyclic_options &x) { x.nonfinite = flatmem_nonfinite_policy(7); }},
      {"history", [](flatmem_cyclic_options &x) { x.history = -1; }},
  };
  for (const Case &c : cases) {
    CAPTURE(c.field);
    flatmem_cyclic_options bad = options(2, 3, FLATMEM_CYCLIC_DELAY1);
    c.spoil(bad);
    CHECK(flatmem_cyclic_create(&h, g.comms[0], &bad) == FLATMEM_STATUS_INVALID_ARGUMENT);
    CHECK_MESSAGE(error_has(c.field), flatmem_last_error());
    CHECK(h == sentinel);
  }
}

TEST_CASE("cyclic/errors/create: ranks that disagree on the schedule all fail, naming the rank") {
  Group g(3);
  std::vector<flatmem_status> status(3);
  std::vector<std::string> message(3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r)
    threads.emplace_back([&, r] {
      flatmem_cyclic_options o = options(2, r == 2 ? 5 : 4, FLATMEM_CYCLIC_DELAY1);
      flatmem_cyclic_t *h = nullptr;
      status[std::size_t(r)] = flatmem_cyclic_create(&h, g.comms[std::size_t(r)], &o);
      message[std::size_t(r)] = flatmem_last_error();
      flatmem_cyclic_destroy(h);
    });
  for (auto &t : threads) t.join();
  for (int r = 0; r < 3; ++r) {
    CAPTURE(r);
    CHECK(status[std::size_t(r)] == FLATMEM_STATUS_INVALID_ARGUMENT);
    CHECK_MESSAGE(message[std::size_t(r)].find("rank 2 has stages 2, steps 5") != std::string::npos,
                  message[std::size_t(r)]);
  }
}

TEST_CASE("cyclic/errors/reduce and next: misuse is INVALID_ARGUMENT and changes nothing") {
  Group g(1);
  flatmem_cyclic_options o = options(2, 3, FLATMEM_CYCLIC_DELAY1);
  flatmem_cyclic_t *h = nullptr;
  REQUIRE(flatmem_cyclic_create(&h, g.comms[0], &o) == FLATMEM_STATUS_SUCCESS);
  std::vector<double> grad(5, 0.25), other(5, 0.5);
  std::int64_t shape = 5, empty = 0;
  DLTensor t = vec(grad.data(), &shape);

  const flatmem_cyclic_action first = next_of(h);
  REQUIRE(first.kind == FLATMEM_CYCLIC_FORWARD);
  CHECK(flatmem_cyclic_reduce(h, 0, &t) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(error_has("not a BACKWARD"));
  CHECK(flatmem_cyclic_next(nullptr, nullptr, sizeof(flatmem_cyclic_action)) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(flatmem_cyclic_next(h, nullptr, sizeof(flatmem_cyclic_action)) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(error_has("action"));

  const flatmem_cyclic_action back = next_backward(h);
  CHECK(back.stage == 1);
  CHECK(flatmem_cyclic_reduce(h, 0, &t) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(error_has("backward of stage 1"));
  CHECK(flatmem_cyclic_reduce(h, 1, nullptr) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(error_has("gradient"));
  DLTensor ints = vec(grad.data(), &shape, kDLInt, 32);
  CHECK(flatmem_cyclic_reduce(h, 1, &ints) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(error_has("float32 or float64"));
  DLTensor none = vec(grad.data(), &empty);
  CHECK(flatmem_cyclic_reduce(h, 1, &none) == FLATMEM_STATUS_INVALID_ARGUMENT);
  DLTensor on_gpu = t;
  on_gpu.device = {kDLCUDA, 0};
  CHECK(flatmem_cyclic_reduce(h, 1, &on_gpu) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(error_has("options.memory = HOST takes kDLCPU"));
  CHECK(flatmem_cyclic_reduce_stream(h, 1, &on_gpu, nullptr) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(error_has("FLATMEM_CYCLIC_MEMORY_CUDA"));

  // next() before the hand-over: refused, the clock does not move.
  flatmem_cyclic_action a{};
  a.time_step = -77;
  CHECK(flatmem_cyclic_next(h, &a, sizeof(flatmem_cyclic_action)) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(error_has("stage 1, step 0"));
  CHECK(a.time_step == -77);
  REQUIRE(flatmem_cyclic_reduce(h, 1, &t) == FLATMEM_STATUS_SUCCESS);
  CHECK(flatmem_cyclic_reduce(h, 1, &t) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(error_has("already handed over"));

  // The next backward (stage 0, step 0) may not reuse a buffer in flight.
  const flatmem_cyclic_action back0 = next_of(h);
  REQUIRE(back0.kind == FLATMEM_CYCLIC_BACKWARD);
  REQUIRE(back0.time_step == back.time_step + 1);
  DLTensor overlapping = vec(grad.data() + 2, &empty);
  std::int64_t three = 3;
  overlapping.shape = &three;
  CHECK(flatmem_cyclic_reduce(h, 0, &overlapping) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(error_has("still in flight"));
  DLTensor fresh = vec(other.data(), &shape);
  CHECK(flatmem_cyclic_reduce(h, 0, &fresh) == FLATMEM_STATUS_SUCCESS);
  CHECK(grad == std::vector<double>(5, 0.25));  // one rank: the average is the gradient
  REQUIRE(flatmem_cyclic_destroy(h) == FLATMEM_STATUS_SUCCESS);
}

TEST_CASE("cyclic/errors/the schedule ends in DONE, again and again, stats arguments") {
  Group g(1);
  flatmem_cyclic_options o = options(1, 2, FLATMEM_CYCLIC_SYNC);
  flatmem_cyclic_t *h = nullptr;
  REQUIRE(flatmem_cyclic_create(&h, g.comms[0], &o) == FLATMEM_STATUS_SUCCESS);
  std::vector<double> buf(2, 1.0);
  std::int64_t shape = 2;
  DLTensor t = vec(buf.data(), &shape);
  int actions = 0;
  for (;;) {
    const flatmem_cyclic_action a = next_of(h);
    if (a.kind == FLATMEM_CYCLIC_DONE) break;
    ++actions;
    if (a.kind == FLATMEM_CYCLIC_BACKWARD) REQUIRE(flatmem_cyclic_reduce(h, a.stage, &t) == FLATMEM_STATUS_SUCCESS);
  }
  CHECK(actions == 5);  // F B F B, then the update of step 1 before the idle slot of step 2
  CHECK(next_of(h).kind == FLATMEM_CYCLIC_DONE);
  CHECK(next_of(h).kind == FLATMEM_CYCLIC_DONE);
  std::int64_t written = -1;
  flatmem_cyclic_time_step_stats stats[8];
  CHECK(flatmem_cyclic_stats(h, 0, -1, stats, sizeof(flatmem_cyclic_time_step_stats), &written) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(error_has("count"));
  CHECK(flatmem_cyclic_stats(h, 0, 8, nullptr, sizeof(flatmem_cyclic_time_step_stats), &written) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(flatmem_cyclic_stats(h, 0, 8, stats, sizeof(flatmem_cyclic_time_step_stats), nullptr) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(flatmem_cyclic_stats(h, 0, 8, stats, sizeof(flatmem_cyclic_time_step_stats), &written) == FLATMEM_STATUS_SUCCESS);
  CHECK(written == 5);
  CHECK(flatmem_cyclic_stats(h, 3, 8, stats, sizeof(flatmem_cyclic_time_step_stats), &written) == FLATMEM_STATUS_SUCCESS);
  CHECK(written == 2);
  CHECK(stats[0].time_step == 3);
  // The extremes of first / count: no overflow (found by fuzz_cyclic under UBSan).
  const std::int64_t lowest = std::numeric_limits<std::int64_t>::min();
  const std::int64_t highest = std::numeric_limits<std::int64_t>::max();
  CHECK(flatmem_cyclic_stats(h, lowest, 8, stats, sizeof(flatmem_cyclic_time_step_stats), &written) == FLATMEM_STATUS_SUCCESS);
  CHECK(written == 0);
  CHECK(flatmem_cyclic_stats(h, lowest, highest, stats, sizeof(flatmem_cyclic_time_step_stats), &written) == FLATMEM_STATUS_SUCCESS);
  CHECK(written == 0);  // [INT64_MIN, -1): before time step 0
  CHECK(flatmem_cyclic_stats(h, -3, highest, stats, sizeof(flatmem_cyclic_time_step_stats), &written) == FLATMEM_STATUS_SUCCESS);
  CHECK(written == 5);
  CHECK(flatmem_cyclic_stats(h, highest, 8, stats, sizeof(flatmem_cyclic_time_step_stats), &written) == FLATMEM_STATUS_SUCCESS);
  CHECK(written == 0);
  CHECK(flatmem_cyclic_summary_get(h, nullptr, sizeof(flatmem_cyclic_summary)) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(flatmem_cyclic_summary_get(nullptr, nullptr, sizeof(flatmem_cyclic_summary)) == FLATMEM_STATUS_INVALID_ARGUMENT);
  flatmem_cyclic_schedule s{};
  CHECK(flatmem_cyclic_get_schedule(h, &s, sizeof(flatmem_cyclic_schedule)) == FLATMEM_STATUS_SUCCESS);
  // A size below struct_size's own 8 bytes could only receive a truncated struct_size: refused.
  for (std::size_t small = 1; small < sizeof(std::size_t); ++small) {
    unsigned char block[16];
    std::memset(block, 0x5A, sizeof block);
    CHECK(flatmem_cyclic_get_schedule(h, reinterpret_cast<flatmem_cyclic_schedule *>(block), small) ==
          FLATMEM_STATUS_INVALID_ARGUMENT);
    CHECK(std::string(flatmem_last_error()).find("schedule_size") != std::string::npos);
    for (unsigned char byte : block) CHECK(byte == 0x5A);
  }
  CHECK(s.world_size == 1);
  CHECK(s.stages == 1);
  CHECK(s.steps == 2);
  CHECK(s.rule == FLATMEM_CYCLIC_SYNC);
  CHECK(flatmem_cyclic_destroy(h) == FLATMEM_STATUS_SUCCESS);
  CHECK(flatmem_cyclic_destroy(nullptr) == FLATMEM_STATUS_SUCCESS);
}

TEST_CASE("cyclic/errors/history keeps the most recent time steps") {
  Group g(1);
  flatmem_cyclic_options o = options(2, 4, FLATMEM_CYCLIC_DELAY1);
  o.history = 3;
  flatmem_cyclic_t *h = nullptr;
  REQUIRE(flatmem_cyclic_create(&h, g.comms[0], &o) == FLATMEM_STATUS_SUCCESS);
  TrainSetup setup;
  setup.widths = {3, 4, 2};
  setup.steps = 4;
  RankRun<double> run{StageMlp<double>::make(setup.widths, setup.seed), {}};
  REQUIRE(train_rank<double>(h, setup, 0, 1, run) == "");
  flatmem_cyclic_summary summary{};
  REQUIRE(flatmem_cyclic_summary_get(h, &summary, sizeof(flatmem_cyclic_summary)) == FLATMEM_STATUS_SUCCESS);
  flatmem_cyclic_time_step_stats stats[8];
  std::int64_t written = 0;
  REQUIRE(flatmem_cyclic_stats(h, 0, 1000, stats, sizeof(flatmem_cyclic_time_step_stats), &written) == FLATMEM_STATUS_SUCCESS);
  CHECK(written == 3);
  CHECK(stats[2].time_step == summary.time_steps - 1);
  flatmem_cyclic_destroy(h);
}

TEST_CASE("cyclic/errors/a NaN gradient: NON_FINITE naming stage, step and element, the others fail too") {
  Group g(2);
  std::vector<std::string> errors(2);
  std::vector<std::vector<double>> kept(2);  // each rank writes only its own (both reduces fail)
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      flatmem_cyclic_options o = options(2, 3, FLATMEM_CYCLIC_DELAY1, 3000);
      flatmem_cyclic_t *h = nullptr;
      REQUIRE(flatmem_cyclic_create(&h, g.comms[std::size_t(r)], &o) == FLATMEM_STATUS_SUCCESS);
      std::vector<double> grad[2][2];
      std::int64_t shape = 4;
      for (;;) {
        flatmem_cyclic_action a{};
        const flatmem_status st = flatmem_cyclic_next(h, &a, sizeof(flatmem_cyclic_action));
        if (st != FLATMEM_STATUS_SUCCESS) {
          errors[std::size_t(r)] = std::string(flatmem_status_string(st)) + ": " + flatmem_last_error();
          break;
        }
        if (a.kind == FLATMEM_CYCLIC_DONE) break;
        if (a.kind != FLATMEM_CYCLIC_BACKWARD) continue;
        std::vector<double> &buf = grad[a.stage][a.step % 2];
        buf.assign(4, 1.0);
        if (r == 1 && a.step == 1 && a.stage == 0) buf[2] = std::nan("");
        DLTensor t = vec(buf.data(), &shape);
        const flatmem_status st2 = flatmem_cyclic_reduce(h, a.stage, &t);
        if (st2 != FLATMEM_STATUS_SUCCESS) {
          errors[std::size_t(r)] = std::string(flatmem_status_string(st2)) + ": " + flatmem_last_error();
          kept[std::size_t(r)] = buf;
          break;
        }
      }
      flatmem_cyclic_destroy(h);
    });
  for (auto &t : threads) t.join();
  CHECK_MESSAGE(errors[1].find("FLATMEM_STATUS_NON_FINITE: cyclic: rank 1: gradient of stage 0, step 1: element 2") == 0, errors[1]);
  // Rank 1's failed reduce left its gradient as it was: the NaN where it was put.
  REQUIRE(kept[1].size() == 4);
  CHECK(std::isnan(kept[1][2]));
  CHECK(kept[1][0] == 1.0);
  CHECK_MESSAGE(errors[0].find("not finite") != std::string::npos, errors[0]);
}

TEST_CASE("cyclic/errors/a wedged rank: the waiting rank times out naming stage, step and peer") {
  Group g(2);
  std::string error;
  double took = 0;
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      const TrainSetup setup = two_stage_setup();
      flatmem_cyclic_t *h = create_for(setup, g.comms[std::size_t(r)], 500);
      RankRun<double> run{StageMlp<double>::make(setup.widths, setup.seed), {}};
      if (r == 1) {
        // Rank 1 stops after its first forward and sits there for 2 s.
        flatmem_cyclic_action a{};
        do REQUIRE(flatmem_cyclic_next(h, &a, sizeof(flatmem_cyclic_action)) == FLATMEM_STATUS_SUCCESS);
        while (a.kind != FLATMEM_CYCLIC_FORWARD);
        std::this_thread::sleep_for(std::chrono::seconds(2));
      } else {
        const auto start = Clock::now();
        error = train_rank<double>(h, setup, 0, 2, run);
        took = std::chrono::duration<double>(Clock::now() - start).count();
      }
      flatmem_cyclic_destroy(h);
    });
  for (auto &t : threads) t.join();
  CHECK_MESSAGE(error.find("FLATMEM_STATUS_TIMEOUT") != std::string::npos, error);
  CHECK_MESSAGE(error.find("stage ") != std::string::npos, error);
  CHECK_MESSAGE(error.find("step 0") != std::string::npos, error);
  CHECK_MESSAGE(error.find("rank 1") != std::string::npos, error);
  CHECK(took < 1.9);  // 500 ms after its wait began, long before rank 1 woke up
}

TEST_CASE("cyclic/errors/destroying a handle with reductions in flight fails the peers at once") {
  Group g(2);
  std::string error;
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      const TrainSetup setup = two_stage_setup();
      flatmem_cyclic_t *h = create_for(setup, g.comms[std::size_t(r)], 20000);
      RankRun<double> run{StageMlp<double>::make(setup.widths, setup.seed), {}};
      if (r == 0) {
        // Give up after the third backward: destroy the handle while the
        // gradient buffers (train_rank's) are still alive, then leave.
        int backwards = 0;
        flatmem_status destroyed = FLATMEM_STATUS_INTERNAL;
        const ActionHook stop = [&](const flatmem_cyclic_action &a) {
          if (a.kind == FLATMEM_CYCLIC_BACKWARD && ++backwards == 3) {
            destroyed = flatmem_cyclic_destroy(h);
            throw 0;
          }
        };
        try {
          train_rank<double>(h, setup, 0, 2, run, stop);
        } catch (int) {
        }
        CHECK(destroyed == FLATMEM_STATUS_SUCCESS);
      } else {
        const auto start = Clock::now();
        error = train_rank<double>(h, setup, 1, 2, run);
        CHECK(std::chrono::duration<double>(Clock::now() - start).count() < 5.0);
        flatmem_cyclic_destroy(h);
      }
    });
  for (auto &t : threads) t.join();
  CHECK_MESSAGE(error.find("destroyed with reductions in flight") != std::string::npos, error);
}
