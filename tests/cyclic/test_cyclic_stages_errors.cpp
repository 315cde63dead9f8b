// The stage-parallel handle refusing what it must refuse, on threads over an
// in-process group: bad options (naming the field), options that differ
// between ranks, calls out of order, sizes that do not match, device
// tensors; a stage that stops calling next (its neighbours fail within the
// timeout naming stage, micro-batch, step and what they waited for); a handle
// destroyed mid-run (its neighbours fail naming it).
#include <doctest/doctest.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "support/stage_train.hpp"

using namespace test;

namespace {

using Clock = std::chrono::steady_clock;

bool contains(const std::string &text, const char *part) { return text.find(part) != std::string::npos; }

TrainSetup small(int stages, std::int64_t steps = 3) {
  TrainSetup s;
  s.widths = {4};
  for (int j = 0; j < stages; ++j) s.widths.push_back(3 + j);
  s.rows = 2;
  s.steps = steps;
  return s;
}

DLTensor doubles(double *data, std::int64_t *shape) {
  DLTensor t{};
  t.data = data;
  t.device = {kDLCPU, 0};
  t.ndim = 1;
  t.dtype = {kDLFloat, 64, 1};
  t.shape = shape;
  return t;
}

// Handles of `world` stage ranks over an in-process group, created on threads
// (create is collective); options per rank from `options(rank)`.
struct Group {
  std::vector<flatmem_comm_t *> comms;
  std::vector<flatmem_cyclic_stages_t *> handles;
  std::vector<flatmem_status> created;
  std::vector<std::string> messages;
  Group(int world, const std::function<StageOptions(int)> &options) {
    comms.assign(std::size_t(world), nullptr);
    handles.assign(std::size_t(world), nullptr);
    created.assign(std::size_t(world), FLATMEM_STATUS_SUCCESS);
    messages.assign(std::size_t(world), "");
    REQUIRE(flatmem_comm_create_local(comms.data(), world, nullptr) == FLATMEM_STATUS_SUCCESS);
    std::vector<std::thread> threads;
    for (int r = 0; r < world; ++r)
      threads.emplace_back([&, r] {
        StageOptions o = options(r);
        created[std::size_t(r)] = flatmem_cyclic_stages_create(&handles[std::size_t(r)], comms[std::size_t(r)], &o.options);
        messages[std::size_t(r)] = flatmem_last_error();
      });
    for (auto &t : threads) t.join();
  }
  ~Group() {
    for (auto *h : handles) flatmem_cyclic_stages_destroy(h);
    for (auto *c : comms) flatmem_comm_destroy(c);
  }
};

void refused(flatmem_status got, flatmem_status want, const char *word) {
  CHECK(got == want);
  CHECK_MESSAGE(contains(flatmem_last_error(), word), flatmem_last_error());
}

}  // namespace

TEST_CASE("cyclic_stages/errors/bad options are refused naming the field") {
  std::vector<flatmem_comm_t *> comms(2, nullptr);
  REQUIRE(flatmem_comm_create_local(comms.data(), 2, nullptr) == FLATMEM_STATUS_SUCCESS);
  const TrainSetup setup = small(2);
  flatmem_cyclic_stages_t *h = nullptr;
  const auto with = [&](const std::function<void(StageOptions &)> &change, const char *word) {
    StageOptions o = stage_options(setup, 2, sizeof(double), 1000);
    change(o);
    CAPTURE(word);
    refused(flatmem_cyclic_stages_create(&h, comms[0], &o.options), FLATMEM_STATUS_INVALID_ARGUMENT, word);
    CHECK(h == nullptr);
  };
  refused(flatmem_cyclic_stages_create(&h, comms[0], nullptr), FLATMEM_STATUS_INVALID_ARGUMENT, "options");
  refused(flatmem_cyclic_stages_create(nullptr, comms[0], nullptr), FLATMEM_STATUS_INVALID_ARGUMENT, "out");
  refused(flatmem_cyclic_stages_create(&h, nullptr, nullptr), FLATMEM_STATUS_INVALID_ARGUMENT, "comm");
  with([](StageOptions &o) { o.options.struct_size = 0; }, "struct_size");
  with([](StageOptions &o) { o.options.stages = 3; }, "options.stages");
  with([](StageOptions &o) { o.options.stages = 0; }, "options.stages");
  with([](StageOptions &o) { o.options.micro_batches = 0; }, "options.micro_batches");
  with([](StageOptions &o) { o.options.micro_batches = 65536; }, "options.micro_batches");
  with([](StageOptions &o) { o.options.steps = 0; }, "options.steps");
  with([](StageOptions &o) { o.options.rule = flatmem_cyclic_rule(9); }, "options.rule");
  with([](StageOptions &o) { o.options.boundary_bytes = nullptr; }, "options.boundary_bytes");
  with([](StageOptions &o) { o.boundary_bytes[0] = -1; }, "options.boundary_bytes[0]");
  with([](StageOptions &o) { o.boundary_bytes[0] = std::int64_t(1) << 50; }, "options.boundary_bytes[0]");
  with([](StageOptions &o) { o.activation_bytes[1] = -5; }, "options.activation_bytes[1]");
  with([](StageOptions &o) { o.options.timeout_ms = -1; }, "options.timeout_ms");
  with([](StageOptions &o) { o.options.history = -1; }, "options.history");
  flatmem_cyclic_stages_options init{};
  REQUIRE(flatmem_cyclic_stages_options_init(&init, sizeof(flatmem_cyclic_stages_options)) == FLATMEM_STATUS_SUCCESS);
  CHECK(init.struct_size == sizeof init);
  CHECK(init.rule == FLATMEM_CYCLIC_DELAY1);
  for (auto *c : comms) flatmem_comm_destroy(c);
}

TEST_CASE("cyclic_stages/errors/ranks that disagree are named on every rank") {
  const TrainSetup setup = small(2);
  Group g(2, [&](int r) {
    StageOptions o = stage_options(setup, 2, sizeof(double), 2000);
    if (r == 1) {
      o.options.steps = 4;
    }
    return o;
  });
  for (int r = 0; r < 2; ++r) {
    CHECK(g.created[std::size_t(r)] == FLATMEM_STATUS_INVALID_ARGUMENT);
    CHECK_MESSAGE(contains(g.messages[std::size_t(r)], "rank 1 has"), g.messages[std::size_t(r)]);
  }
  Group b(2, [&](int r) {
    StageOptions o = stage_options(setup, 2, sizeof(double), 2000);
    if (r == 1) o.boundary_bytes[0] += 8;
    return o;
  });
  for (int r = 0; r < 2; ++r) {
    CHECK(b.created[std::size_t(r)] == FLATMEM_STATUS_INVALID_ARGUMENT);
    CHECK_MESSAGE(contains(b.messages[std::size_t(r)], "options.boundary_bytes[0]: rank 1"), b.messages[std::size_t(r)]);
  }
}

TEST_CASE("cyclic_stages/errors/calls out of order, wrong sizes and device tensors are refused") {
  // L = 2, N = 1: stage 0 forward (sends), stage 1 forward (receives), ...
  const TrainSetup setup = small(2, 2);
  Group g(2, [&](int) { return stage_options(setup, 1, sizeof(double), 3000); });
  REQUIRE(g.created[0] == FLATMEM_STATUS_SUCCESS);
  REQUIRE(g.created[1] == FLATMEM_STATUS_SUCCESS);
  flatmem_cyclic_stages_t *h0 = g.handles[0];
  const std::int64_t boundary = std::int64_t(setup.rows) * setup.widths[1];  // doubles
  std::vector<double> act(std::size_t(boundary), 1.5), big(std::size_t(boundary) + 1, 0.0);
  std::int64_t shape = boundary, big_shape = boundary + 1;
  DLTensor t = doubles(act.data(), &shape), tb = doubles(big.data(), &big_shape);
  // Before the first next: nothing to send.
  refused(flatmem_cyclic_stages_send(h0, &t), FLATMEM_STATUS_INVALID_ARGUMENT, "sends nothing");
  flatmem_cyclic_stages_action a{};
  REQUIRE(flatmem_cyclic_stages_next(h0, &a, sizeof(flatmem_cyclic_stages_action)) == FLATMEM_STATUS_SUCCESS);
  REQUIRE(a.kind == FLATMEM_CYCLIC_FORWARD);
  CHECK(a.sends == 1);
  CHECK(a.receives == 0);
  refused(flatmem_cyclic_stages_receive(h0, &t), FLATMEM_STATUS_INVALID_ARGUMENT, "receives nothing");
  refused(flatmem_cyclic_stages_accumulate(h0, &t), FLATMEM_STATUS_INVALID_ARGUMENT, "not a BACKWARD");
  refused(flatmem_cyclic_stages_average(h0, &t), FLATMEM_STATUS_INVALID_ARGUMENT, "no update");
  refused(flatmem_cyclic_stages_next(h0, &a, sizeof(flatmem_cyclic_stages_action)), FLATMEM_STATUS_INVALID_ARGUMENT, "flatmem_cyclic_stages_send");
  refused(flatmem_cyclic_stages_send(h0, &tb), FLATMEM_STATUS_INVALID_ARGUMENT, "options.boundary_bytes[0]");
  refused(flatmem_cyclic_stages_send(h0, nullptr), FLATMEM_STATUS_INVALID_ARGUMENT, "tensor");
  DLTensor device = t;
  device.device = {kDLCUDA, 0};
  refused(flatmem_cyclic_stages_send(h0, &device), FLATMEM_STATUS_INVALID_ARGUMENT, "options.memory = HOST");
  refused(flatmem_cyclic_stages_send_stream(h0, &device, nullptr), FLATMEM_STATUS_INVALID_ARGUMENT,
          "FLATMEM_CYCLIC_MEMORY_CUDA");
  REQUIRE(flatmem_cyclic_stages_send(h0, &t) == FLATMEM_STATUS_SUCCESS);  // not poisoned by the refusals
  refused(flatmem_cyclic_stages_send(h0, &t), FLATMEM_STATUS_INVALID_ARGUMENT, "already sent");
  // Stage 1 receives into one element too many: both sizes named, nothing written, poisoned.
  flatmem_cyclic_stages_t *h1 = g.handles[1];
  REQUIRE(flatmem_cyclic_stages_next(h1, &a, sizeof(flatmem_cyclic_stages_action)) == FLATMEM_STATUS_SUCCESS);
  REQUIRE(a.receives == 1);
  const std::vector<double> before = big;
  const flatmem_status st = flatmem_cyclic_stages_receive(h1, &tb);
  CHECK(st == FLATMEM_STATUS_INVALID_ARGUMENT);
  const std::string message = flatmem_last_error();
  CHECK_MESSAGE(contains(message, std::to_string(boundary * 8).c_str()), message);
  CHECK_MESSAGE(contains(message, std::to_string((boundary + 1) * 8).c_str()), message);
  CHECK_MESSAGE(contains(message, "stage 1, micro-batch 0, step 0"), message);
  CHECK(big == before);
  refused(flatmem_cyclic_stages_next(h1, &a, sizeof(flatmem_cyclic_stages_action)), FLATMEM_STATUS_COMM_POISONED, "failed earlier");
  // Stage 0's next wait (the gradient from stage 1) fails at once: the group is poisoned.
  REQUIRE(flatmem_cyclic_stages_next(h0, &a, sizeof(flatmem_cyclic_stages_action)) == FLATMEM_STATUS_SUCCESS);  // its backward
  REQUIRE(a.kind == FLATMEM_CYCLIC_BACKWARD);
  const auto begun = Clock::now();
  CHECK(flatmem_cyclic_stages_receive(h0, &t) != FLATMEM_STATUS_SUCCESS);
  CHECK(std::chrono::duration<double>(Clock::now() - begun).count() < 2.0);
}

TEST_CASE("cyclic_stages/errors/accumulate and average check dtype and size") {
  const TrainSetup setup = small(1, 2);
  Group g(1, [&](int) { return stage_options(setup, 2, sizeof(double), 1000); });
  flatmem_cyclic_stages_t *h = g.handles[0];
  flatmem_cyclic_stages_action a{};
  std::vector<double> grad(5, 1.0), out(5, 0.0);
  std::vector<float> as_float(5, 1.0f);
  std::vector<int32_t> ints(5, 1);
  std::int64_t five = 5, four = 4;
  DLTensor g5 = doubles(grad.data(), &five), g4 = doubles(grad.data(), &four);
  DLTensor f5 = g5;
  f5.data = as_float.data();
  f5.dtype = {kDLFloat, 32, 1};
  DLTensor i5 = g5;
  i5.data = ints.data();
  i5.dtype = {kDLInt, 32, 1};
  // forward m0, forward m1, backward m0 ... (L = 1, N = 2: offsets 0 and 1)
  int backwards = 0;
  for (;;) {
    REQUIRE(flatmem_cyclic_stages_next(h, &a, sizeof(flatmem_cyclic_stages_action)) == FLATMEM_STATUS_SUCCESS);
    if (a.kind == FLATMEM_CYCLIC_DONE) break;
    if (a.update_step >= 0) {
      refused(flatmem_cyclic_stages_average(h, &g4), FLATMEM_STATUS_INVALID_ARGUMENT, "out");
      REQUIRE(flatmem_cyclic_stages_average(h, &g5) == FLATMEM_STATUS_SUCCESS);
      CHECK(grad[0] == 1.0);
    }
    if (a.kind != FLATMEM_CYCLIC_BACKWARD) continue;
    if (backwards++ == 0) {
      refused(flatmem_cyclic_stages_accumulate(h, &i5), FLATMEM_STATUS_INVALID_ARGUMENT, "float32 or float64");
      REQUIRE(flatmem_cyclic_stages_accumulate(h, &g5) == FLATMEM_STATUS_SUCCESS);
      refused(flatmem_cyclic_stages_accumulate(h, &g5), FLATMEM_STATUS_INVALID_ARGUMENT, "already");
    } else {
      refused(flatmem_cyclic_stages_next(h, &a, sizeof(flatmem_cyclic_stages_action)), FLATMEM_STATUS_INVALID_ARGUMENT, "flatmem_cyclic_stages_accumulate");
      refused(flatmem_cyclic_stages_accumulate(h, &g4), FLATMEM_STATUS_INVALID_ARGUMENT, "first gradient had 5");
      refused(flatmem_cyclic_stages_accumulate(h, &f5), FLATMEM_STATUS_INVALID_ARGUMENT, "first gradient had 5");
      REQUIRE(flatmem_cyclic_stages_accumulate(h, &g5) == FLATMEM_STATUS_SUCCESS);
    }
  }
  CHECK(backwards == 4);
  // DONE again, and destroy after DONE is quiet.
  REQUIRE(flatmem_cyclic_stages_next(h, &a, sizeof(flatmem_cyclic_stages_action)) == FLATMEM_STATUS_SUCCESS);
  CHECK(a.kind == FLATMEM_CYCLIC_DONE);
}

TEST_CASE("cyclic_stages/errors/a stage that stops calling next: its neighbours fail within the timeout") {
  // L = 3, N = 3, DELAY1, timeout 1 s. Stage 1 stops after its forward of
  // micro-batch 1 in step 1 (and sleeps 3 s): stage 2 waits for the next
  // activation from it, stage 0 for a gradient.
  const TrainSetup setup = small(3, 4);
  const std::int64_t timeout_ms = 1000;
  Clock::time_point stopped{};
  StageTraining<double> got = train_stages_local<double>(setup, 3, timeout_ms, [&](int stage) -> StageHook {
    if (stage != 1) return nullptr;
    return [&](const flatmem_cyclic_stages_action &a) {
      if (a.kind == FLATMEM_CYCLIC_FORWARD && a.micro_batch == 1 && a.step == 1) {
        stopped = Clock::now();
        std::this_thread::sleep_for(std::chrono::seconds(3));
      }
    };
  });
  const double took = std::chrono::duration<double>(Clock::now() - stopped).count();
  CHECK(took < 3.0 + 2.0);
  for (int j : {0, 2}) {
    const std::string &e = got.errors[std::size_t(j)];
    CAPTURE(j);
    CHECK_MESSAGE(contains(e, ("cyclic stages, stage " + std::to_string(j) + ", micro-batch ").c_str()), e);
    CHECK_MESSAGE(contains(e, ", step "), e);
    CHECK_MESSAGE(contains(e, "from stage 1 (rank 1)"), e);
    const bool failed_in_time = contains(e, "TIMEOUT") || contains(e, "PEER_FAILURE");
    CHECK_MESSAGE(failed_in_time, e);
    MESSAGE("stage ", j, ": ", e);
  }
  CHECK_MESSAGE(contains(got.errors[0], "receive the gradient from stage 1"), got.errors[0]);
  CHECK_MESSAGE(contains(got.errors[2], "receive the activation from stage 1"), got.errors[2]);
  CHECK_MESSAGE(got.errors[1] != "", "stage 1 went on as if nothing happened");
}

TEST_CASE("cyclic_stages/errors/a handle destroyed mid-run: the neighbour fails naming it") {
  const TrainSetup setup = small(2, 3);
  Group g(2, [&](int) { return stage_options(setup, 2, sizeof(double), 5000); });
  std::string error;
  const auto begun = Clock::now();
  std::thread other([&] {
    StageRun<double> run;
    error = train_stage<double>(g.handles[0], setup, 2, 0, run);
  });
  flatmem_cyclic_stages_action a{};
  REQUIRE(flatmem_cyclic_stages_next(g.handles[1], &a, sizeof(flatmem_cyclic_stages_action)) == FLATMEM_STATUS_SUCCESS);
  CHECK(flatmem_cyclic_stages_destroy(g.handles[1]) == FLATMEM_STATUS_SUCCESS);
  g.handles[1] = nullptr;
  other.join();
  CHECK(std::chrono::duration<double>(Clock::now() - begun).count() < 4.0);
  CHECK_MESSAGE(contains(error, "stage 1 was destroyed before the end of its schedule"), error);
}
