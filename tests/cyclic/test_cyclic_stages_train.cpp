// Stage-parallel training on threads (in-process group): L stage ranks with N
// micro-batches equal flatmem_cyclic_t training on N ranks (rank m <->
// micro-batch m) bit for bit, fp32 and fp64, DELAY1 and NEWEST; SYNC equals
// the single-process simulation of the rule bitwise (both add micro-batches
// 0, 1, ..., N-1 in order), the data-parallel runtime bitwise where its ring
// adds in that order too (N <= 2), and plain SGD on the concatenated batch
// within rounding. The accounting against the schedule.
#include <doctest/doctest.h>

#include <cmath>

#include "cyclic/local_run.hpp"
#include "support/stage_train.hpp"

using namespace test;

namespace {


std::string describe(const TrainSetup &s, int n) {
  return "L " + std::to_string(s.stages()) + ", N " + std::to_string(n) + ", steps " +
         std::to_string(s.steps) + ", rule " + std::to_string(int(s.rule));
}

// Stage j's parameters and the last stage's losses against per-rank models and losses.
template <typename T>
void check_equal(const StageTraining<T> &got, const std::vector<RankRun<T>> &want, const TrainSetup &setup) {
  const int L = setup.stages();
  for (int j = 0; j < L; ++j)
    for (std::size_t r = 0; r < want.size(); ++r) {
      CAPTURE(j);
      CAPTURE(r);
      CHECK(got.runs[std::size_t(j)].params == want[r].model.params[std::size_t(j)]);
    }
  const auto &losses = got.runs[std::size_t(L - 1)].losses;
  REQUIRE(losses.size() == want.size());
  for (std::size_t m = 0; m < want.size(); ++m) CHECK(losses[m] == want[m].losses);
}

template <typename T>
StageTraining<T> train_ok(const TrainSetup &setup, int n) {
  StageTraining<T> got = train_stages_local<T>(setup, n);
  for (int j = 0; j < setup.stages(); ++j) REQUIRE_MESSAGE(got.errors[std::size_t(j)] == "", got.errors[std::size_t(j)]);
  return got;
}

template <typename T>
void check_against_data_parallel(const TrainSetup &setup, int n) {
  CAPTURE(describe(setup, n));
  const StageTraining<T> got = train_ok<T>(setup, n);
  if (setup.rule != FLATMEM_CYCLIC_SYNC || n <= 2) {
    const LocalTraining<T> dp = train_local<T>(setup, n);
    for (int r = 0; r < n; ++r) REQUIRE_MESSAGE(dp.errors[std::size_t(r)] == "", dp.errors[std::size_t(r)]);
    check_equal(got, dp.runs, setup);
  }
  // The simulation of the rule (micro-batch order sums) for every rule.
  check_equal(got, simulate<T>(setup, n), setup);
}

}  // namespace

TEST_CASE("cyclic_stages/train/equals data-parallel cyclic training on N ranks, bit for bit") {
  for (flatmem_cyclic_rule rule : {FLATMEM_CYCLIC_DELAY1, FLATMEM_CYCLIC_NEWEST, FLATMEM_CYCLIC_SYNC})
    for (int L : {2, 3, 4})
      for (int n : {1, 2, L, 2 * L}) {
        check_against_data_parallel<double>(mlp_setup(L, 4, rule), n);
        check_against_data_parallel<float>(mlp_setup(L, 4, rule), n);
      }
  // Awkward sizes: one stage, N not dividing 2L, N > 2L, one step.
  for (flatmem_cyclic_rule rule : {FLATMEM_CYCLIC_DELAY1, FLATMEM_CYCLIC_NEWEST, FLATMEM_CYCLIC_SYNC}) {
    check_against_data_parallel<double>(mlp_setup(1, 3, rule), 3);
    check_against_data_parallel<double>(mlp_setup(4, 5, rule), 3);
    check_against_data_parallel<double>(mlp_setup(3, 5, rule), 7);
    check_against_data_parallel<float>(mlp_setup(4, 1, rule), 5);
  }
}

TEST_CASE("cyclic_stages/train/SYNC equals plain SGD on the concatenated batch") {
  // The concatenated batch divides by N rows once in dL/dprediction, the
  // micro-batches by rows and then by N in the average, and adds the rows in
  // another order: rounding only. 4 steps of SGD with lr 0.1 on O(1) values in
  // double keep the difference near 1e-15; bounded by 1e-12 as the
  // data-parallel SYNC test.
  for (int L : {2, 3, 4})
    for (int n : {1, 3, 2 * L}) {
      const TrainSetup setup = mlp_setup(L, 4, FLATMEM_CYCLIC_SYNC);
      CAPTURE(describe(setup, n));
      const StageTraining<double> got = train_ok<double>(setup, n);
      const StageMlp<double> want = train_concatenated<double>(setup, n);
      double worst = 0;
      for (int j = 0; j < L; ++j)
        for (std::size_t i = 0; i < want.params[std::size_t(j)].size(); ++i)
          worst = std::max(worst, std::abs(got.runs[std::size_t(j)].params[i] - want.params[std::size_t(j)][i]));
      CHECK(worst < 1e-12);
      // and the training moved the parameters (the comparison means something)
      const StageMlp<double> initial = StageMlp<double>::make(setup.widths, setup.seed);
      CHECK(got.runs[0].params != initial.params[0]);
    }
}

TEST_CASE("cyclic_stages/train/the accounting follows the schedule") {
  const TrainSetup setup = mlp_setup(4, 6, FLATMEM_CYCLIC_DELAY1);
  for (int n : {4, 8}) {
    const StageTraining<double> got = train_ok<double>(setup, n);
    flatmem_cyclic_stages_schedule sc = FLATMEM_CYCLIC_STAGES_SCHEDULE_INIT;
    sc.stages = 4;
    sc.micro_batches = n;
    sc.steps = setup.steps;
    std::int64_t length = 0;
    REQUIRE(flatmem_cyclic_stages_schedule_length(&sc, &length) == FLATMEM_STATUS_SUCCESS);
    for (int j = 0; j < 4; ++j) {
      CAPTURE(j);
      const flatmem_cyclic_stages_summary &s = got.summaries[std::size_t(j)];
      flatmem_cyclic_stages_occupancy o{};
      REQUIRE(flatmem_cyclic_stages_schedule_occupancy(&sc, j, &o, sizeof(flatmem_cyclic_stages_occupancy)) == FLATMEM_STATUS_SUCCESS);
      // 2N actions per step, plus the update-only ones after the last step (1 or 2)
      CHECK(s.actions >= 2 * n * setup.steps + 1);
      CHECK(s.actions <= 2 * n * setup.steps + 2);
      CHECK(s.steady_busy_fraction == 1.0);
      CHECK(s.peak_activations_held == o.peak_activations_held);
      // messages: one per forward to j+1 and one per backward to j-1
      CHECK(s.messages_sent == n * setup.steps * ((j + 1 < 4) + (j > 0)));
      CHECK(s.time_steps <= length);
      // Per time step: the schedule's actions and activations held; bytes of
      // one message (boundary bytes + the 32-byte header) per send.
      const auto &stats = got.stats[std::size_t(j)];
      REQUIRE(std::int64_t(stats.size()) == s.time_steps);
      const std::int64_t message = 32 + std::int64_t(setup.rows) * setup.widths[std::size_t(j) + 1] * 8,
                         message_back = j > 0 ? 32 + std::int64_t(setup.rows) * setup.widths[std::size_t(j)] * 8 : 0;
      std::int64_t busy = 0;
      for (std::size_t t = 0; t < stats.size(); ++t) {
        const auto &r = stats[t];
        CAPTURE(r.time_step);
        CHECK(r.time_step == std::int64_t(t));
        std::int32_t count = 0;
        REQUIRE(flatmem_cyclic_stages_schedule_actions(&sc, j, r.time_step, nullptr, sizeof(flatmem_cyclic_stages_action), 0, &count) == FLATMEM_STATUS_SUCCESS);
        CHECK(r.actions == count);
        busy += count > 0;
        std::vector<flatmem_cyclic_stages_action> acts(static_cast<std::size_t>(count));
        flatmem_cyclic_stages_schedule_actions(&sc, j, r.time_step, acts.data(), sizeof(flatmem_cyclic_stages_action), count, &count);
        std::int64_t bytes = 0;
        for (const auto &a : acts)
          if (a.sends) bytes += a.kind == FLATMEM_CYCLIC_FORWARD ? message : message_back;
        CHECK(r.bytes_sent == bytes);
        if (count > 0 && acts[0].kind != FLATMEM_CYCLIC_IDLE) CHECK(r.activations_held == acts[0].activations_held);
      }
      CHECK(s.busy_fraction == doctest::Approx(double(busy) / double(s.time_steps)));
      MESSAGE("L=4 N=", n, " stage ", j, ": busy ", s.busy_fraction, " of the whole run (steady ",
              s.steady_busy_fraction, "), activations held peak ", s.peak_activations_held, " mean ",
              s.mean_activations_held, ", peak activation bytes ", s.peak_activation_bytes);
    }
  }
}

TEST_CASE("cyclic_stages/train/more micro-batches per time step than staging buffers (N = 300, L = 2)") {
  // 75 micro-batches share each offset, 65 staging buffers per stream: sends
  // wait for earlier ones to be taken within one time step.
  for (flatmem_cyclic_rule rule : {FLATMEM_CYCLIC_DELAY1, FLATMEM_CYCLIC_NEWEST}) {
    const TrainSetup setup = mlp_setup(2, 2, rule);
    CAPTURE(describe(setup, 300));
    check_equal(train_ok<double>(setup, 300), simulate<double>(setup, 300), setup);
  }
}
