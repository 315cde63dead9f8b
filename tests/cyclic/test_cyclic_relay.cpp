// The ZeRO relay mode of the cyclic runtime on threads (in-process group):
// training bitwise equal to the replicated DELAY1 mode and to the
// single-process simulation of its rule; the parameter memory and the relay
// traffic per time step against the protocol worked out here; the figures for
// L = 4, N = 4 and 8.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>

#include "cyclic/local_run.hpp"
#include "cyclic/relay_run.hpp"

using namespace test;

namespace {

// Stage sizes out x (in + 1): 7*6 = 42, 4*8 = 32, 6*5 = 30, 3*7 = 21 (no
// multiple of 4, 42 and 30 multiples of 3); tiny() (relay_run.hpp) has a
// middle stage of 2 elements (fewer than N = 3, 4: empty shards).
TrainSetup awkward(int stages, std::int64_t steps) {
  TrainSetup s;
  const std::vector<int> widths{5, 7, 4, 6, 3};
  s.widths.assign(widths.begin(), widths.begin() + stages + 1);
  s.steps = steps;
  s.rows = 3;
  return s;
}

template <typename T>
void check_relayed_equals_replicated(const TrainSetup &setup, int world) {
  CAPTURE(describe(setup, world));
  const RelayTraining<T> relayed = train_local_relayed<T>(setup, world);
  REQUIRE_MESSAGE(relayed.ok(), relayed.first_error());
  const LocalTraining<T> replicated = train_local<T>(setup, world);
  for (int r = 0; r < world; ++r) REQUIRE_MESSAGE(replicated.errors[std::size_t(r)] == "", replicated.errors[std::size_t(r)]);
  const std::vector<RankRun<T>> simulated = simulate<T>(setup, world);
  const StageMlp<T> model = assemble(setup, relayed.runs);
  for (int r = 0; r < world; ++r) {
    CAPTURE(r);
    // DELAY1: every replica ends with the same bits, which the shards make up.
    CHECK(model.params == replicated.runs[std::size_t(r)].model.params);
    CHECK(model.params == simulated[std::size_t(r)].model.params);
    CHECK(relayed.runs[std::size_t(r)].losses == replicated.runs[std::size_t(r)].losses);
    CHECK(relayed.runs[std::size_t(r)].losses == simulated[std::size_t(r)].losses);
  }
}

}  // namespace

TEST_CASE("cyclic/relay/train: RELAYED equals REPLICATED DELAY1 bit for bit (fp64, fp32, N = 1..4)") {
  for (int world : {1, 2, 3, 4}) {
    for (int stages : {1, 2, 4})
      for (std::int64_t steps : {1, 2, 5}) check_relayed_equals_replicated<double>(awkward(stages, steps), world);
    check_relayed_equals_replicated<float>(awkward(4, 5), world);
    check_relayed_equals_replicated<double>(tiny(4), world);
    check_relayed_equals_replicated<float>(tiny(4), world);
  }
  // N > 2L: ranks in lockstep groups share an offset (rank 0 and rank 1 need
  // a stage in the same time step; the relay from rank 0 arrives within it).
  check_relayed_equals_replicated<double>(awkward(2, 4), 5);
  check_relayed_equals_replicated<double>(awkward(1, 3), 6);
}

namespace {

// The protocol of "ZeRO relay" in flatmem/cyclic.h, worked out here from its
// formulas (the DP schedule's actions from flatmem_cyclic_schedule_action,
// tested on its own in test_cyclic_schedule).
struct Protocol {
  TrainSetup setup;
  int world;
  std::size_t element;
  flatmem_cyclic_schedule sched = FLATMEM_CYCLIC_SCHEDULE_INIT;
  std::vector<std::int64_t> count;

  Protocol(const TrainSetup &s, int n, std::size_t e) : setup(s), world(n), element(e) {
    sched.world_size = n;
    sched.stages = s.stages();
    sched.steps = s.steps;
    sched.rule = FLATMEM_CYCLIC_DELAY1;
    for (int j = 0; j < s.stages(); ++j) count.push_back(std::int64_t(s.widths[std::size_t(j) + 1]) * (s.widths[std::size_t(j)] + 1));
  }
  std::int64_t P() const { return 2 * setup.stages(); }
  std::int64_t offset(int r) const { return std::int64_t(r) * P() / world; }
  std::int64_t length() const {
    std::int64_t n = 0;
    REQUIRE(flatmem_cyclic_schedule_length(&sched, &n) == FLATMEM_STATUS_SUCCESS);
    return n;
  }
  flatmem_cyclic_action action(int r, std::int64_t t) const {
    flatmem_cyclic_action a{};
    REQUIRE(flatmem_cyclic_schedule_action(&sched, r, t, &a, sizeof(flatmem_cyclic_action)) == FLATMEM_STATUS_SUCCESS);
    return a;
  }
  static bool computes(const flatmem_cyclic_action &a) {
    return a.kind == FLATMEM_CYCLIC_FORWARD || a.kind == FLATMEM_CYCLIC_BACKWARD;
  }
  std::int64_t shard_bytes(int j, int r) const {
    const ShardRange s = shard_of(std::size_t(count[std::size_t(j)]), r, world);
    return std::int64_t((s.end - s.begin) * element);
  }
  std::int64_t stage_bytes(int j) const { return count[std::size_t(j)] * std::int64_t(element); }
  // T_upd(j, v) = 2L (v + 1) + 2L - 1 - j.
  std::int64_t update_time(int j, std::int64_t v) const { return P() * (v + 1) + P() - 1 - j; }
  // Versions an owner holds inside next(tau): updates at earlier time steps.
  std::int64_t held(int j, std::int64_t tau) const {
    std::int64_t v = 0;
    while (v < setup.steps && update_time(j, v) < tau) ++v;
    return v;
  }
  std::int64_t contribution_time(std::int64_t g) const {
    const flatmem_cyclic_action a = action(0, g);
    const std::int64_t u = std::max<std::int64_t>(0, a.step - 1);
    return g > 0 && held(a.stage, g - 1) == u ? g - 1 : g;
  }
  std::int64_t relay_bytes_sent(int r, std::int64_t tau) const {
    std::int64_t bytes = 0;
    const flatmem_cyclic_action a = action(r, tau);
    if (computes(a) && r + 1 < world) bytes += stage_bytes(a.stage);
    if (r > 0)
      for (std::int64_t g = tau; g <= tau + 1; ++g) {
        const flatmem_cyclic_action gather = action(0, g);
        if (computes(gather) && contribution_time(g) == tau) bytes += shard_bytes(gather.stage, r);
      }
    return bytes;
  }
  std::int64_t all_shards(int r) const {
    std::int64_t b = 0;
    for (int j = 0; j < setup.stages(); ++j) b += shard_bytes(j, r);
    return b;
  }
  // Shards plus the stages posted (one time step before use) and not yet
  // taken by rank r + 1 (which posts one time step before its own use).
  std::int64_t parameter_bytes(int r, std::int64_t tau) const {
    const std::int64_t keep = r + 1 < world ? std::max<std::int64_t>(0, offset(r + 1) - offset(r) - 1) : 0;
    std::int64_t b = all_shards(r);
    for (std::int64_t t = tau - keep; t <= tau + 1; ++t) {
      if (t < 0) continue;
      const flatmem_cyclic_action a = action(r, t);
      if (computes(a)) b += stage_bytes(a.stage);
    }
    return b;
  }
  // Gradient bytes by the protocol: a partial sum at each backward (r < N-1),
  // rank N-1's scatter of the other ranks' shards at its backward.
  std::int64_t gradient_bytes(int r, std::int64_t tau) const {
    const flatmem_cyclic_action a = action(r, tau);
    if (a.kind != FLATMEM_CYCLIC_BACKWARD || world == 1) return 0;
    if (r + 1 < world) return stage_bytes(a.stage);
    std::int64_t b = 0;
    for (int k = 0; k + 1 < world; ++k) b += shard_bytes(a.stage, k);
    return b;
  }
};

}  // namespace

TEST_CASE("cyclic/relay/accounting: updates, parameter bytes and relay bytes per time step follow the protocol") {
  for (int world : {1, 2, 3, 4, 5})
    for (const TrainSetup &setup : {awkward(4, 4), awkward(3, 3), tiny(3)}) {
      CAPTURE(describe(setup, world));
      const Protocol p(setup, world, sizeof(double));
      std::vector<std::vector<flatmem_cyclic_action>> actions(static_cast<std::size_t>(world));
      const RelayTraining<double> got = train_local_relayed<double>(setup, world, 20000, [&](int r) {
        return ActionHook([&, r](const flatmem_cyclic_action &a) { actions[std::size_t(r)].push_back(a); });
      });
      REQUIRE_MESSAGE(got.ok(), got.first_error());
      const std::int64_t length = p.length();
      std::int64_t gathers = 0;
      for (int r = 0; r < world; ++r) {
        CAPTURE(r);
        const auto &relay = got.relay_stats[std::size_t(r)];
        const auto &stats = got.stats[std::size_t(r)];
        REQUIRE(std::int64_t(relay.size()) == length);
        REQUIRE(std::int64_t(actions[std::size_t(r)].size()) == length);
        std::int64_t max_scheduled = 0;
        for (std::int64_t t = 0; t < length; ++t) {
          CAPTURE(t);
          const flatmem_cyclic_action &a = actions[std::size_t(r)][std::size_t(t)];
          // The DP schedule's work; updates at T_upd(j, v) only, on every rank.
          const flatmem_cyclic_action want = p.action(r, t);
          CHECK(a.kind == want.kind);
          CHECK(a.stage == want.stage);
          CHECK(a.step == want.step);
          int update_stage = -1;
          std::int64_t update_step = -1;
          for (int j = 0; j < setup.stages(); ++j)
            for (std::int64_t v = 0; v < setup.steps; ++v)
              if (p.update_time(j, v) == t) update_stage = j, update_step = v;
          CHECK(a.update_stage == update_stage);
          CHECK(a.update_step == update_step);
          CHECK(relay[std::size_t(t)].time_step == t);
          CHECK(relay[std::size_t(t)].relay_bytes_sent == p.relay_bytes_sent(r, t));
          CHECK(relay[std::size_t(t)].parameter_bytes_scheduled == p.parameter_bytes(r, t));
          CHECK(stats[std::size_t(t)].bytes_scheduled == p.gradient_bytes(r, t));
          max_scheduled = std::max(max_scheduled, p.parameter_bytes(r, t));
          if (r == 0 && Protocol::computes(a)) ++gathers;
        }
        // Memory: the shards plus at most K = max(1, D) + 1 full stages
        // (D = the largest offset gap); measured peaks add the shard copies
        // in flight to rank 0 (at most 3, see src/cyclic/relay.cpp).
        const flatmem_cyclic_relay_summary &s = got.summaries[std::size_t(r)];
        std::int64_t gap = 1, largest = 0, replica = 0, largest_shard = 0;
        for (int q = 0; q + 1 < world; ++q) gap = std::max(gap, p.offset(q + 1) - p.offset(q));
        for (int j = 0; j < setup.stages(); ++j) {
          largest = std::max(largest, p.stage_bytes(j));
          largest_shard = std::max(largest_shard, p.shard_bytes(j, r));
          replica += p.stage_bytes(j);
        }
        CHECK(s.shard_bytes == p.all_shards(r));
        CHECK(s.replicated_bytes == replica);
        CHECK(s.staging_buffers == gap + 1);
        CHECK(s.staging_bytes == (gap + 1) * largest);
        CHECK(s.peak_parameter_bytes_scheduled == max_scheduled);
        CHECK(max_scheduled <= s.shard_bytes + s.staging_bytes);
        CHECK(s.peak_parameter_bytes >= s.shard_bytes);
        CHECK(s.peak_parameter_bytes <= s.shard_bytes + s.staging_bytes + 3 * largest_shard);
        std::int64_t sent = 0;
        for (const auto &x : relay) sent += x.relay_bytes_sent;
        CHECK(s.relay_bytes_sent == sent);
      }
      CHECK(gathers == 2 * setup.stages() * setup.steps);
    }
}

namespace {

struct Figures {
  double peak_per_rank = 0, mean_per_rank = 0;  // parameter bytes (scheduled), worst rank / mean over ranks and window
  double replica = 0;
  double max_per_time_step = 0, mean_per_time_step = 0;  // bytes summed over ranks, steady window
};

// Steady state: every rank past its first step, rank 0 not yet done.
template <typename F>
void steady_window(const Protocol &p, F f) {
  for (std::int64_t t = p.offset(p.world - 1) + p.P(); t < p.setup.steps * p.P(); ++t) f(t);
}

Figures relay_figures(const Protocol &p, const RelayTraining<float> &got) {
  Figures f;
  f.replica = double(got.summaries[0].replicated_bytes);
  double sum = 0, count = 0;
  steady_window(p, [&](std::int64_t t) {
    double total = 0;
    for (int r = 0; r < p.world; ++r) {
      const auto &x = got.relay_stats[std::size_t(r)][std::size_t(t)];
      total += double(x.relay_bytes_sent + got.stats[std::size_t(r)][std::size_t(t)].bytes_scheduled);
      f.peak_per_rank = std::max(f.peak_per_rank, double(x.parameter_bytes_scheduled));
      f.mean_per_rank += double(x.parameter_bytes_scheduled);
    }
    f.max_per_time_step = std::max(f.max_per_time_step, total);
    sum += total;
    ++count;
  });
  f.mean_per_time_step = sum / count;
  f.mean_per_rank /= count * p.world;
  return f;
}

Figures replicated_figures(const Protocol &p, const LocalTraining<float> &got) {
  Figures f;
  for (int j = 0; j < p.setup.stages(); ++j) f.replica += double(p.stage_bytes(j));
  f.peak_per_rank = f.mean_per_rank = f.replica;
  double sum = 0, count = 0;
  steady_window(p, [&](std::int64_t t) {
    double total = 0;
    for (int r = 0; r < p.world; ++r) total += double(got.stats[std::size_t(r)][std::size_t(t)].bytes_scheduled);
    f.max_per_time_step = std::max(f.max_per_time_step, total);
    sum += total;
    ++count;
  });
  f.mean_per_time_step = sum / count;
  return f;
}

}  // namespace

TEST_CASE("cyclic/relay/figures: L = 4, N = 4 and 8, equal stages: memory per rank and bytes per time step") {
  TrainSetup setup;
  setup.widths = {16, 16, 16, 16, 16};  // 4 stages of 272 fp32 elements
  setup.rows = 2;
  setup.steps = 8;
  for (int world : {4, 8}) {
    CAPTURE(world);
    const Protocol p(setup, world, sizeof(float));
    const RelayTraining<float> relayed = train_local_relayed<float>(setup, world);
    REQUIRE_MESSAGE(relayed.ok(), relayed.first_error());
    const LocalTraining<float> replicated = train_local<float>(setup, world);
    for (int r = 0; r < world; ++r) REQUIRE(replicated.errors[std::size_t(r)] == "");
    const Figures z = relay_figures(p, relayed), d = replicated_figures(p, replicated);
    double measured_peak = 0;
    for (const auto &s : relayed.summaries) measured_peak = std::max(measured_peak, double(s.peak_parameter_bytes));
    char line[400];
    std::snprintf(line, sizeof line,
                  "L = 4, N = %d: parameter bytes per rank RELAYED peak %.0f (measured %.0f) mean %.0f = "
                  "%.3f / %.3f of the replica %.0f; bytes per time step summed over ranks, steady state: "
                  "RELAYED max %.0f mean %.0f (%.3f), REPLICATED DELAY1 max %.0f mean %.0f (%.3f)",
                  world, z.peak_per_rank, measured_peak, z.mean_per_rank, z.peak_per_rank / z.replica,
                  z.mean_per_rank / z.replica, z.replica, z.max_per_time_step, z.mean_per_time_step,
                  z.max_per_time_step / z.mean_per_time_step, d.max_per_time_step, d.mean_per_time_step,
                  d.max_per_time_step / d.mean_per_time_step);
    MESSAGE(line);
    std::fprintf(stderr, "%s\n", line);
    CHECK(z.max_per_time_step <= 1.25 * z.mean_per_time_step);  // the target
    CHECK(z.peak_per_rank <= z.replica);
  }
}
