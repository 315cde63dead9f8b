// The sigmoid (SigLIP) loss against the float64 materialised reference
// (sigmoid_reference.hpp, bounds derived there): the three calls
// (value_and_grad, forward, backward with an upstream gradient) over shapes
// with 1, primes, extents that are not multiples of the tile, c > b with
// labels, s = 100 with t = -10, and bf16 / fp16 inputs; ds and dt also by
// central finite differences of the library's own loss; bitwise invariance
// across thread counts.
#include <doctest/doctest.h>
#include <flatmem/flatmem.h>

#include <cmath>
#include <string>

#include "contrastive/sigmoid_case.hpp"
#include "contrastive/sigmoid_reference.hpp"
#include "support/contrastive.hpp"
#include "support/tolerance.hpp"

using namespace flatmem_test;

namespace {

void require_ok(flatmem_status status) { REQUIRE_MESSAGE(status == FLATMEM_STATUS_SUCCESS, describe(status)); }

// value_and_grad, forward and backward (g = 0.75) on one case, each against
// the reference; forward's loss is the very value value_and_grad returns.
void check_values(const SigmoidShape &shape, int tile_rows = 0, int tile_cols = 0) {
  const SigmoidCase c(shape);
  Handle h = sigmoid_handle(2, tile_rows, tile_cols);

  SigmoidOutputs vg = c.outputs();
  require_ok(c.value_and_grad(h.get(), vg));
  INFO("value_and_grad");
  check_against_reference(c, vg, 1.0);

  SigmoidOutputs fwd = c.outputs();
  require_ok(c.forward(h.get(), fwd));
  CHECK_MESSAGE(fwd.loss.same_bits(vg.loss), "forward's loss ", fwd.loss.get(0),
                " differs from value_and_grad's ", vg.loss.get(0));
  CHECK_MESSAGE(fwd.dq.all_bytes_are(sentinel_byte), "forward wrote dq it was not given");

  SigmoidOutputs bwd = c.outputs();
  require_ok(c.backward(h.get(), 0.75, bwd));
  INFO("backward, g = 0.75");
  check_against_reference(c, bwd, 0.75, SigmoidChecks{false, true, true, true, true});
}

SigmoidShape shape(std::int64_t b, std::int64_t c, std::int64_t d, double s = 10.0, double t = -10.0,
                   Dtype dtype = Dtype::f32, bool labels = false) {
  SigmoidShape x;
  x.b = b;
  x.c = c;
  x.d = d;
  x.scale = s;
  x.bias = t;
  x.dtype = dtype;
  x.grad_dtype = dtype;
  x.labels = labels;
  return x;
}

}  // namespace

TEST_CASE("contrastive/sigmoid/fp32/b=1,d=1") { check_values(shape(1, 1, 1)); }
TEST_CASE("contrastive/sigmoid/fp32/b=1,d=97") { check_values(shape(1, 1, 97, 1.0, 0.0)); }
TEST_CASE("contrastive/sigmoid/fp32/b=2,d=3,s=1,t=0") { check_values(shape(2, 2, 3, 1.0, 0.0)); }
TEST_CASE("contrastive/sigmoid/fp32/b=13,d=7,tile=16x24") { check_values(shape(13, 13, 7), 16, 24); }
TEST_CASE("contrastive/sigmoid/fp32/b=97,d=13,tile=16x24") { check_values(shape(97, 97, 13), 16, 24); }
TEST_CASE("contrastive/sigmoid/fp32/b=61,d=13,tile=1x1") { check_values(shape(61, 61, 13), 1, 1); }
TEST_CASE("contrastive/sigmoid/fp32/b=263,d=97") { check_values(shape(263, 263, 97)); }
TEST_CASE("contrastive/sigmoid/fp32/b=37,c=101,d=19,labels,tile=17x5") {
  check_values(shape(37, 101, 19, 10.0, -10.0, Dtype::f32, true), 17, 5);
}
TEST_CASE("contrastive/sigmoid/fp32/b=29,c=53,d=11,diagonal") { check_values(shape(29, 53, 11)); }
TEST_CASE("contrastive/sigmoid/fp32/s=100,t=-10,b=97,d=7,tile=16x24") {
  check_values(shape(97, 97, 7, 100.0, -10.0), 16, 24);
}
TEST_CASE("contrastive/sigmoid/fp32/s=100,t=-10,b=31,c=67,d=33,labels") {
  check_values(shape(31, 67, 33, 100.0, -10.0, Dtype::f32, true));
}
TEST_CASE("contrastive/sigmoid/fp32/positive bias,s=3,t=5,b=41,d=9") { check_values(shape(41, 41, 9, 3.0, 5.0)); }
TEST_CASE("contrastive/sigmoid/fp32/identical,k=q,s=100,t=-10,b=53,d=16") {
  SigmoidShape x = shape(53, 53, 16, 100.0, -10.0);
  x.seed = 7;
  const SigmoidCase c(x);
  SigmoidCase same(x);  // same seed: k's values are drawn after q's, so copy q into k
  for (std::int64_t i = 0; i < x.b; ++i)
    for (std::int64_t j = 0; j < x.d; ++j) same.k.set(i, j, same.q.get(i, j));
  Handle h = sigmoid_handle(2, 16, 16);
  SigmoidOutputs out = same.outputs();
  require_ok(same.value_and_grad(h.get(), out));
  check_against_reference(same, out, 1.0);
}
TEST_CASE("contrastive/sigmoid/bf16/b=97,c=131,d=33,labels,tile=16x24") {
  check_values(shape(97, 131, 33, 10.0, -10.0, Dtype::bf16, true), 16, 24);
}
TEST_CASE("contrastive/sigmoid/fp16/b=97,d=33,s=100,t=-10") {
  check_values(shape(97, 97, 33, 100.0, -10.0, Dtype::f16));
}
TEST_CASE("contrastive/sigmoid/bf16/fp32 gradients,b=45,d=8") {
  SigmoidShape x = shape(45, 45, 8, 10.0, -10.0, Dtype::bf16);
  x.grad_dtype = Dtype::f32;
  check_values(x, 16, 16);
}

TEST_CASE("contrastive/sigmoid/value_and_grad with some outputs NULL") {
  const SigmoidCase c(shape(23, 31, 5, 10.0, -10.0, Dtype::f32, true));
  Handle h = sigmoid_handle(2, 16, 16);
  SigmoidOutputs all = c.outputs();
  require_ok(c.value_and_grad(h.get(), all));
  SigmoidOutputs some = c.outputs();
  require_ok(c.value_and_grad(h.get(), some, false, false, true, false, true));
  CHECK(some.loss.all_bytes_are(sentinel_byte));
  CHECK(some.dq.all_bytes_are(sentinel_byte));
  CHECK(some.ds.all_bytes_are(sentinel_byte));
  CHECK_MESSAGE(some.dk.same_bits(all.dk), "dk depends on which other outputs were requested");
  CHECK_MESSAGE(some.dt.same_bits(all.dt), "dt depends on which other outputs were requested");
}

// ds and dt by central differences of the library's fp32 loss. Error budget
// of the difference quotient (D = (L(p + h) - L(p - h)) / (2h), with p + h
// and p - h the fp32 values actually passed): each loss is within its
// reference bound tau_L (sigmoid_reference.hpp), so D is within
// (tau_L+ + tau_L-) / (2h) of the exact quotient, which is within
// h^2 / 6 max|L'''| of the derivative. For the bias, |d^3 softplus / dt^3| =
// |sigma (1 - sigma)(1 - 2 sigma)| <= 1 / (6 sqrt 3) per term, so |L'''| <= c
// / (6 sqrt 3); for the scale each term carries <q_i, k_j>^3 in addition,
// |L'''| <= c A^3 / (6 sqrt 3). The library's ds / dt are within their own
// bound of the exact derivative.
TEST_CASE("contrastive/sigmoid/fp32/ds and dt by finite differences") {
  for (const SigmoidShape &x : {shape(17, 17, 6, 10.0, -10.0), shape(13, 29, 5, 4.0, 2.0, Dtype::f32, true),
                                shape(11, 11, 4, 100.0, -10.0)}) {
    CAPTURE(x.b);
    CAPTURE(x.scale);
    SigmoidCase c(x);
    Handle h = sigmoid_handle(2, 8, 8);
    SigmoidOutputs vg = c.outputs();
    require_ok(c.value_and_grad(h.get(), vg));
    const SigmoidProblem p0 = c.problem();
    const SigmoidResult r0 = sigmoid_reference(p0);
    const SigmoidTolerance t0 = sigmoid_tolerance(p0, r0, Dtype::f32, Dtype::f32);
    const double third = double(x.c) / (6.0 * std::sqrt(3.0));

    // returns (D, its error budget) for the parameter tensor `param`
    const auto quotient = [&](HostTensor &param, double step, double third_derivative) {
      const double centre = param.get(0);
      double loss[2], at[2], budget = 0.0;
      for (int side = 0; side < 2; ++side) {
        param.set(0, centre + (side ? step : -step));
        at[side] = param.get(0);
        SigmoidOutputs o = c.outputs();
        require_ok(c.forward(h.get(), o));
        loss[side] = o.loss.get(0);
        const SigmoidProblem p = c.problem();
        budget += sigmoid_tolerance(p, sigmoid_reference(p), Dtype::f32, Dtype::f32).loss;
      }
      param.set(0, centre);
      const double width = at[1] - at[0];
      budget = budget / width + width * width / 24.0 * third_derivative;
      return std::pair{(loss[1] - loss[0]) / width, budget};
    };
    const double a3 = std::pow(r0.max_abs_dot, 3.0);
    const auto [dt_fd, dt_budget] = quotient(c.bias, 1e-2, third);
    const auto [ds_fd, ds_budget] = quotient(c.scale, 1e-2 / std::max(1.0, r0.max_abs_dot), third * a3);
    CHECK_MESSAGE(std::fabs(vg.dt.get(0) - dt_fd) <= dt_budget + t0.dt, "dlogit_bias ", vg.dt.get(0),
                  " vs finite difference ", dt_fd, " (budget ", dt_budget + t0.dt, ")");
    CHECK_MESSAGE(std::fabs(vg.ds.get(0) - ds_fd) <= ds_budget + t0.ds, "dlogit_scale ", vg.ds.get(0),
                  " vs finite difference ", ds_fd, " (budget ", ds_budget + t0.ds, ")");
  }
}

// Bitwise the same results whatever the thread count (flatmem.h,
// "Determinism"): the tile grid depends on shapes and options only.
TEST_CASE("contrastive/sigmoid/determinism across thread counts") {
  for (Dtype dtype : {Dtype::f32, Dtype::bf16}) {
    CAPTURE(dtype_name(dtype));
    const SigmoidCase c(shape(131, 173, 21, 10.0, -10.0, dtype, true));
    SigmoidOutputs first = c.outputs();
    {
      Handle h = sigmoid_handle(1, 16, 24);
      require_ok(c.value_and_grad(h.get(), first));
    }
    for (int threads : {2, 3, 5, 8}) {
      CAPTURE(threads);
      Handle h = sigmoid_handle(threads, 16, 24);
      for (int repeat = 0; repeat < 2; ++repeat) {
        SigmoidOutputs o = c.outputs();
        require_ok(c.value_and_grad(h.get(), o));
        CHECK(o.loss.same_bits(first.loss));
        CHECK(o.dq.same_bits(first.dq));
        CHECK(o.dk.same_bits(first.dk));
        CHECK(o.ds.same_bits(first.ds));
        CHECK(o.dt.same_bits(first.dt));
      }
    }
  }
}
