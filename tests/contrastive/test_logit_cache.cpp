// The logit cache (flatmem.h, "Logit cache"): a handle with
// options.logit_cache_bytes keeps raw logit tiles from the forward and the
// backward reads them instead of recomputing. The promise is bitwise: every
// output (loss, row_lse, col_lse, dq, dk, dlogit_scale) equals the uncached
// handle's bit for bit, for every budget (none, less than a tile, part of the
// tiles, all of them, more), and a backward whose q or k differ from the last
// forward's recomputes instead of reading stale tiles. No tolerance.
#include <doctest/doctest.h>
#include <flatmem/flatmem.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "support/contrastive.hpp"
#include "support/contrastive_bitwise.hpp"
#include "support/tensor.hpp"

using namespace flatmem_test;

namespace {

// Budgets in bytes for a b x c problem whose tiles are tr x tc.
std::vector<std::size_t> budgets(const BitwiseCase &bc, std::int64_t tr, std::int64_t tc) {
  const std::size_t all = std::size_t(bc.b) * std::size_t(bc.c) * 4;
  return {4,                                         // less than any tile: nothing cached
          std::size_t(tr) * std::size_t(tc) * 4 + 3, // the first tile (and a few bytes over)
          all / 3,                                   // part of the tiles, a ragged cut
          all - 4,                                   // all but the last tile
          all,                                       // every tile
          std::numeric_limits<std::size_t>::max()};  // far more than needed
}

void check_cache_is_bitwise(const BitwiseCase &bc) {
  const BitwiseProblem p(bc);
  const Results uncached = p.run(2);
  const std::int64_t tr = bc.tile_rows ? bc.tile_rows : 512, tc = bc.tile_cols ? bc.tile_cols : 512;
  for (std::size_t budget : budgets(bc, tr, tc)) {
    CAPTURE(budget);
    check_identical(uncached, p.run(2, budget), p.symmetric());
  }
  SUBCASE("1 and 3 threads with every tile cached") {
    check_identical(uncached, p.run(1, std::size_t(bc.b) * std::size_t(bc.c) * 4), p.symmetric());
    check_identical(uncached, p.run(3, std::size_t(bc.b) * std::size_t(bc.c) * 4), p.symmetric());
  }
}

}  // namespace

TEST_CASE("contrastive/logit-cache/symmetric/fp32/b=263,d=97,tile=16x24") {
  check_cache_is_bitwise({FLATMEM_CONTRASTIVE_SYMMETRIC, Dtype::f32, 263, 263, 97, 16, 24});
}
TEST_CASE("contrastive/logit-cache/symmetric/fp32/b=1,d=1") {
  check_cache_is_bitwise({FLATMEM_CONTRASTIVE_SYMMETRIC, Dtype::f32, 1, 1, 1});
}
TEST_CASE("contrastive/logit-cache/symmetric/fp32/b=1031,d=16,default-tiles") {
  check_cache_is_bitwise({FLATMEM_CONTRASTIVE_SYMMETRIC, Dtype::f32, 1031, 1031, 16});
}
TEST_CASE("contrastive/logit-cache/symmetric/bf16/b=263,d=64,grad=bf16,s=100") {
  check_cache_is_bitwise(
      {FLATMEM_CONTRASTIVE_SYMMETRIC, Dtype::bf16, 263, 263, 64, 0, 0, false, Dtype::bf16, 100.0});
}
TEST_CASE("contrastive/logit-cache/infonce/fp32/labels,b=97,c=263,d=31,tile=16x24") {
  check_cache_is_bitwise({FLATMEM_CONTRASTIVE_INFONCE, Dtype::f32, 97, 263, 31, 16, 24, true});
}
TEST_CASE("contrastive/logit-cache/infonce/fp16/b=200,c=301,d=40,grad=fp16,tile=32x17") {
  check_cache_is_bitwise({FLATMEM_CONTRASTIVE_INFONCE, Dtype::f16, 200, 301, 40, 32, 17, false, Dtype::f16});
}

TEST_CASE("contrastive/logit-cache/backward-on-other-inputs-recomputes") {
  // The cache holds the tiles of the last forward's q and k. A backward on
  // different q (one element one ulp away), or after a forward on other
  // inputs, or with no forward at all, must give exactly what the uncached
  // handle gives for the same calls.
  const BitwiseCase bc{FLATMEM_CONTRASTIVE_SYMMETRIC, Dtype::f32, 97, 97, 13, 16, 24};
  const std::size_t all = 97 * 97 * 4;
  auto sequence = [&](std::size_t budget, int which) {
    BitwiseProblem p(bc);
    Handle h = create_handle(p.options(2, budget));
    Results r;
    if (which == 0) {  // forward(q), backward(q + one ulp in row 50)
      p.forward(h.get(), r);
      p.nudge_q(50);
      p.backward(h.get(), r);
    } else if (which == 1) {  // forward(q), forward(q'), backward(q) with q's lse
      p.forward(h.get(), r);
      Results other;
      BitwiseProblem moved(bc);
      moved.nudge_q(3);
      moved.forward(h.get(), other);
      p.backward(h.get(), r);
    } else {  // backward on a handle that never ran a forward (lse from another handle)
      Handle first = create_handle(p.options(2));
      p.forward(first.get(), r);
      p.backward(h.get(), r);
    }
    return r;
  };
  for (int which = 0; which < 3; ++which) {
    CAPTURE(which);
    check_identical(sequence(0, which), sequence(all, which), true);
  }
}

TEST_CASE("contrastive/logit-cache/a-failed-forward-leaves-the-cache-consistent") {
  // forward(q) fills the cache; a forward that fails (workspace too small)
  // must not make the next backward on q read tiles it did not finish.
  const BitwiseCase bc{FLATMEM_CONTRASTIVE_SYMMETRIC, Dtype::f32, 97, 97, 13, 16, 24};
  BitwiseProblem p(bc);
  const Results uncached = p.run(2);
  Handle h = create_handle(p.options(2, 97 * 97 * 4));
  Results r;
  p.forward(h.get(), r);
  char tiny[8];
  HostTensor loss = HostTensor::scalar(Dtype::f32, 0.0), row = HostTensor::vector(Dtype::f32, 97),
             col = HostTensor::vector(Dtype::f32, 97);
  HostTensor s = HostTensor::scalar(Dtype::f32, 20.0);
  CHECK(flatmem_contrastive_forward(h.get(), p.q().dl(), p.q().dl(), nullptr, s.dl(), loss.dl(), row.dl(),
                                    col.dl(), tiny, sizeof tiny, nullptr) == FLATMEM_STATUS_WORKSPACE_TOO_SMALL);
  p.backward(h.get(), r);
  check_identical(uncached, r, true);
}

TEST_CASE("contrastive/logit-cache/options") {
  SUBCASE("with a communicator: refused, naming the option") {
    flatmem_comm_t *comm = nullptr;
    REQUIRE(flatmem_comm_create_local(&comm, 1, nullptr) == FLATMEM_STATUS_SUCCESS);
    flatmem_contrastive_options o = make_options(FLATMEM_CONTRASTIVE_SYMMETRIC, 1);
    o.comm = comm;
    o.logit_cache_bytes = 1 << 20;
    flatmem_contrastive_t *h = nullptr;
    CHECK(flatmem_contrastive_create(&h, &o) == FLATMEM_STATUS_INVALID_ARGUMENT);
    CHECK(h == nullptr);
    CHECK(std::string(flatmem_last_error()).find("options.logit_cache_bytes") != std::string::npos);
    o.logit_cache_bytes = 0;
    REQUIRE(flatmem_contrastive_create(&h, &o) == FLATMEM_STATUS_SUCCESS);
    flatmem_contrastive_destroy(h);
    flatmem_comm_destroy(comm);
  }
  SUBCASE("a caller compiled before the field existed gets no cache") {
    // struct_size ending before logit_cache_bytes: the field is not read,
    // whatever the memory after it holds.
    const BitwiseCase bc{FLATMEM_CONTRASTIVE_SYMMETRIC, Dtype::f32, 31, 31, 7, 16, 16};
    const BitwiseProblem p(bc);
    flatmem_contrastive_options o = p.options(2, std::numeric_limits<std::size_t>::max());
    o.struct_size = offsetof(flatmem_contrastive_options, logit_cache_bytes);
    Handle h = create_handle(o);
    Results r;
    p.forward(h.get(), r);
    p.backward(h.get(), r);
    check_identical(p.run(2), r, true);
  }
}
