// The sigmoid ring across processes over UCX (loopback: tcp for the
// bootstrap, posix shared memory and tcp for the data): 2 and 4 ranks fork()ed
// by support/ranks.hpp, each checking its slice of the results against the
// float64 reference of the concatenated batch (sigmoid_ring_case.hpp), and
// rank 0 also against this library's single-process loss of that batch.
#include <doctest/doctest.h>
#include <flatmem/flatmem.h>

#include <chrono>
#include <cmath>
#include <string>

#include "contrastive/sigmoid_ring_case.hpp"
#include "support/ranks.hpp"

using namespace sigmoid_ring;

namespace {

std::string ring_rank(const SigmoidRingCase &rc, const test::RankSetup &setup) {
  flatmem_comm_t *comm = nullptr;
  const flatmem_status s = test::create_comm(setup, &comm, 20000);
  if (s != FLATMEM_STATUS_SUCCESS)
    return std::string("create: ") + flatmem_status_string(s) + ": " + flatmem_last_error();
  const flatmem_test::SigmoidCase global = rc.global_batch();
  const RankRun run = run_rank(comm, rc, global, setup.rank);
  flatmem_comm_destroy(comm);
  const std::string report = check_rank(rc, global, run, setup.rank);
  if (!report.empty() || setup.rank != 0) return report;
  const RankRun single = run_rank(nullptr, rc, global, 0);
  if (single.status != FLATMEM_STATUS_SUCCESS) return "single process: " + single.error;
  const double ring = run.value_and_grad.loss.get(0), alone = single.value_and_grad.loss.get(0);
  if (std::fabs(ring - alone) > 1e-5 * std::fabs(alone) + 1e-6)
    return "ring loss " + std::to_string(ring) + " vs single-process " + std::to_string(alone);
  return "";
}

void run_case(const SigmoidRingCase &rc) {
  const auto outcomes = test::run_ranks(
      rc.ranks(), [&](const test::RankSetup &setup) { return ring_rank(rc, setup); },
      std::chrono::seconds(120), "tcp,self,posix");
  const std::string failed = test::failures(outcomes);
  CHECK_MESSAGE(failed.empty(), failed);
}

}  // namespace

TEST_CASE("contrastive/sigmoid/ring/ucx fp32 on 2 processes, bf16 with global labels on 4") {
  SigmoidRingCase two;
  two.rows = {31, 18};
  two.shape.d = 48;
  two.shape.scale = 100.0;
  two.shape.bias = -10.0;
  two.tile = 16;
  run_case(two);

  SigmoidRingCase four;
  four.rows = {7, 12, 1, 20};
  four.cols = {15, 3, 22, 9};
  four.shape.d = 40;
  four.shape.labels = true;
  four.shape.dtype = four.shape.grad_dtype = flatmem_test::Dtype::bf16;
  four.tile = 16;
  run_case(four);
}
