// The stage-parallel schedule's closed forms (flatmem_cyclic_stages_schedule_*)
// against a brute-force layout: every micro-batch's 2L phases of every step
// put on a timeline from the definitions in flatmem/cyclic_stages.h, sorted per
// stage (backwards first, then by micro-batch), then checked action by
// action; dependencies, versions (the data-parallel rule's, through
// flatmem_cyclic_schedule_delay), versions_kept (sufficient and minimal, by
// simulating the caller's slots), occupancy and activations held.
#include <doctest/doctest.h>

#include <flatmem/flatmem.h>
#include <flatmem/cyclic_stages.h>

#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <vector>

namespace {

struct Case {
  int L, N;
  std::int64_t S;
  flatmem_cyclic_rule rule;
  std::string name() const {
    return "L=" + std::to_string(L) + " N=" + std::to_string(N) + " S=" + std::to_string(S) +
           " rule=" + std::to_string(int(rule));
  }
  flatmem_cyclic_stages_schedule schedule() const {
    flatmem_cyclic_stages_schedule s = FLATMEM_CYCLIC_STAGES_SCHEDULE_INIT;
    s.stages = L;
    s.micro_batches = N;
    s.steps = S;
    s.rule = rule;
    return s;
  }
};

// One phase on the brute-force timeline.
struct Phase {
  std::int64_t tau;
  bool backward;
  int m;
  std::int64_t s;
  bool operator<(const Phase &o) const {
    // backwards first within a time step, then by micro-batch
    return std::make_tuple(tau, !backward, m) < std::make_tuple(o.tau, !o.backward, o.m);
  }
};

std::int64_t brute_offset(const Case &c, int m) { return std::int64_t(m) * 2 * c.L / c.N; }
std::int64_t brute_period(const Case &c) {
  return 2 * c.L + (c.rule == FLATMEM_CYCLIC_SYNC ? brute_offset(c, c.N - 1) : 0);
}

// stage -> its phases in order
std::vector<std::vector<Phase>> lay_out(const Case &c) {
  std::vector<std::vector<Phase>> per(std::size_t(c.L));
  for (int m = 0; m < c.N; ++m)
    for (std::int64_t s = 0; s < c.S; ++s)
      for (int p = 0; p < 2 * c.L; ++p) {
        const std::int64_t tau = brute_offset(c, m) + brute_period(c) * s + p;
        const bool backward = p >= c.L;
        const int stage = backward ? 2 * c.L - 1 - p : p;
        per[std::size_t(stage)].push_back({tau, backward, m, s});
      }
  for (auto &v : per) std::sort(v.begin(), v.end());
  return per;
}

// The data-parallel rule's delay of rank m at stage j, from the DP schedule queries.
int dp_delay(const Case &c, int m, int j) {
  flatmem_cyclic_schedule dp = FLATMEM_CYCLIC_SCHEDULE_INIT;
  dp.world_size = c.N;
  dp.stages = c.L;
  dp.steps = c.S;
  dp.rule = c.rule;
  int32_t d = -1;
  REQUIRE(flatmem_cyclic_schedule_delay(&dp, m, j, &d) == FLATMEM_STATUS_SUCCESS);
  return d;
}

std::vector<flatmem_cyclic_stages_action> library_actions(const Case &c, int j, std::int64_t length) {
  const flatmem_cyclic_stages_schedule sc = c.schedule();
  std::vector<flatmem_cyclic_stages_action> all;
  for (std::int64_t tau = 0; tau < length + 3; ++tau) {
    int32_t count = -1;
    REQUIRE(flatmem_cyclic_stages_schedule_actions(&sc, j, tau, nullptr, sizeof(flatmem_cyclic_stages_action), 0, &count) == FLATMEM_STATUS_SUCCESS);
    std::vector<flatmem_cyclic_stages_action> here(static_cast<std::size_t>(count));
    int32_t again = -1;
    REQUIRE(flatmem_cyclic_stages_schedule_actions(&sc, j, tau, here.data(), sizeof(flatmem_cyclic_stages_action), count, &again) == FLATMEM_STATUS_SUCCESS);
    REQUIRE(again == count);
    if (tau >= length) REQUIRE(count == 0);
    for (int i = 0; i < count; ++i) {
      CHECK(here[std::size_t(i)].time_step == tau);
      CHECK(here[std::size_t(i)].index_in_time_step == i);
      CHECK(here[std::size_t(i)].actions_in_time_step == count);
    }
    all.insert(all.end(), here.begin(), here.end());
  }
  return all;
}

// Replays the caller's K slots over a stage's actions: "" when every action
// finds its version and every update its source and a complete average.
std::string replay_slots(const Case &c, const std::vector<flatmem_cyclic_stages_action> &acts, int K) {
  std::vector<std::int64_t> slot(std::size_t(K), -1);
  slot[0] = 0;
  std::int64_t formed = 0;
  std::map<std::int64_t, int> backwards;  // step -> backwards done
  for (const auto &a : acts) {
    if (a.update_step >= 0) {
      const std::int64_t u = a.update_step;
      if (u != formed) return "update of step " + std::to_string(u) + " after version " + std::to_string(formed);
      if (backwards[u] != c.N) return "update of step " + std::to_string(u) + " before its average is complete";
      if (slot[std::size_t(u % K)] != u) return "update source " + std::to_string(u) + " overwritten";
      slot[std::size_t((u + 1) % K)] = u + 1;
      formed = u + 1;
      if (a.kind != FLATMEM_CYCLIC_IDLE && a.version != u + 1) return "update not at the first use";
    }
    if (a.kind == FLATMEM_CYCLIC_FORWARD || a.kind == FLATMEM_CYCLIC_BACKWARD) {
      if (slot[std::size_t(a.version % K)] != a.version)
        return "version " + std::to_string(a.version) + " not in its slot at time step " + std::to_string(a.time_step);
      if (a.kind == FLATMEM_CYCLIC_FORWARD && a.version > formed) return "version used before formed";
    }
    if (a.kind == FLATMEM_CYCLIC_BACKWARD) ++backwards[a.step];
  }
  if (formed != c.S || slot[std::size_t(c.S % K)] != c.S) return "version S not formed at the end";
  return "";
}

void check_case(const Case &c) {
  CAPTURE(c.name());
  const flatmem_cyclic_stages_schedule sc = c.schedule();
  const auto brute = lay_out(c);
  std::int64_t length = 0, period = 0;
  REQUIRE(flatmem_cyclic_stages_schedule_length(&sc, &length) == FLATMEM_STATUS_SUCCESS);
  REQUIRE(flatmem_cyclic_stages_schedule_period(&sc, &period) == FLATMEM_STATUS_SUCCESS);
  CHECK(period == brute_period(c));
  // The run ends with stage 0's last backward and its update-only time step.
  CHECK(length == brute[0].back().tau + 2);
  std::map<std::tuple<int, std::int64_t, int, bool>, std::int64_t> when;  // (m, s, stage, backward) -> tau
  for (int j = 0; j < c.L; ++j) {
    CAPTURE(j);
    const auto acts = library_actions(c, j, length);
    std::vector<flatmem_cyclic_stages_action> work;
    for (const auto &a : acts)
      if (a.kind != FLATMEM_CYCLIC_IDLE) work.push_back(a);
    // Each action of the stage exactly once, in the brute-force order.
    REQUIRE(work.size() == brute[std::size_t(j)].size());
    for (std::size_t i = 0; i < work.size(); ++i) {
      const Phase &p = brute[std::size_t(j)][i];
      const auto &a = work[i];
      CAPTURE(i);
      REQUIRE(a.time_step == p.tau);
      REQUIRE(a.kind == (p.backward ? FLATMEM_CYCLIC_BACKWARD : FLATMEM_CYCLIC_FORWARD));
      REQUIRE(a.micro_batch == p.m);
      REQUIRE(a.step == p.s);
      CHECK(a.stage == j);
      // The version: the data-parallel rule's.
      CHECK(a.version == std::max<std::int64_t>(0, p.s - dp_delay(c, p.m, j)));
      CHECK(a.receives == (p.backward ? j + 1 < c.L : j > 0));
      CHECK(a.sends == (p.backward ? j > 0 : j + 1 < c.L));
      CHECK(a.accumulates == (p.backward ? 1 : 0));
      // Activations held: micro-batches between their forward and backward.
      int held = 0;
      for (int m = 0; m < c.N; ++m)
        for (std::int64_t s = 0; s < c.S; ++s) {
          const std::int64_t f = brute_offset(c, m) + brute_period(c) * s + j;
          const std::int64_t b = brute_offset(c, m) + brute_period(c) * s + 2 * c.L - 1 - j;
          held += f <= p.tau && p.tau <= b;
        }
      CHECK(a.activations_held == held);
      when[{p.m, p.s, j, p.backward}] = p.tau;
    }
    // The update-only tail: after the last backward, and nothing else there.
    for (const auto &a : acts)
      if (a.kind == FLATMEM_CYCLIC_IDLE) {
        CHECK(a.time_step == brute[std::size_t(j)].back().tau + 1);
        CHECK(a.update_step >= 0);
      }
    // versions_kept: sufficient, and minimal.
    int32_t K = 0;
    REQUIRE(flatmem_cyclic_stages_schedule_versions_kept(&sc, j, &K) == FLATMEM_STATUS_SUCCESS);
    CHECK(K >= 1);
    CHECK_MESSAGE(replay_slots(c, acts, K) == "", replay_slots(c, acts, K));
    if (K > 1) CHECK_MESSAGE(replay_slots(c, acts, K - 1) != "", "K - 1 slots would do");
    // Occupancy against the brute-force timeline over a full period in steady state.
    if (c.S >= 5) {
      flatmem_cyclic_stages_occupancy o{};
      REQUIRE(flatmem_cyclic_stages_schedule_occupancy(&sc, j, &o, sizeof(flatmem_cyclic_stages_occupancy)) == FLATMEM_STATUS_SUCCESS);
      std::map<std::int64_t, int> per_tau;
      for (const Phase &p : brute[std::size_t(j)]) ++per_tau[p.tau];
      int busy = 0, peak = 0, peak_held = 0;
      std::int64_t held_total = 0;
      for (std::int64_t tau = 2 * period; tau < 3 * period; ++tau) {
        const int n = per_tau.count(tau) ? per_tau[tau] : 0;
        busy += n > 0;
        peak = std::max(peak, n);
        int held = 0;
        for (int m = 0; m < c.N; ++m)
          for (std::int64_t s = 0; s < c.S; ++s) {
            const std::int64_t f = brute_offset(c, m) + period * s + j, b = f + 2 * (c.L - j) - 1;
            held += f <= tau && tau <= b;
          }
        peak_held = std::max(peak_held, held);
        held_total += held;
      }
      CHECK(o.busy_fraction == doctest::Approx(double(busy) / double(period)));
      CHECK(o.peak_actions == peak);
      CHECK(o.peak_activations_held == peak_held);
      CHECK(o.mean_activations_held == doctest::Approx(double(held_total) / double(period)));
      if (c.N == c.L && c.rule != FLATMEM_CYCLIC_SYNC) {
        CHECK(busy == period);  // N = L: every time step busy in steady state
        CHECK(peak == 1);
      }
      if (c.N == 2 * c.L && c.rule != FLATMEM_CYCLIC_SYNC) CHECK(peak == 2);
    }
  }
  // Dependencies: forward of j+1 after forward of j, backward of L-1 after its
  // forward, backward of j after backward of j+1, each at a later time step.
  for (int m = 0; m < c.N; ++m)
    for (std::int64_t s = 0; s < c.S; ++s) {
      for (int j = 0; j + 1 < c.L; ++j) {
        CHECK(when[{m, s, j + 1, false}] > when[{m, s, j, false}]);
        CHECK(when[{m, s, j, true}] > when[{m, s, j + 1, true}]);
      }
      CHECK(when[{m, s, c.L - 1, true}] > when[{m, s, c.L - 1, false}]);
    }
}

}  // namespace

TEST_CASE("cyclic_stages/schedule/closed forms equal the brute-force timeline") {
  for (flatmem_cyclic_rule rule : {FLATMEM_CYCLIC_DELAY1, FLATMEM_CYCLIC_NEWEST, FLATMEM_CYCLIC_SYNC})
    for (int L : {1, 2, 3, 4, 5})
      for (int N : {1, 2, 3, L, 2 * L, 2 * L + 1, 3 * L, 7})
        for (std::int64_t S : {1, 2, 3, 6}) check_case({L, N, S, rule});
}

TEST_CASE("cyclic_stages/schedule/N = L keeps every stage busy, N = 2L twice (L = 4)") {
  for (int N : {4, 8}) {
    flatmem_cyclic_stages_schedule sc = FLATMEM_CYCLIC_STAGES_SCHEDULE_INIT;
    sc.stages = 4;
    sc.micro_batches = N;
    sc.steps = 10;
    for (int j = 0; j < 4; ++j) {
      flatmem_cyclic_stages_occupancy o{};
      REQUIRE(flatmem_cyclic_stages_schedule_occupancy(&sc, j, &o, sizeof(flatmem_cyclic_stages_occupancy)) == FLATMEM_STATUS_SUCCESS);
      CHECK(o.busy_fraction == 1.0);
      CHECK(o.peak_actions == N / 4);
      // mean held = N (2L - 2j) / 2L
      CHECK(o.mean_activations_held == doctest::Approx(double(N) * (8 - 2 * j) / 8));
      MESSAGE("L=4 N=", N, " stage ", j, ": busy ", o.busy_fraction, ", activations held peak ",
              o.peak_activations_held, " mean ", o.mean_activations_held);
    }
  }
}

TEST_CASE("cyclic_stages/schedule/queries refuse bad arguments, naming them") {
  flatmem_cyclic_stages_schedule sc = FLATMEM_CYCLIC_STAGES_SCHEDULE_INIT;
  sc.stages = 3;
  sc.micro_batches = 4;
  sc.steps = 2;
  std::int64_t v = 0;
  int32_t k = 0, count = 0;
  const auto refused = [](flatmem_status st, const char *word) {
    CHECK(st == FLATMEM_STATUS_INVALID_ARGUMENT);
    CHECK_MESSAGE(std::string(flatmem_last_error()).find(word) != std::string::npos, flatmem_last_error());
  };
  refused(flatmem_cyclic_stages_schedule_length(nullptr, &v), "schedule");
  refused(flatmem_cyclic_stages_schedule_length(&sc, nullptr), "time_steps");
  refused(flatmem_cyclic_stages_schedule_offset(&sc, 4, &v), "micro_batch");
  refused(flatmem_cyclic_stages_schedule_versions_kept(&sc, 3, &k), "stage");
  refused(flatmem_cyclic_stages_schedule_actions(&sc, 0, -1, nullptr, sizeof(flatmem_cyclic_stages_action), 0, &count), "time_step");
  refused(flatmem_cyclic_stages_schedule_actions(&sc, 0, 0, nullptr, sizeof(flatmem_cyclic_stages_action), 2, &count), "actions");
  refused(flatmem_cyclic_stages_schedule_actions(&sc, 0, 0, nullptr, sizeof(flatmem_cyclic_stages_action), -1, &count), "capacity");
  flatmem_cyclic_stages_schedule bad = sc;
  bad.micro_batches = 65536;
  refused(flatmem_cyclic_stages_schedule_period(&bad, &v), "micro_batches");
  bad = sc;
  bad.stages = 0;
  refused(flatmem_cyclic_stages_schedule_period(&bad, &v), "stages");
  bad = sc;
  bad.steps = 0;
  refused(flatmem_cyclic_stages_schedule_period(&bad, &v), "steps");
  bad = sc;
  bad.rule = flatmem_cyclic_rule(7);
  refused(flatmem_cyclic_stages_schedule_period(&bad, &v), "rule");
  bad = sc;
  bad.struct_size = 0;
  refused(flatmem_cyclic_stages_schedule_period(&bad, &v), "struct_size");
  // The largest schedule's arithmetic stays in range.
  bad = sc;
  bad.stages = 65535;
  bad.micro_batches = 65535;
  bad.steps = std::int64_t(1) << 40;
  CHECK(flatmem_cyclic_stages_schedule_length(&bad, &v) == FLATMEM_STATUS_SUCCESS);
  CHECK(v > 0);
}
