// The cyclic runtime between processes over UCX (fork()ed ranks on
// loopback): training equivalence as on threads, and a rank killed in the
// middle of a step -- the others fail within their timeout, naming the stage.
#include <doctest/doctest.h>

#include <signal.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "comm/comm_check.hpp"
#include "support/cyclic_train.hpp"
#include "support/ranks.hpp"

namespace {

using test::RankSetup;
using test::TrainSetup;
using Clock = std::chrono::steady_clock;

TrainSetup small_setup(flatmem_cyclic_rule rule) {
  TrainSetup s;
  s.widths = {5, 7, 4, 6, 3};  // L = 4
  s.rows = 3;
  s.steps = 5;
  s.rule = rule;
  return s;
}

// Trains through UCX and compares this rank's model with the single-process
// reference it computes itself (deterministic, so every process agrees).
template <typename T>
std::string train_and_compare(const RankSetup &s, const TrainSetup &setup) {
  flatmem_comm_t *comm = nullptr;
  RANK_OK(test::create_comm(s, &comm, 20000));
  test::CyclicOptions o = test::cyclic_options(setup, sizeof(T));
  flatmem_cyclic_t *h = nullptr;
  RANK_OK(flatmem_cyclic_create(&h, comm, &o.options));
  test::RankRun<T> run{test::StageMlp<T>::make(setup.widths, setup.seed), {}};
  const std::string error = test::train_rank<T>(h, setup, s.rank, s.world, run);
  RANK_EXPECT(error.empty(), error);
  flatmem_cyclic_summary summary{};
  RANK_OK(flatmem_cyclic_summary_get(h, &summary, sizeof(flatmem_cyclic_summary)));
  RANK_OK(flatmem_cyclic_destroy(h));
  RANK_OK(flatmem_comm_destroy(comm));
  if (setup.rule == FLATMEM_CYCLIC_SYNC) {
    // Ring vs concatenated-batch summation order: rounding only (double).
    const test::StageMlp<T> want = test::train_concatenated<T>(setup, s.world);
    for (std::size_t j = 0; j < want.params.size(); ++j)
      for (std::size_t i = 0; i < want.params[j].size(); ++i)
        RANK_EXPECT(std::abs(double(run.model.params[j][i]) - double(want.params[j][i])) < 1e-12,
                    "stage " << j << " parameter " << i << ": " << run.model.params[j][i] << " vs " << want.params[j][i]);
  } else {
    const auto want = test::simulate<T>(setup, s.world);
    RANK_EXPECT(run.model.params == want[std::size_t(s.rank)].model.params,
                "parameters differ from the simulation of the rule");
    RANK_EXPECT(run.losses == want[std::size_t(s.rank)].losses, "losses differ from the simulation");
  }
  RANK_EXPECT(summary.bytes_sent > 0 || s.world == 1, "no bytes sent");
  return "";
}

void check_ranks(int world, const test::Scenario &scenario) {
  const auto outcomes = test::run_ranks(world, scenario, std::chrono::seconds(90), "tcp,self,posix");
  const std::string failed = test::failures(outcomes);
  CHECK_MESSAGE(failed.empty(), failed);
}

bool contains(const char *text, const char *part) { return std::strstr(text, part) != nullptr; }

}  // namespace

TEST_CASE("cyclic/ucx/training over UCX equals the references (2-4 processes)") {
  for (int world : {2, 3, 4})
    for (flatmem_cyclic_rule rule : {FLATMEM_CYCLIC_DELAY1, FLATMEM_CYCLIC_NEWEST, FLATMEM_CYCLIC_SYNC}) {
      CAPTURE(world);
      CAPTURE(int(rule));
      check_ranks(world, [rule](const RankSetup &s) {
        return train_and_compare<double>(s, small_setup(rule));
      });
    }
  check_ranks(3, [](const RankSetup &s) {
    return train_and_compare<float>(s, small_setup(FLATMEM_CYCLIC_NEWEST));
  });
}

TEST_CASE("cyclic/ucx/a rank killed mid-step: the others fail within the timeout, naming the stage") {
  // 3 ranks, DELAY1, timeout 3 s. Rank 1 dies after its forward of stage 2 in
  // step 2: rank 0 waits for averages that need rank 1, rank 2 for partial sums
  // from it. Both must return an error naming a stage within 3 s + 2 s of slack.
  const auto outcomes = test::run_ranks(3, [](const RankSetup &s) -> std::string {
    TrainSetup setup = small_setup(FLATMEM_CYCLIC_DELAY1);
    setup.steps = 8;
    flatmem_comm_t *comm = nullptr;
    RANK_OK(test::create_comm(s, &comm, 3000));
    test::CyclicOptions o = test::cyclic_options(setup, sizeof(double), 3000);
    flatmem_cyclic_t *h = nullptr;
    RANK_OK(flatmem_cyclic_create(&h, comm, &o.options));
    test::RankRun<double> run{test::StageMlp<double>::make(setup.widths, setup.seed), {}};
    Clock::time_point died_after{};
    const auto hook = [&](const flatmem_cyclic_action &a) {
      if (s.rank == 1 && a.kind == FLATMEM_CYCLIC_FORWARD && a.step == 2 && a.stage == 2) ::raise(SIGKILL);
      died_after = Clock::now();  // the last action that succeeded here
    };
    const std::string error = test::train_rank<double>(h, setup, s.rank, s.world, run, hook);
    const double took = std::chrono::duration<double>(Clock::now() - died_after).count();
    RANK_EXPECT(!error.empty(), "training finished although rank 1 died");
    RANK_EXPECT(contains(error.c_str(), "stage"), error);
    RANK_EXPECT(contains(error.c_str(), "TIMEOUT") || contains(error.c_str(), "PEER_FAILURE") ||
                    contains(error.c_str(), "COMM_POISONED"),
                error);
    RANK_EXPECT(took < 5.0, "failed " << took << " s after its last action; timeout 3 s: " << error);
    std::fprintf(stderr, "rank %d saw: %s (after %.2f s)\n", s.rank, error.c_str(), took);
    // Later calls fail fast.
    flatmem_cyclic_action a{};
    RANK_EXPECT(flatmem_cyclic_next(h, &a, sizeof(flatmem_cyclic_action)) == FLATMEM_STATUS_COMM_POISONED, flatmem_last_error());
    RANK_OK(flatmem_cyclic_destroy(h));
    RANK_OK(flatmem_comm_abort(comm));
    return "";
  }, std::chrono::seconds(60), "tcp,self,posix");
  const std::string failed = test::failures_besides_killed(outcomes, 1);
  CHECK_MESSAGE(failed.empty(), failed);
}
