#include "contrastive/sigmoid_case.hpp"

#include <doctest/doctest.h>

#include <stdexcept>
#include <utility>

#include "support/compare.hpp"
#include "support/random.hpp"

namespace flatmem_test {
namespace {

DLTensor *dl_if(bool want, HostTensor &t) { return want ? t.dl() : nullptr; }

}  // namespace

SigmoidCase::SigmoidCase(const SigmoidShape &s) : shape(s) {
  Random rng(s.seed);
  q = HostTensor::matrix(s.dtype, s.b, s.d);
  k = HostTensor::matrix(s.dtype, s.c, s.d);
  fill_features(q, rng, s.sigma, s.unit_rows);
  fill_features(k, rng, s.sigma, s.unit_rows);
  if (s.labels) {
    labels = HostTensor::vector(Dtype::i64, s.b);
    for (std::int64_t i = 0; i < s.b; ++i) labels.set(i, double(rng.below(s.c)));
  }
  scale = HostTensor::scalar(Dtype::f32, s.scale);
  bias = HostTensor::scalar(Dtype::f32, s.bias);
}

SigmoidCase::SigmoidCase(const SigmoidShape &s, HostTensor q_in, HostTensor k_in,
                         HostTensor labels_in)
    : shape(s), q(std::move(q_in)), k(std::move(k_in)), labels(std::move(labels_in)) {
  // no doctest macro: rank processes of the ring tests build cases too
  if (q.rows() != s.b || k.rows() != s.c || (s.labels && labels.elements() != s.b))
    throw std::logic_error("SigmoidCase: the inputs do not match the shape");
  scale = HostTensor::scalar(Dtype::f32, s.scale);
  bias = HostTensor::scalar(Dtype::f32, s.bias);
}

SigmoidOutputs SigmoidCase::outputs() const {
  SigmoidOutputs o;
  o.loss = HostTensor::scalar(Dtype::f32, 0.0);
  o.dq = HostTensor::matrix(shape.grad_dtype, shape.b, shape.d);
  o.dk = HostTensor::matrix(shape.grad_dtype, shape.c, shape.d);
  o.ds = HostTensor::scalar(Dtype::f32, 0.0);
  o.dt = HostTensor::scalar(Dtype::f32, 0.0);
  for (HostTensor *t : {&o.loss, &o.dq, &o.dk, &o.ds, &o.dt}) t->fill_bytes(sentinel_byte);
  return o;
}

flatmem_status SigmoidCase::forward(flatmem_contrastive_t *h, SigmoidOutputs &out) const {
  return flatmem_contrastive_sigmoid_forward(h, q.dl(), k.dl(), shape.labels ? labels.dl() : nullptr,
                                             scale.dl(), bias.dl(), out.loss.dl(), nullptr, 0,
                                             nullptr);
}

flatmem_status SigmoidCase::value_and_grad(flatmem_contrastive_t *h, SigmoidOutputs &out,
                                           bool want_loss, bool want_dq, bool want_dk,
                                           bool want_ds, bool want_dt) const {
  return flatmem_contrastive_sigmoid_value_and_grad(
      h, q.dl(), k.dl(), shape.labels ? labels.dl() : nullptr, scale.dl(), bias.dl(),
      dl_if(want_loss, out.loss), dl_if(want_dq, out.dq), dl_if(want_dk, out.dk),
      dl_if(want_ds, out.ds), dl_if(want_dt, out.dt), nullptr, 0, nullptr);
}

flatmem_status SigmoidCase::backward(flatmem_contrastive_t *h, double dloss,
                                     SigmoidOutputs &out) const {
  HostTensor g = HostTensor::scalar(Dtype::f32, dloss);
  return flatmem_contrastive_sigmoid_backward(
      h, q.dl(), k.dl(), shape.labels ? labels.dl() : nullptr, scale.dl(), bias.dl(), g.dl(),
      out.dq.dl(), out.dk.dl(), out.ds.dl(), out.dt.dl(), nullptr, 0, nullptr);
}

SigmoidProblem SigmoidCase::problem(double dloss) const {
  SigmoidProblem p;
  p.b = shape.b;
  p.c = shape.c;
  p.d = shape.d;
  p.q = q.values();
  p.k = k.values();
  if (shape.labels)
    for (std::int64_t i = 0; i < shape.b; ++i) p.labels.push_back(std::int64_t(labels.get(i)));
  p.scale = scale.get(0);
  p.bias = bias.get(0);
  p.dloss = HostTensor::scalar(Dtype::f32, dloss).get(0);
  return p;
}

void check_against_reference(const SigmoidCase &c, const SigmoidOutputs &out, double dloss,
                             SigmoidChecks which) {
  const SigmoidProblem p = c.problem(dloss);
  const SigmoidResult r = sigmoid_reference(p);
  const SigmoidTolerance t = sigmoid_tolerance(p, r, out.dq.dtype(), out.dk.dtype(), c.q.dtype());
  if (which.loss) check_close("loss", out.loss, r.loss, t.loss);
  if (which.dq) check_close("dq", out.dq, r.dq, t.dq);
  if (which.dk) check_close("dk", out.dk, r.dk, t.dk);
  if (which.ds) check_close("dlogit_scale", out.ds, r.ds, t.ds);
  if (which.dt) check_close("dlogit_bias", out.dt, r.dt, t.dt);
}

Handle sigmoid_handle(int threads, int tile_rows, int tile_cols, flatmem_nonfinite_policy nonfinite) {
  return create_handle(make_options(FLATMEM_CONTRASTIVE_SIGMOID, threads, tile_rows, tile_cols, nonfinite));
}

}  // namespace flatmem_test
