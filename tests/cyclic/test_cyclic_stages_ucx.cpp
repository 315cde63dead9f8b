// The stage-parallel handle between processes over UCX (fork()ed stage ranks
// on loopback): training equal to the single-process simulation of the rule
// bit for bit (which the data-parallel tests prove equal to flatmem_cyclic_t
// on N ranks), and a stage rank killed mid-step -- its neighbours fail within
// their timeout naming stage, micro-batch, step and what they waited for.
#include <doctest/doctest.h>

#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstring>

#include "comm/comm_check.hpp"
#include "support/ranks.hpp"
#include "support/stage_train.hpp"

namespace {

using test::RankSetup;
using test::TrainSetup;
using Clock = std::chrono::steady_clock;


template <typename T>
std::string train_and_compare(flatmem_comm_t *comm, const RankSetup &s, const TrainSetup &setup, int n) {
  test::StageOptions o = test::stage_options(setup, n, sizeof(T), 20000);
  flatmem_cyclic_stages_t *h = nullptr;
  RANK_OK(flatmem_cyclic_stages_create(&h, comm, &o.options));
  test::StageRun<T> run;
  const std::string error = test::train_stage<T>(h, setup, n, s.rank, run);
  RANK_OK(flatmem_cyclic_stages_destroy(h));
  RANK_EXPECT(error.empty(), "N " << n << ", rule " << int(setup.rule) << ": " << error);
  const auto want = test::simulate<T>(setup, n);
  RANK_EXPECT(run.params == want[0].model.params[std::size_t(s.rank)],
              "N " << n << ", rule " << int(setup.rule) << ": stage parameters differ from the simulation");
  if (s.rank + 1 == s.world)
    for (int m = 0; m < n; ++m)
      RANK_EXPECT(run.losses[std::size_t(m)] == want[std::size_t(m)].losses, "losses of micro-batch " << m);
  return "";
}

bool contains(const std::string &text, const std::string &part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("cyclic_stages/ucx/training over UCX processes equals the simulation (L = 2, 3, 4)") {
  for (int L : {2, 3, 4}) {
    CAPTURE(L);
    const auto outcomes = test::run_ranks(L, [L](const RankSetup &s) -> std::string {
      flatmem_comm_t *comm = nullptr;
      RANK_OK(test::create_comm(s, &comm, 20000));
      for (flatmem_cyclic_rule rule : {FLATMEM_CYCLIC_DELAY1, FLATMEM_CYCLIC_NEWEST, FLATMEM_CYCLIC_SYNC})
        for (int n : {1, 2, L, 2 * L}) {
          const std::string e = train_and_compare<double>(comm, s, test::mlp_setup(L, 3, rule), n);
          if (!e.empty()) return e;
        }
      const std::string e = train_and_compare<float>(comm, s, test::mlp_setup(L, 3, FLATMEM_CYCLIC_NEWEST), L + 1);
      if (!e.empty()) return e;
      RANK_OK(flatmem_comm_destroy(comm));
      return "";
    }, std::chrono::seconds(90), "tcp,self,posix");
    const std::string failed = test::failures(outcomes);
    CHECK_MESSAGE(failed.empty(), failed);
  }
}

TEST_CASE("cyclic_stages/ucx/a stage rank killed mid-step: its neighbours fail within the timeout") {
  // L = 3, N = 3, DELAY1, timeout 3 s. Stage 1 dies after its forward of
  // micro-batch 1 in step 1: stage 2 waits for an activation from it, stage 0
  // for a gradient. Both must fail within 3 s + 2 s of slack, naming it.
  const auto outcomes = test::run_ranks(3, [](const RankSetup &s) -> std::string {
    TrainSetup setup = test::mlp_setup(3, 6, FLATMEM_CYCLIC_DELAY1);
    setup.steps = 6;
    flatmem_comm_t *comm = nullptr;
    RANK_OK(test::create_comm(s, &comm, 3000));
    test::StageOptions o = test::stage_options(setup, 3, sizeof(double), 3000);
    flatmem_cyclic_stages_t *h = nullptr;
    RANK_OK(flatmem_cyclic_stages_create(&h, comm, &o.options));
    test::StageRun<double> run;
    Clock::time_point last{};
    const auto hook = [&](const flatmem_cyclic_stages_action &a) {
      if (s.rank == 1 && a.kind == FLATMEM_CYCLIC_FORWARD && a.micro_batch == 1 && a.step == 1) ::raise(SIGKILL);
      last = Clock::now();
    };
    const std::string error = test::train_stage<double>(h, setup, 3, s.rank, run, hook);
    const double took = std::chrono::duration<double>(Clock::now() - last).count();
    RANK_EXPECT(!error.empty(), "training finished although stage 1 died");
    RANK_EXPECT(contains(error, "cyclic stages, stage " + std::to_string(s.rank) + ", micro-batch "), error);
    RANK_EXPECT(contains(error, ", step "), error);
    // What it waited for: the tensor from stage 1, or its own send to stage 1 (a
    // send to a dead peer may fail first; it names its own micro-batch and step).
    const bool named = s.rank == 0 ? contains(error, "receive the gradient from stage 1 (rank 1)") ||
                                         contains(error, "send the activation to stage 1 (rank 1)")
                                   : contains(error, "receive the activation from stage 1 (rank 1)") ||
                                         contains(error, "send the gradient to stage 1 (rank 1)");
    RANK_EXPECT(named, error);
    RANK_EXPECT(contains(error, "TIMEOUT") || contains(error, "PEER_FAILURE"), error);
    RANK_EXPECT(took < 5.0, "failed " << took << " s after its last action; timeout 3 s: " << error);
    std::fprintf(stderr, "stage %d saw: %s (after %.2f s)\n", s.rank, error.c_str(), took);
    flatmem_cyclic_stages_action a{};
    RANK_EXPECT(flatmem_cyclic_stages_next(h, &a, sizeof(flatmem_cyclic_stages_action)) == FLATMEM_STATUS_COMM_POISONED, flatmem_last_error());
    RANK_OK(flatmem_cyclic_stages_destroy(h));
    RANK_OK(flatmem_comm_abort(comm));
    return "";
  }, std::chrono::seconds(60), "tcp,self,posix");
  const std::string failed = test::failures_besides_killed(outcomes, 1);
  CHECK_MESSAGE(failed.empty(), failed);
}
