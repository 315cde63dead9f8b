// Determinism (flatmem.h, "Determinism"): the same inputs and options give
// bitwise identical loss, row_lse, col_lse, dq, dk and dlogit_scale from run
// to run, and whatever the thread count (1, 2, 3 threads here), because the
// work is cut into a fixed grid whose accumulation order does not depend on
// which thread runs what. Bitwise means bitwise: no tolerance.
#include <doctest/doctest.h>
#include <flatmem/flatmem.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "support/contrastive.hpp"
#include "support/contrastive_bitwise.hpp"
#include "support/random.hpp"
#include "support/tensor.hpp"

using namespace flatmem_test;

namespace {

using DeterminismCase = BitwiseCase;
using Problem = BitwiseProblem;

void check_determinism(const DeterminismCase &dc) {
  const Problem p(dc);
  const Results first = p.run(2);
  SUBCASE("same handle settings, run twice") { check_identical(first, p.run(2), p.symmetric()); }
  SUBCASE("1 thread vs 2 threads") { check_identical(first, p.run(1), p.symmetric()); }
  SUBCASE("3 threads vs 2 threads") { check_identical(first, p.run(3), p.symmetric()); }
}

}  // namespace

// Shapes with several row and column groups (so that threads really share
// the work) and short last tiles.
TEST_CASE("contrastive/determinism/symmetric/fp32/b=263,d=97,tile=16x24") {
  check_determinism({FLATMEM_CONTRASTIVE_SYMMETRIC, Dtype::f32, 263, 263, 97, 16, 24});
}
TEST_CASE("contrastive/determinism/symmetric/fp32/b=1031,d=16") {
  check_determinism({FLATMEM_CONTRASTIVE_SYMMETRIC, Dtype::f32, 1031, 1031, 16});
}
TEST_CASE("contrastive/determinism/symmetric/bf16/b=263,d=64,grad=bf16") {
  check_determinism({FLATMEM_CONTRASTIVE_SYMMETRIC, Dtype::bf16, 263, 263, 64, 0, 0, false, Dtype::bf16});
}
TEST_CASE("contrastive/determinism/infonce/fp32/labels,b=97,c=263,d=31,tile=16x24") {
  check_determinism({FLATMEM_CONTRASTIVE_INFONCE, Dtype::f32, 97, 263, 31, 16, 24, true});
}
TEST_CASE("contrastive/determinism/infonce/fp16/b=200,c=301,d=40,grad=fp16") {
  check_determinism({FLATMEM_CONTRASTIVE_INFONCE, Dtype::f16, 200, 301, 40, 0, 0, false, Dtype::f16});
}

TEST_CASE("contrastive/determinism/same-handle-repeated-calls") {
  // One handle reused (its own workspace buffer reused) gives the same bits
  // as a fresh handle, call after call, including after a failed call.
  const DeterminismCase dc{FLATMEM_CONTRASTIVE_SYMMETRIC, Dtype::f32, 97, 97, 13, 16, 24};
  const Problem p(dc);
  const Results reference = p.run(2);
  Random rng(7);
  HostTensor q = HostTensor::matrix(Dtype::f32, 97, 13), k = HostTensor::matrix(Dtype::f32, 97, 13);
  fill_features(q, rng, 1.0, true);
  fill_features(k, rng, 1.0, true);
  HostTensor s = HostTensor::scalar(Dtype::f32, 20.0);
  Handle h = create_handle(make_options(FLATMEM_CONTRASTIVE_SYMMETRIC, 2, 16, 24));
  for (int round = 0; round < 3; ++round) {
    HostTensor loss = HostTensor::scalar(Dtype::f32, 0.0), row = HostTensor::vector(Dtype::f32, 97),
               col = HostTensor::vector(Dtype::f32, 97);
    REQUIRE(flatmem_contrastive_forward(h.get(), q.dl(), k.dl(), nullptr, s.dl(), loss.dl(), row.dl(), col.dl(),
                                        nullptr, 0, nullptr) == FLATMEM_STATUS_SUCCESS);
    CHECK(loss.same_bits(reference.loss));
    CHECK(row.same_bits(reference.row_lse));
    CHECK(col.same_bits(reference.col_lse));
    // a failing call in between must not disturb the next one
    CHECK(flatmem_contrastive_forward(h.get(), q.dl(), k.dl(), nullptr, s.dl(), nullptr, row.dl(), col.dl(),
                                      nullptr, 0, nullptr) == FLATMEM_STATUS_INVALID_ARGUMENT);
  }
}

TEST_CASE("contrastive/determinism/many-calls-with-2-and-3-threads-match-1-thread") {
  // Concurrency stress: small tiles (16 x 16) make many short tile products
  // run at the same time on different threads; every one of `calls`
  // forward + backward calls must reproduce the single-threaded bits. A
  // library whose GEMM is not safe to call from several threads at once
  // (e.g. a single-threaded OpenBLAS built without USE_LOCKING) fails here
  // within a few dozen calls.
  const DeterminismCase dc{FLATMEM_CONTRASTIVE_SYMMETRIC, Dtype::f32, 97, 97, 31, 16, 16};
  const Problem p(dc);
  const Results reference = p.run(1);
  Random rng(7);
  HostTensor q = HostTensor::matrix(Dtype::f32, 97, 31), k = HostTensor::matrix(Dtype::f32, 97, 31);
  fill_features(q, rng, 1.0, true);
  fill_features(k, rng, 1.0, true);
  HostTensor s = HostTensor::scalar(Dtype::f32, 20.0), g = HostTensor::scalar(Dtype::f32, 0.75);
  constexpr int calls = 400;
  for (int threads : {2, 3}) {
    CAPTURE(threads);
    Handle h = create_handle(make_options(FLATMEM_CONTRASTIVE_SYMMETRIC, threads, 16, 16));
    HostTensor loss = HostTensor::scalar(Dtype::f32, 0.0), row = HostTensor::vector(Dtype::f32, 97),
               col = HostTensor::vector(Dtype::f32, 97), dq = HostTensor::matrix(Dtype::f32, 97, 31),
               dk = HostTensor::matrix(Dtype::f32, 97, 31), ds = HostTensor::scalar(Dtype::f32, 0.0);
    int first_bad = -1;
    double worst_error = 0.0;
    for (int call = 0; call < calls && first_bad < 0; ++call) {
      REQUIRE(flatmem_contrastive_forward(h.get(), q.dl(), k.dl(), nullptr, s.dl(), loss.dl(), row.dl(), col.dl(),
                                          nullptr, 0, nullptr) == FLATMEM_STATUS_SUCCESS);
      REQUIRE(flatmem_contrastive_backward(h.get(), q.dl(), k.dl(), nullptr, s.dl(), row.dl(), col.dl(), g.dl(),
                                           dq.dl(), dk.dl(), ds.dl(), nullptr, 0, nullptr) == FLATMEM_STATUS_SUCCESS);
      const bool same = loss.same_bits(reference.loss) && row.same_bits(reference.row_lse) &&
                        col.same_bits(reference.col_lse) && dq.same_bits(reference.dq) &&
                        dk.same_bits(reference.dk) && ds.same_bits(reference.ds);
      if (!same) {
        first_bad = call;
        for (const auto &[got, want] : {std::pair{&loss, &reference.loss}, {&row, &reference.row_lse},
                                        {&col, &reference.col_lse}, {&dq, &reference.dq}, {&dk, &reference.dk},
                                        {&ds, &reference.ds}})
          for (std::int64_t r = 0; r < got->rows(); ++r)
            for (std::int64_t c = 0; c < got->cols(); ++c)
              worst_error = std::max(worst_error, std::fabs(got->get(r, c) - want->get(r, c)));
      }
    }
    CHECK_MESSAGE(first_bad < 0, "call ", first_bad, " of ", calls, " with ", threads,
                  " threads differs from the 1-thread result (largest difference ", worst_error, ")");
  }
}
