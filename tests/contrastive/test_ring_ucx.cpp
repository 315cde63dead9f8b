// The ring contrastive loss across processes over UCX (loopback: tcp for the
// bootstrap, posix shared memory and tcp for the data): 2, 3 and 4 ranks
// fork()ed by support/ranks.hpp, each checking its slice of the results
// against the double reference of the concatenated batch (tolerances as in
// test_ring.cpp, see ring_case.hpp) and against this library's own
// single-process loss of that batch, computed in the rank, to the same bound.
#include <doctest/doctest.h>
#include <flatmem/flatmem.h>

#include <chrono>
#include <cmath>
#include <string>

#include "contrastive/ring_case.hpp"
#include "support/ranks.hpp"

using namespace ring_test;

namespace {

// In a rank process: the ring through a UCX communicator, then the checks.
std::string ring_rank(const RingCase &rc, const test::RankSetup &setup) {
  flatmem_comm_t *comm = nullptr;
  const flatmem_status s = test::create_comm(setup, &comm, 20000);
  if (s != FLATMEM_STATUS_SUCCESS) return std::string("create: ") + flatmem_status_string(s) + ": " + flatmem_last_error();
  const GlobalBatch batch = make_batch(rc);
  const RankResult result = run_rank(comm, rc, batch, setup.rank);
  flatmem_comm_destroy(comm);
  std::string report = check_rank(rc, batch, reference_of(rc, batch), result, setup.rank);
  if (!report.empty() || setup.rank != 0) return report;
  // Rank 0 also runs the whole batch in one process and compares the loss bits' neighbourhood.
  RingCase alone = rc;
  alone.rows = {batch.global_rows};
  alone.cols = {batch.global_cols};
  const RankResult single = run_rank(nullptr, alone, batch, 0);
  if (single.status != FLATMEM_STATUS_SUCCESS) return "single process: " + single.error;
  const double ring_loss = result.loss.get(0), single_loss = single.loss.get(0);
  if (std::fabs(ring_loss - single_loss) > 1e-5 * std::fabs(single_loss) + 1e-6)
    return "ring loss " + std::to_string(ring_loss) + " vs single-process " + std::to_string(single_loss);
  return "";
}

void run_case(const RingCase &rc) {
  const auto outcomes = test::run_ranks(
      rc.ranks(), [&](const test::RankSetup &setup) { return ring_rank(rc, setup); },
      std::chrono::seconds(120), "tcp,self,posix");
  const std::string failed = test::failures(outcomes);
  CHECK_MESSAGE(failed.empty(), failed);
}

}  // namespace

TEST_CASE("contrastive/ring/ucx/symmetric fp32 on 2, 3 and 4 processes") {
  for (const auto &rows : std::vector<std::vector<std::int64_t>>{{40, 24}, {17, 1, 33}, {30, 29, 31, 2}}) {
    RingCase rc;
    rc.rows = rows;
    rc.d = 48;
    rc.tile = 16;
    CAPTURE(rc.ranks());
    run_case(rc);
  }
}

TEST_CASE("contrastive/ring/ucx/infonce bf16 with global labels on 2, 3 and 4 processes") {
  for (int world : {2, 3, 4}) {
    RingCase rc;
    rc.loss = FLATMEM_CONTRASTIVE_INFONCE;
    rc.dtype = Dtype::bf16;
    rc.labels = true;
    for (int r = 0; r < world; ++r) {
      rc.rows.push_back(7 + 5 * r);
      rc.cols.push_back(20 - 3 * r);
    }
    rc.d = 40;
    rc.tile = 16;
    CAPTURE(world);
    run_case(rc);
  }
}
