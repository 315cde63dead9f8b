// The ZeRO relay mode between processes over UCX (fork()ed ranks on
// loopback): relayed training bitwise equal to the single-process simulation
// of DELAY1 (which the replicated mode equals bit for bit), and a rank killed
// in the middle of a step -- the others fail within their timeout, naming the
// stage and step.
#include <doctest/doctest.h>

#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstring>

#include "comm/comm_check.hpp"
#include "support/cyclic_train.hpp"
#include "support/ranks.hpp"

namespace {

using test::RankSetup;
using test::TrainSetup;
using Clock = std::chrono::steady_clock;

TrainSetup small_setup() {
  TrainSetup s;
  s.widths = {5, 7, 4, 1, 3};  // stages of 42, 32, 5 and 6 elements
  s.rows = 3;
  s.steps = 5;
  return s;
}

// Trains through UCX and compares this rank's shards and losses with the
// simulation it computes itself (deterministic, so every process agrees).
template <typename T>
std::string train_and_compare(const RankSetup &s, const TrainSetup &setup) {
  flatmem_comm_t *comm = nullptr;
  RANK_OK(test::create_comm(s, &comm, 20000));
  test::CyclicOptions o = test::relayed_options(setup, sizeof(T));
  flatmem_cyclic_t *h = nullptr;
  RANK_OK(flatmem_cyclic_create(&h, comm, &o.options));
  test::RelayRun<T> run = test::RelayRun<T>::initial(setup, s.rank, s.world);
  const std::string error = test::train_rank_relayed<T>(h, setup, s.rank, s.world, run);
  RANK_EXPECT(error.empty(), error);
  flatmem_cyclic_relay_summary summary{};
  RANK_OK(flatmem_cyclic_relay_summary_get(h, &summary, sizeof(flatmem_cyclic_relay_summary)));
  RANK_OK(flatmem_cyclic_destroy(h));
  RANK_OK(flatmem_comm_destroy(comm));
  const auto want = test::simulate<T>(setup, s.world);
  const test::StageMlp<T> &model = want[std::size_t(s.rank)].model;
  for (std::size_t j = 0; j < model.params.size(); ++j) {
    const test::ShardRange r = test::shard_of(model.params[j].size(), s.rank, s.world);
    const std::vector<T> shard(model.params[j].begin() + std::ptrdiff_t(r.begin),
                               model.params[j].begin() + std::ptrdiff_t(r.end));
    RANK_EXPECT(run.shards[j] == shard, "stage " << j << ": the shard differs from the simulation of DELAY1");
  }
  RANK_EXPECT(run.losses == want[std::size_t(s.rank)].losses, "losses differ from the simulation");
  RANK_EXPECT(summary.relay_bytes_sent > 0 || s.rank == s.world - 1 || s.world == 1,
              "no relay bytes sent: " << summary.relay_bytes_sent);
  return "";
}

void check_ranks(int world, const test::Scenario &scenario) {
  const auto outcomes = test::run_ranks(world, scenario, std::chrono::seconds(90), "tcp,self,posix");
  const std::string failed = test::failures(outcomes);
  CHECK_MESSAGE(failed.empty(), failed);
}

bool contains(const std::string &text, const char *part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("cyclic/relay/ucx/training over UCX equals the simulation bit for bit (2-4 processes)") {
  // Stage sizes 42, 32, 5, 6 (no multiple of 4; 32 not of 3), and a stage of
  // 2 elements (fewer than N = 3, 4: empty shards) in the fp32 runs.
  for (int world : {2, 3, 4}) {
    CAPTURE(world);
    check_ranks(world, [](const RankSetup &s) { return train_and_compare<double>(s, small_setup()); });
    check_ranks(world, [](const RankSetup &s) {
      TrainSetup tiny;
      tiny.widths = {3, 1, 1, 2};
      tiny.rows = 2;
      tiny.steps = 4;
      return train_and_compare<float>(s, tiny);
    });
  }
}

TEST_CASE("cyclic/relay/ucx/a rank killed mid-step: the others fail within the timeout, naming the stage") {
  // 3 ranks, timeout 3 s. Rank 1 dies after its forward of stage 2 in step 2:
  // rank 2 waits for its relays, rank 0 for its shards (or for it to take
  // the relays). Both must fail naming a stage within 3 s + 2 s of slack.
  const auto outcomes = test::run_ranks(3, [](const RankSetup &s) -> std::string {
    TrainSetup setup = small_setup();
    setup.steps = 8;
    flatmem_comm_t *comm = nullptr;
    RANK_OK(test::create_comm(s, &comm, 3000));
    test::CyclicOptions o = test::relayed_options(setup, sizeof(double), 3000);
    flatmem_cyclic_t *h = nullptr;
    RANK_OK(flatmem_cyclic_create(&h, comm, &o.options));
    test::RelayRun<double> run = test::RelayRun<double>::initial(setup, s.rank, s.world);
    Clock::time_point last{};
    const auto hook = [&](const flatmem_cyclic_action &a) {
      if (s.rank == 1 && a.kind == FLATMEM_CYCLIC_FORWARD && a.step == 2 && a.stage == 2) ::raise(SIGKILL);
      last = Clock::now();
    };
    const std::string error = test::train_rank_relayed<double>(h, setup, s.rank, s.world, run, hook);
    const double took = std::chrono::duration<double>(Clock::now() - last).count();
    RANK_EXPECT(!error.empty(), "training finished although rank 1 died");
    RANK_EXPECT(contains(error, "stage"), error);
    RANK_EXPECT(contains(error, "step"), error);
    RANK_EXPECT(contains(error, "TIMEOUT") || contains(error, "PEER_FAILURE") || contains(error, "COMM_POISONED"), error);
    RANK_EXPECT(took < 5.0, "failed " << took << " s after its last action; timeout 3 s: " << error);
    std::fprintf(stderr, "rank %d saw: %s (after %.2f s)\n", s.rank, error.c_str(), took);
    flatmem_cyclic_action a{};
    RANK_EXPECT(flatmem_cyclic_next(h, &a, sizeof(flatmem_cyclic_action)) == FLATMEM_STATUS_COMM_POISONED, flatmem_last_error());
    RANK_OK(flatmem_cyclic_destroy(h));
    RANK_OK(flatmem_comm_abort(comm));
    return "";
  }, std::chrono::seconds(60), "tcp,self,posix");
  const std::string failed = test::failures_besides_killed(outcomes, 1);
  CHECK_MESSAGE(failed.empty(), failed);
}
