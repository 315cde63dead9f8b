// Bad input and failures of the ZeRO relay mode on threads (in-process
// group): options that conflict, shards and stages of the wrong size or
// type, calls out of order -- each a clear status naming the argument, the
// handle still usable, nothing of the caller's written -- and a relay that
// never arrives, which fails the waiting ranks within the timeout naming the
// stage, the step and the rank it waited for.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "comm/comm_check.hpp"
#include "cyclic/relay_run.hpp"

using namespace test;

namespace {

using Clock = std::chrono::steady_clock;

bool error_has(const char *part) { return std::strstr(flatmem_last_error(), part) != nullptr; }

struct Group {
  std::vector<flatmem_comm_t *> comms;
  explicit Group(int world) : comms(static_cast<std::size_t>(world), nullptr) {
    REQUIRE(flatmem_comm_create_local(comms.data(), world, nullptr) == FLATMEM_STATUS_SUCCESS);
  }
  ~Group() {
    for (flatmem_comm_t *c : comms) flatmem_comm_abort(c);
  }
};

TrainSetup small() {
  TrainSetup s;
  s.widths = {3, 4, 2};  // stages of 16 and 10 elements
  s.steps = 3;
  return s;
}

DLTensor vec(void *data, std::int64_t *shape, DLDataTypeCode code = kDLFloat, int bits = 64) {
  return test::host_tensor(data, shape, code, bits);
}

// A one-rank relayed handle over small(), shards registered.
struct OneRank {
  Group group{1};
  TrainSetup setup = small();
  CyclicOptions o = relayed_options(setup, sizeof(double), 2000);
  RelayRun<double> run = RelayRun<double>::initial(setup, 0, 1);
  std::vector<std::int64_t> shapes;
  flatmem_cyclic_t *h = nullptr;
  explicit OneRank(bool register_shards = true) {
    REQUIRE(flatmem_cyclic_create(&h, group.comms[0], &o.options) == FLATMEM_STATUS_SUCCESS);
    for (const auto &s : run.shards) shapes.push_back(std::int64_t(s.size()));
    if (!register_shards) return;
    for (int j = 0; j < setup.stages(); ++j) {
      DLTensor t = vec(run.shards[std::size_t(j)].data(), &shapes[std::size_t(j)]);
      REQUIRE(flatmem_cyclic_set_shard(h, j, &t) == FLATMEM_STATUS_SUCCESS);
    }
  }
  ~OneRank() { flatmem_cyclic_destroy(h); }
  flatmem_cyclic_action next() {
    flatmem_cyclic_action a{};
    REQUIRE_MESSAGE(flatmem_cyclic_next(h, &a, sizeof(flatmem_cyclic_action)) == FLATMEM_STATUS_SUCCESS, flatmem_last_error());
    return a;
  }
};

}  // namespace

TEST_CASE("cyclic/relay/errors/create: conflicting options name the field, out untouched") {
  Group g(1);
  const TrainSetup setup = small();
  flatmem_cyclic_t *sentinel = reinterpret_cast<flatmem_cyclic_t *>(0x1), *h = sentinel;
  static std::int64_t zero_count[2] = {16, 0}, huge_count[2] = {(std::int64_t(1) << 40) + 1, 10};
  struct Case {
    const char *field;
    flatmem_status status;
    void (*spoil)(flatmem_cyclic_options &);
  };
  const Case cases[] = {
      {"options.rule: SYNC", FLATMEM_STATUS_INVALID_ARGUMENT, [](flatmem_cyclic_options &x) { x.rule = FLATMEM_CYCLIC_SYNC; }},
      {"options.rule: NEWEST", FLATMEM_STATUS_UNSUPPORTED, [](flatmem_cyclic_options &x) { x.rule = FLATMEM_CYCLIC_NEWEST; }},
      {"options.parameter_count: NULL", FLATMEM_STATUS_INVALID_ARGUMENT, [](flatmem_cyclic_options &x) { x.parameter_count = nullptr; }},
      {"options.parameter_count[1]: 0", FLATMEM_STATUS_INVALID_ARGUMENT, [](flatmem_cyclic_options &x) { x.parameter_count = zero_count; }},
      {"options.parameter_count[0]", FLATMEM_STATUS_INVALID_ARGUMENT, [](flatmem_cyclic_options &x) { x.parameter_count = huge_count; }},
      {"options.parameters: 7", FLATMEM_STATUS_INVALID_ARGUMENT, [](flatmem_cyclic_options &x) { x.parameters = flatmem_cyclic_parameter_mode(7); }},
  };
  for (const Case &c : cases) {
    CAPTURE(c.field);
    CyclicOptions o = relayed_options(setup, sizeof(double));
    c.spoil(o.options);
    CHECK(flatmem_cyclic_create(&h, g.comms[0], &o.options) == c.status);
    CHECK_MESSAGE(error_has(c.field), flatmem_last_error());
    CHECK(h == sentinel);
  }
  // SYNC's reason is spelled out.
  CyclicOptions o = relayed_options(setup, sizeof(double));
  o.options.rule = FLATMEM_CYCLIC_SYNC;
  CHECK(flatmem_cyclic_create(&h, g.comms[0], &o.options) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(error_has("no stagger"));
  // A caller compiled before the relay fields (struct_size without them) gets a replicated handle.
  o = relayed_options(setup, sizeof(double));
  o.options.struct_size = offsetof(flatmem_cyclic_options, parameters);
  REQUIRE(flatmem_cyclic_create(&h, g.comms[0], &o.options) == FLATMEM_STATUS_SUCCESS);
  std::int64_t begin = 0, end = 0;
  CHECK(flatmem_cyclic_shard_range(h, 0, 0, &begin, &end) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(error_has("REPLICATED"));
  flatmem_cyclic_destroy(h);
}

TEST_CASE("cyclic/relay/errors/create: ranks that disagree on the parameter mode or counts all fail") {
  for (int variant : {0, 1}) {
    CAPTURE(variant);
    Group g(2);
    std::vector<flatmem_status> status(2);
    std::vector<std::string> message(2);
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r)
      threads.emplace_back([&, r] {
        TrainSetup setup = small();
        CyclicOptions o = r == 0 || variant == 1 ? relayed_options(setup, sizeof(double), 2000)
                                                 : cyclic_options(setup, sizeof(double), 2000);
        if (r == 1 && variant == 1) o.parameter_count[1] += 1;
        flatmem_cyclic_t *h = nullptr;
        status[std::size_t(r)] = flatmem_cyclic_create(&h, g.comms[std::size_t(r)], &o.options);
        message[std::size_t(r)] = flatmem_last_error();
        flatmem_cyclic_destroy(h);
      });
    for (auto &t : threads) t.join();
    for (int r = 0; r < 2; ++r) {
      CAPTURE(r);
      CHECK(status[std::size_t(r)] == FLATMEM_STATUS_INVALID_ARGUMENT);
      CHECK_MESSAGE(message[std::size_t(r)].find("rank 1 passes other options.parameters / parameter_count") !=
                        std::string::npos,
                    message[std::size_t(r)]);
    }
  }
}

TEST_CASE("cyclic/relay/errors/set_shard and shard_range: wrong size, type, stage, device, nothing registered") {
  OneRank one(false);
  std::vector<double> shard(16);
  std::int64_t n = 15;
  DLTensor t = vec(shard.data(), &n);
  CHECK(flatmem_cyclic_set_shard(one.h, 0, &t) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK_MESSAGE(error_has("shard: 15 elements, but rank 0 owns elements [0, 16) of stage 0"), flatmem_last_error());
  n = 16;
  CHECK(flatmem_cyclic_set_shard(one.h, 2, &t) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(error_has("stage: 2"));
  CHECK(flatmem_cyclic_set_shard(one.h, 0, nullptr) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(error_has("shard"));
  DLTensor ints = vec(shard.data(), &n, kDLInt, 32);
  CHECK(flatmem_cyclic_set_shard(one.h, 0, &ints) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(error_has("shard: dtype"));
  DLTensor device = t;
  device.device = {kDLCUDA, 0};
  CHECK(flatmem_cyclic_set_shard(one.h, 0, &device) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(error_has("shard: device type 2; options.memory = HOST takes kDLCPU"));
  CHECK(flatmem_cyclic_set_shard_stream(one.h, 0, &device, nullptr) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(error_has("options.memory = HOST"));
  // One dtype for every stage.
  std::vector<float> f32(10);
  std::int64_t ten = 10;
  CHECK(flatmem_cyclic_set_shard(one.h, 0, &t) == FLATMEM_STATUS_SUCCESS);
  DLTensor single = vec(f32.data(), &ten, kDLFloat, 32);
  CHECK(flatmem_cyclic_set_shard(one.h, 1, &single) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(error_has("32-bit floats, but the shards registered before are 64-bit"));
  // Stage 1 is still missing: next() refuses without advancing.
  flatmem_cyclic_action a{};
  a.time_step = 99;
  CHECK(flatmem_cyclic_next(one.h, &a, sizeof(flatmem_cyclic_action)) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(error_has("stage 1 has no shard"));
  CHECK(a.time_step == 99);
  // Ranges: the header's formula; bad arguments named.
  std::int64_t begin = -1, end = -1;
  CHECK(flatmem_cyclic_shard_range(one.h, 1, 0, &begin, &end) == FLATMEM_STATUS_SUCCESS);
  CHECK(begin == 0);
  CHECK(end == 10);
  CHECK(flatmem_cyclic_shard_range(one.h, 1, 1, &begin, &end) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(error_has("rank: 1"));
  CHECK(flatmem_cyclic_shard_range(one.h, -1, 0, &begin, &end) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(error_has("stage: -1"));
  CHECK(flatmem_cyclic_shard_range(one.h, 0, 0, nullptr, &end) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(error_has("begin"));
  // Now complete: the first time step.
  std::vector<double> s1(10);
  DLTensor t1 = vec(s1.data(), &ten);
  CHECK(flatmem_cyclic_set_shard(one.h, 1, &t1) == FLATMEM_STATUS_SUCCESS);
  CHECK(one.next().time_step == 0);
}

TEST_CASE("cyclic/relay/errors/parameters: out of order, wrong buffer, missing, the handle stays usable") {
  OneRank one;
  std::vector<double> full(16, -7.0);
  std::int64_t n = 16;
  DLTensor t = vec(full.data(), &n);
  // Before the first time step.
  CHECK(flatmem_cyclic_parameters(one.h, &t) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(error_has("no current time step"));
  const flatmem_cyclic_action a = one.next();
  REQUIRE(a.kind == FLATMEM_CYCLIC_FORWARD);
  REQUIRE(a.stage == 0);
  // Forgetting the parameters: next() refuses, naming the call, and does not advance.
  flatmem_cyclic_action b{};
  CHECK(flatmem_cyclic_next(one.h, &b, sizeof(flatmem_cyclic_action)) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK_MESSAGE(error_has("call flatmem_cyclic_parameters before the FORWARD"), flatmem_last_error());
  // Wrong size / dtype / device: named, nothing written.
  std::int64_t wrong = 10;
  DLTensor small_full = vec(full.data(), &wrong);
  CHECK(flatmem_cyclic_parameters(one.h, &small_full) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK_MESSAGE(error_has("full: 10 elements; stage 0 has 16"), flatmem_last_error());
  std::vector<float> f32(16);
  DLTensor single = vec(f32.data(), &n, kDLFloat, 32);
  CHECK(flatmem_cyclic_parameters(one.h, &single) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(error_has("full: dtype"));
  CHECK(flatmem_cyclic_parameters(one.h, nullptr) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(error_has("full"));
  for (double x : full) CHECK(x == -7.0);
  // Right: version 0 of stage 0, the registered shard (one rank owns it all).
  REQUIRE(flatmem_cyclic_parameters(one.h, &t) == FLATMEM_STATUS_SUCCESS);
  CHECK(full == one.run.shards[0]);
  // Twice: refused (the relay moved on).
  CHECK(flatmem_cyclic_parameters(one.h, &t) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(error_has("already called"));
  // Walk to an IDLE time step (after the last step: the last updates), fetching
  // and handing over gradients on the way; a gradient of the wrong size is named.
  std::vector<std::vector<double>> grads{std::vector<double>(16), std::vector<double>(10)};
  std::vector<double> buffer(16);
  flatmem_cyclic_action now = a;
  bool refused_gradient = false;
  for (;;) {
    now = one.next();
    REQUIRE(now.kind != FLATMEM_CYCLIC_DONE);
    if (now.kind == FLATMEM_CYCLIC_IDLE) break;
    std::int64_t count = std::int64_t(grads[std::size_t(now.stage)].size());
    DLTensor full_stage = vec(buffer.data(), &count);
    REQUIRE(flatmem_cyclic_parameters(one.h, &full_stage) == FLATMEM_STATUS_SUCCESS);
    if (now.kind == FLATMEM_CYCLIC_BACKWARD) {
      if (!refused_gradient) {
        std::int64_t off_by_one = count - 1;
        DLTensor bad = vec(grads[std::size_t(now.stage)].data(), &off_by_one);
        CHECK(flatmem_cyclic_reduce(one.h, now.stage, &bad) == FLATMEM_STATUS_INVALID_ARGUMENT);
        CHECK_MESSAGE(error_has("gradient: "), flatmem_last_error());
        CHECK(error_has("options.parameter_count"));
        refused_gradient = true;
      }
      DLTensor g = vec(grads[std::size_t(now.stage)].data(), &count);
      REQUIRE(flatmem_cyclic_reduce(one.h, now.stage, &g) == FLATMEM_STATUS_SUCCESS);
    }
  }
  CHECK(refused_gradient);
  CHECK(flatmem_cyclic_parameters(one.h, &t) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(error_has("not a FORWARD or BACKWARD"));
  // Statistics: element_size checked; a replicated-only call on the stats of a relayed handle works.
  flatmem_cyclic_relay_time_step rs[4];
  std::int64_t written = -1;
  CHECK(flatmem_cyclic_relay_stats(one.h, 0, 4, rs, 0, &written) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(error_has("element_size"));
  CHECK(written == -1);
  CHECK(flatmem_cyclic_relay_stats(one.h, 0, 4, rs, sizeof rs[0], &written) == FLATMEM_STATUS_SUCCESS);
  CHECK(written == 4);
  // A caller compiled with the first two fields only: elements 16 bytes apart, nothing beyond.
  std::int64_t older[5][2];  // the fifth: past the 4 asked for, must stay untouched
  std::memset(older, 0xff, sizeof older);
  CHECK(flatmem_cyclic_relay_stats(one.h, 1, 4, reinterpret_cast<flatmem_cyclic_relay_time_step *>(older), sizeof older[0],
                                   &written) == FLATMEM_STATUS_SUCCESS);
  CHECK(written == 4);
  for (int i = 0; i < 4; ++i) {
    CHECK(older[i][0] == rs[0].time_step + 1 + i);  // time steps 1 .. 4
    CHECK(older[i][1] >= std::int64_t(one.run.shards[0].size() * 8));  // parameter bytes: at least the shards
  }
  CHECK(older[4][0] == -1);
  CHECK(older[4][1] == -1);
  flatmem_cyclic_relay_summary summary{};
  CHECK(flatmem_cyclic_relay_summary_get(one.h, &summary, 0) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(error_has("summary_size"));
}

TEST_CASE("cyclic/relay/errors/replicated handle: the relay calls are refused, naming the mode") {
  Group g(1);
  CyclicOptions o = cyclic_options(small(), sizeof(double), 2000);
  flatmem_cyclic_t *h = nullptr;
  REQUIRE(flatmem_cyclic_create(&h, g.comms[0], &o.options) == FLATMEM_STATUS_SUCCESS);
  std::vector<double> x(16);
  std::int64_t n = 16;
  DLTensor t = vec(x.data(), &n);
  CHECK(flatmem_cyclic_set_shard(h, 0, &t) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(error_has("REPLICATED"));
  CHECK(flatmem_cyclic_parameters(h, &t) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(error_has("REPLICATED"));
  flatmem_cyclic_relay_time_step rs[1];
  std::int64_t written = 0;
  CHECK(flatmem_cyclic_relay_stats(h, 0, 1, rs, sizeof rs[0], &written) == FLATMEM_STATUS_INVALID_ARGUMENT);
  flatmem_cyclic_relay_summary summary{};
  CHECK(flatmem_cyclic_relay_summary_get(h, &summary, sizeof(flatmem_cyclic_relay_summary)) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(flatmem_cyclic_parameters(nullptr, &t) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(error_has("handle"));
  flatmem_cyclic_destroy(h);
}

TEST_CASE("cyclic/relay/errors/a relay that never arrives: the waiting ranks fail within the timeout, naming it") {
  // 3 ranks, L = 2 (offsets 0, 1, 2), timeout 500 ms. Rank 1 stops calling
  // next() after its FORWARD of stage 0 in step 2: rank 2 waits for the relay
  // of stage 1, step 2 (FORWARD) from rank 1, rank 0 for rank 1's shard of a
  // gather or for rank 1 to take its relays. Both fail within 0.5 s + 1.5 s of
  // slack, naming rank 1; later
  // calls are COMM_POISONED; rank 1 then fails too and destroys its handle.
  TrainSetup setup;
  setup.widths = {3, 5, 2};
  setup.steps = 5;
  const int world = 3;
  Group g(world);
  std::atomic<int> failed{0};
  std::atomic<std::int64_t> stopped_ns{0};
  std::vector<std::string> errors(world), later(world);
  std::vector<double> seconds(world, 0.0);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      CyclicOptions o = relayed_options(setup, sizeof(double), 500);
      flatmem_cyclic_t *h = nullptr;
      if (flatmem_cyclic_create(&h, g.comms[std::size_t(r)], &o.options) != FLATMEM_STATUS_SUCCESS) {
        errors[std::size_t(r)] = std::string("create: ") + flatmem_last_error();
        ++failed;
        return;
      }
      RelayRun<double> run = RelayRun<double>::initial(setup, r, world);
      const ActionHook hook = [&](const flatmem_cyclic_action &a) {
        if (r != 1 || a.kind != FLATMEM_CYCLIC_FORWARD || a.step != 2 || a.stage != 0) return;
        stopped_ns = Clock::now().time_since_epoch().count();
        const auto limit = Clock::now() + std::chrono::seconds(10);  // bounded
        while (failed.load() < 2 && Clock::now() < limit) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      };
      errors[std::size_t(r)] = train_rank_relayed<double>(h, setup, r, world, run, hook);
      const auto now = Clock::now().time_since_epoch().count();
      seconds[std::size_t(r)] = double(now - stopped_ns.load()) * 1e-9;
      if (r != 1) ++failed;
      flatmem_cyclic_action a{};
      later[std::size_t(r)] = flatmem_status_string(flatmem_cyclic_next(h, &a, sizeof(flatmem_cyclic_action)));
      flatmem_cyclic_destroy(h);
    });
  for (auto &t : threads) t.join();
  for (int r : {0, 2}) {
    CAPTURE(r);
    const std::string &e = errors[std::size_t(r)];
    CHECK_MESSAGE((e.find("TIMEOUT") != std::string::npos || e.find("PEER_FAILURE") != std::string::npos), e);
    // Rank 0 waits for rank 1's shard ("... from rank 1") or for rank 1 to take
    // its relays ("rank 1 to take the relay"), whichever comes first.
    CHECK_MESSAGE(e.find("cyclic parameter relay, stage ") != std::string::npos, e);
    CHECK_MESSAGE(e.find("rank 1") != std::string::npos, e);
    CHECK_MESSAGE(seconds[std::size_t(r)] < 2.0, seconds[std::size_t(r)], " s: ", e);
    CHECK(later[std::size_t(r)] == std::string(flatmem_status_string(FLATMEM_STATUS_COMM_POISONED)));
    MESSAGE("rank ", r, " after ", seconds[std::size_t(r)], " s: ", e);
  }
  CHECK_MESSAGE(errors[2].find("cyclic parameter relay, stage 1, step 2 (FORWARD), from rank 1") != std::string::npos,
                errors[2]);
  // TIMEOUT when its own deadline passes first, PEER_FAILURE when rank 0's did
  // (both after 0.5 s); the message names what rank 2 waited for either way.
  CHECK_FALSE(errors[1].empty());  // its communicator was poisoned by the others
}

TEST_CASE("cyclic/relay/errors/a handle destroyed mid-run: the peer fails at once, naming it") {
  // 2 ranks, timeout 5 s. Rank 1 destroys its handle after its first
  // FORWARD of step 1 (relays and gradients in flight): rank 0 must fail with
  // well before its timeout, the message saying why -- also when nothing of
  // rank 1 happens to be in flight (rank 0 still needs its shards).
  TrainSetup setup = small();
  setup.steps = 6;
  Group g(2);
  std::vector<std::string> errors(2);
  std::vector<double> seconds(2, 0.0);
  std::atomic<bool> destroyed{false};
  std::atomic<std::int64_t> destroyed_ns{0};
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      CyclicOptions o = relayed_options(setup, sizeof(double), 5000);
      flatmem_cyclic_t *h = nullptr;
      if (flatmem_cyclic_create(&h, g.comms[std::size_t(r)], &o.options) != FLATMEM_STATUS_SUCCESS) {
        errors[std::size_t(r)] = std::string("create: ") + flatmem_last_error();
        return;
      }
      RelayRun<double> run = RelayRun<double>::initial(setup, r, 2);
      if (r == 1) {
        // Train until the first forward of step 1, then destroy the handle.
        const ActionHook hook = [&](const flatmem_cyclic_action &a) {
          if (a.kind == FLATMEM_CYCLIC_FORWARD && a.step == 1 && !destroyed) {
            destroyed_ns = Clock::now().time_since_epoch().count();
            flatmem_cyclic_destroy(h);
            h = nullptr;
            destroyed = true;
            throw 1;  // leaves train_rank_relayed (the handle is gone)
          }
        };
        try {
          errors[1] = train_rank_relayed<double>(h, setup, r, 2, run, hook);
        } catch (int) {
        }
        return;
      }
      errors[0] = train_rank_relayed<double>(h, setup, r, 2, run);
      seconds[0] = double(Clock::now().time_since_epoch().count() - destroyed_ns.load()) * 1e-9;
      flatmem_cyclic_destroy(h);
    });
  for (auto &t : threads) t.join();
  REQUIRE(destroyed.load());
  // PEER_FAILURE (also when the poisoned communicator refused a relay call
  // first: the first failure reports the cause), never COMM_POISONED first.
  CHECK_MESSAGE(errors[0].find("PEER_FAILURE") != std::string::npos, errors[0]);
  CHECK_MESSAGE(errors[0].find("rank 1 aborted: cyclic handle") != std::string::npos, errors[0]);
  CHECK_MESSAGE(errors[0].find("destroyed") != std::string::npos, errors[0]);
  CHECK_MESSAGE(seconds[0] < 2.0, seconds[0], " s: ", errors[0]);
  MESSAGE("rank 0 after ", seconds[0], " s: ", errors[0]);
}
