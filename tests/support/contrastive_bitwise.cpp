#include "support/contrastive_bitwise.hpp"

#include <doctest/doctest.h>

#include <cmath>

#include "support/random.hpp"

namespace flatmem_test {

BitwiseProblem::BitwiseProblem(const BitwiseCase &bc, std::uint64_t seed) : bc_(bc) {
  Random rng(seed);
  q_ = HostTensor::matrix(bc.dtype, bc.b, bc.d);
  k_ = HostTensor::matrix(bc.dtype, bc.c, bc.d);
  fill_features(q_, rng, 1.0, true);
  fill_features(k_, rng, 1.0, true);
  if (bc.labels) {
    labels_ = HostTensor::vector(Dtype::i64, bc.b);
    for (std::int64_t i = 0; i < bc.b; ++i) labels_.set(i, double(rng.below(bc.c)));
  }
  scale_ = HostTensor::scalar(Dtype::f32, bc.scale);
  dloss_ = HostTensor::scalar(Dtype::f32, 0.75);
}

flatmem_contrastive_options BitwiseProblem::options(int threads, std::size_t logit_cache_bytes) const {
  flatmem_contrastive_options o = make_options(bc_.loss, threads, bc_.tile_rows, bc_.tile_cols);
  o.logit_cache_bytes = logit_cache_bytes;
  return o;
}

void BitwiseProblem::forward(flatmem_contrastive_t *h, Results &r) const {
  r.loss = HostTensor::scalar(Dtype::f32, 0.0);
  r.row_lse = HostTensor::vector(Dtype::f32, bc_.b);
  if (symmetric()) r.col_lse = HostTensor::vector(Dtype::f32, bc_.c);
  const flatmem_status status = flatmem_contrastive_forward(
      h, q_.dl(), k_.dl(), bc_.labels ? labels_.dl() : nullptr, scale_.dl(), r.loss.dl(), r.row_lse.dl(),
      symmetric() ? r.col_lse.dl() : nullptr, nullptr, 0, nullptr);
  REQUIRE_MESSAGE(status == FLATMEM_STATUS_SUCCESS, describe(status));
}

void BitwiseProblem::backward(flatmem_contrastive_t *h, Results &r) const {
  r.dq = HostTensor::matrix(bc_.grad, bc_.b, bc_.d);
  r.dk = HostTensor::matrix(bc_.grad, bc_.c, bc_.d);
  r.ds = HostTensor::scalar(Dtype::f32, 0.0);
  const flatmem_status status = flatmem_contrastive_backward(
      h, q_.dl(), k_.dl(), bc_.labels ? labels_.dl() : nullptr, scale_.dl(), r.row_lse.dl(),
      symmetric() ? r.col_lse.dl() : nullptr, dloss_.dl(), r.dq.dl(), r.dk.dl(), r.ds.dl(), nullptr, 0,
      nullptr);
  REQUIRE_MESSAGE(status == FLATMEM_STATUS_SUCCESS, describe(status));
}

Results BitwiseProblem::run(int threads, std::size_t logit_cache_bytes) const {
  Handle h = create_handle(options(threads, logit_cache_bytes));
  Results r;
  forward(h.get(), r);
  backward(h.get(), r);
  return r;
}

void BitwiseProblem::nudge_q(std::int64_t row) {
  const double v = q_.get(row, 0);
  // next representable value upwards in q's dtype (set() rounds to nearest)
  const double step = bc_.dtype == Dtype::f32 ? std::ldexp(1.0, -23) : bc_.dtype == Dtype::bf16 ? 0x1p-7 : 0x1p-10;
  q_.set(row, 0, v + std::fabs(v == 0.0 ? 1.0 : v) * step);
  REQUIRE(q_.get(row, 0) != v);
}

void check_identical(const Results &a, const Results &b, bool symmetric) {
  CHECK_MESSAGE(a.loss.same_bits(b.loss), "loss ", a.loss.get(0), " vs ", b.loss.get(0));
  CHECK_MESSAGE(a.row_lse.same_bits(b.row_lse), "row_lse differs");
  if (symmetric) CHECK_MESSAGE(a.col_lse.same_bits(b.col_lse), "col_lse differs");
  CHECK_MESSAGE(a.dq.same_bits(b.dq), "dq differs");
  CHECK_MESSAGE(a.dk.same_bits(b.dk), "dk differs");
  CHECK_MESSAGE(a.ds.same_bits(b.ds), "dlogit_scale ", a.ds.get(0), " vs ", b.ds.get(0));
}

}  // namespace flatmem_test
