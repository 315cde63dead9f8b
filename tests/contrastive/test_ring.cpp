// The ring contrastive loss over an in-process group (flatmem_comm_create_local,
// one thread per rank) against the double reference of the concatenated batch
// (ring_case.hpp explains why support/tolerance.hpp's bounds hold for the ring),
// plus determinism, one rank == no communicator bit for bit, and the errors
// every rank must report together.
#include <doctest/doctest.h>
#include <flatmem/flatmem.h>

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "contrastive/local_ranks.hpp"
#include "contrastive/ring_case.hpp"
#include "support/contrastive.hpp"

using namespace ring_test;
using flatmem_test::describe;

namespace {

std::vector<RankResult> run_ring(const RingCase &rc, const GlobalBatch &batch) {
  LocalGroup group(rc.ranks());
  return on_ranks<RankResult>(rc.ranks(), [&](int r) { return run_rank(group.comms[std::size_t(r)], rc, batch, r); });
}

void check_case(const RingCase &rc) {
  const GlobalBatch batch = make_batch(rc);
  const auto ref = reference_of(rc, batch);
  const std::vector<RankResult> results = run_ring(rc, batch);
  for (int r = 0; r < rc.ranks(); ++r) {
    const std::string report = check_rank(rc, batch, ref, results[std::size_t(r)], r);
    CHECK_MESSAGE(report.empty(), report);
  }
  // The loss and ds come out of one all-reduce: the same bits on every rank.
  for (int r = 1; r < rc.ranks(); ++r) {
    CHECK(results[std::size_t(r)].loss.same_bits(results[0].loss));
    CHECK(results[std::size_t(r)].ds.same_bits(results[0].ds));
  }
}

std::string name_of(const RingCase &rc) {
  std::string s = rc.symmetric() ? "symmetric" : "infonce";
  s += std::string("/") + flatmem_test::dtype_name(rc.dtype) + "/b=";
  for (std::size_t r = 0; r < rc.rows.size(); ++r) s += (r ? "," : "") + std::to_string(rc.rows[r]);
  if (!rc.cols.empty()) {
    s += "/c=";
    for (std::size_t r = 0; r < rc.cols.size(); ++r) s += (r ? "," : "") + std::to_string(rc.cols[r]);
  }
  return s + "/d=" + std::to_string(rc.d);
}

}  // namespace

TEST_CASE("contrastive/ring/values vs the concatenated batch") {
  std::vector<RingCase> cases;
  for (auto loss : {FLATMEM_CONTRASTIVE_SYMMETRIC, FLATMEM_CONTRASTIVE_INFONCE})
    for (Dtype dtype : {Dtype::f32, Dtype::bf16}) {
      RingCase rc;
      rc.loss = loss;
      rc.dtype = dtype;
      for (const auto &rows : std::vector<std::vector<std::int64_t>>{{37}, {19, 23}, {1, 40, 7}, {29, 31, 17, 13}}) {
        rc.rows = rows;  // b_r = 1 and primes; unequal across ranks (symmetric too: c_r = b_r)
        rc.d = 33;
        rc.tile = 16;  // tiles that do not divide the blocks
        cases.push_back(rc);
      }
    }
  RingCase wide;  // InfoNCE, c_r != b_r, global labels pointing anywhere
  wide.loss = FLATMEM_CONTRASTIVE_INFONCE;
  wide.rows = {11, 5, 23};
  wide.cols = {40, 3, 17};
  wide.labels = true;
  wide.d = 20;
  wide.dloss = 0.75;
  cases.push_back(wide);
  wide.dtype = Dtype::bf16;
  wide.grad_out = Dtype::bf16;  // 16-bit gradients rounded once from the fp32 sums
  wide.rows = {6, 9, 2, 30};
  wide.cols = {1, 12, 33, 4};
  cases.push_back(wide);
  RingCase big;  // several default-size tiles per block, 2 threads per rank
  big.rows = {300, 257};
  big.d = 64;
  big.threads = 2;
  big.scale = 50.0;
  cases.push_back(big);
  for (const RingCase &rc : cases) {
    CAPTURE(name_of(rc));
    check_case(rc);
  }
}

TEST_CASE("contrastive/ring/saturated pairs: as exact as a materialised fp32 loss") {
  for (auto loss : {FLATMEM_CONTRASTIVE_SYMMETRIC, FLATMEM_CONTRASTIVE_INFONCE}) {
    RingCase rc;
    rc.loss = loss;
    rc.rows = {29, 1, 64, 37};  // one row, primes, a block of several 16-row tiles
    rc.d = 256;
    rc.tile = 16;
    rc.scale = 100.0;
    rc.saturated = 0.5;
    CAPTURE(name_of(rc));
    check_case(rc);
  }
}

TEST_CASE("contrastive/ring/deterministic: two runs give the same bits") {
  RingCase rc;
  rc.loss = FLATMEM_CONTRASTIVE_INFONCE;
  rc.rows = {21, 8, 34};
  rc.cols = {9, 30, 12};
  rc.labels = true;
  rc.tile = 16;
  const GlobalBatch batch = make_batch(rc);
  const auto first = run_ring(rc, batch), second = run_ring(rc, batch);
  for (int r = 0; r < rc.ranks(); ++r) CHECK(same_bits(first[std::size_t(r)], second[std::size_t(r)]));
}

TEST_CASE("contrastive/ring/one rank gives the single-process bits") {
  for (auto loss : {FLATMEM_CONTRASTIVE_SYMMETRIC, FLATMEM_CONTRASTIVE_INFONCE}) {
    RingCase rc;
    rc.loss = loss;
    rc.rows = {83};
    rc.d = 40;
    rc.tile = 16;
    rc.threads = 2;
    const GlobalBatch batch = make_batch(rc);
    std::vector<RankResult> rings = run_ring(rc, batch);
    const RankResult &ring = rings[0];
    const RankResult alone = run_rank(nullptr, rc, batch, 0);  // options.comm = NULL
    REQUIRE_MESSAGE(ring.status == FLATMEM_STATUS_SUCCESS, ring.error);
    REQUIRE_MESSAGE(alone.status == FLATMEM_STATUS_SUCCESS, alone.error);
    CHECK(same_bits(ring, alone));
  }
}
