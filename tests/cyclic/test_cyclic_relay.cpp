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
// multiple of 4, 42 and 30 multiples of 3), and a tiny setup whose middle
// stage has 2 elements (fewer than N = 3, 4: empty shards).
TrainSetup awkward(int stages, std::int64_t steps) {
  TrainSetup s;
  const std::vector<int> widths{5, 7, 4, 6, 3};
  s.widths.assign(widths.begin(), widths.begin() + stages + 1);
  s.steps = steps;
  s.rows = 3;
  return s;
}
TrainSetup tiny(std::int64_t steps) {
  TrainSetup s;
  s.widths = {3, 1, 1, 2};  // 4, 2, 4 elements
  s.steps = steps;
  s.rows = 2;
  return s;
}

std::string describe(const TrainSetup &s, int world) {
  std::string w;
  for (int x : s.widths) w += std::to_string(x) + " ";
  return "world " + std::to_string(world) + ", widths " + w + "steps " + std::to_string(s.steps);
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

TEST_CASE("cyclic/relay/train: RELAYED equals REPLICATED DELAY1 bit for bit (fp64, fp32; N = 1..4)") {
  for (int world : {1, 2, 3, 4}) {
    for (int stages : {1, 2, 4})
      for (std::int64_t steps : {1, 2, 5}) check_relayed_equals_replicated<double>(awkward(stages, steps), world);
    check_relayed_equals_replicated<float>(awkward(4, 5), world);
    check_relayed_equals_replicated<double>(tiny(4), world);
    check_relayed_equals_replicated<float>(tiny(4), world);
  }
}
