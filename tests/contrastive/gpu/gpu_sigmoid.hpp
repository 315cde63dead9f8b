// One sigmoid-loss case (contrastive/sigmoid_case.hpp) run on the CUDA
// backend: the case's host inputs copied to the device, one of the three calls
// on the legacy default stream with a device workspace of exactly the queried
// size, and the outputs copied back into host tensors prefilled with sentinel
// bytes (an output that is not written shows).
//
// Tolerances: sigmoid_tolerance (contrastive/sigmoid_reference.hpp, the CPU's
// worst-case bounds) plus what the tensor cores add (gpu_call.hpp's
// tensor_core_error: r_p per product, r_G for the rounded Gt and, for TF32,
// the other factor of the second product):
//   logits: dx_tc = s r_p A (A = max_ij sum_t |q_it k_jt|) on top of dx; the
//     loss moves by <= dx_tc sum |G| (g = 1), each G relatively by dx_tc
//     (sigmoid' <= sigmoid), so
//   dq_it: + s (dx_tc + r_G) sum_j |G_ij| |k_jt|, and for fp16 operands, whose
//     subnormals end at 2^-24, Gt in [-1, 1] rounds with an absolute error up
//     to 2^-25: + s |g| / b 2^-25 sum_j |k_jt| (dk alike over i);
//   ds = sum G raw: + (dx_tc + r_p) sum |G| R;  dt: + dx_tc sum |G|.
// (times `slack`, as every bound of the suite).
#pragma once

#include <doctest/doctest.h>
#include <flatmem/flatmem.h>

#include <cmath>
#include <utility>

#include "contrastive/gpu/gpu_call.hpp"
#include "contrastive/sigmoid_case.hpp"
#include "contrastive/sigmoid_reference.hpp"

namespace flatmem_test {

enum class SigmoidCall { forward, value_and_grad, backward };

/** Which outputs a call is given (NULL for the others). forward: loss only. */
struct SigmoidRequest {
  bool loss = true, dq = true, dk = true, ds = true, dt = true;
};

/** A SIGMOID handle for CUDA tensors (PROPAGATE, the given fp32 precision). */
inline Handle gpu_sigmoid_handle(flatmem_fp32_precision precision = FLATMEM_FP32_PRECISION_DEFAULT) {
  return create_handle(gpu_options(FLATMEM_CONTRASTIVE_SIGMOID, precision));
}

/** Device copies of a case's inputs (labels only when the case has them). */
struct DeviceSigmoidInputs {
  DeviceTensor q, k, labels, scale, bias;
  bool has_labels = false;
  explicit DeviceSigmoidInputs(const SigmoidCase &c)
      : q(c.q), k(c.k), scale(c.scale), bias(c.bias), has_labels(c.shape.labels) {
    if (has_labels) labels = DeviceTensor(c.labels);
  }
  const DLTensor *labels_dl() const { return has_labels ? labels.dl() : nullptr; }
};

/** Device copies of a case's (sentinel-filled) outputs. */
struct DeviceSigmoidOutputs {
  DeviceTensor loss, dq, dk, ds, dt;
  explicit DeviceSigmoidOutputs(const SigmoidOutputs &o)
      : loss(o.loss), dq(o.dq), dk(o.dk), ds(o.ds), dt(o.dt) {}
  void download(SigmoidOutputs &o) const {
    loss.download(o.loss);
    dq.download(o.dq);
    dk.download(o.dk);
    ds.download(o.ds);
    dt.download(o.dt);
  }
};

inline DLTensor *dl_if(bool want, DeviceTensor &t) { return want ? t.dl() : nullptr; }

/** The workspace bytes the library asks for these requested gradients. */
inline std::size_t gpu_sigmoid_workspace(flatmem_contrastive_t *h, DeviceSigmoidInputs &in,
                                         DeviceSigmoidOutputs &out, bool dq, bool dk) {
  std::size_t bytes = 0;
  const flatmem_status status = flatmem_contrastive_sigmoid_workspace_size(
      h, in.q.dl(), in.k.dl(), dl_if(dq, out.dq), dl_if(dk, out.dk), &bytes);
  REQUIRE_MESSAGE(status == FLATMEM_STATUS_SUCCESS, describe(status));
  CHECK(bytes > 0);  // the CUDA backend never allocates: its partial sums live there
  return bytes;
}

/** One call with the given workspace; outputs stay on the device. */
inline flatmem_status gpu_sigmoid_raw(flatmem_contrastive_t *h, SigmoidCall call,
                                      const SigmoidRequest &want, const DLTensor *dloss,
                                      DeviceSigmoidInputs &in, DeviceSigmoidOutputs &out,
                                      void *workspace, std::size_t bytes) {
  switch (call) {
    case SigmoidCall::forward:
      return flatmem_contrastive_sigmoid_forward(h, in.q.dl(), in.k.dl(), in.labels_dl(), in.scale.dl(),
                                                 in.bias.dl(), out.loss.dl(), workspace, bytes, nullptr);
    case SigmoidCall::value_and_grad:
      return flatmem_contrastive_sigmoid_value_and_grad(
          h, in.q.dl(), in.k.dl(), in.labels_dl(), in.scale.dl(), in.bias.dl(), dl_if(want.loss, out.loss),
          dl_if(want.dq, out.dq), dl_if(want.dk, out.dk), dl_if(want.ds, out.ds), dl_if(want.dt, out.dt),
          workspace, bytes, nullptr);
    case SigmoidCall::backward:
      return flatmem_contrastive_sigmoid_backward(
          h, in.q.dl(), in.k.dl(), in.labels_dl(), in.scale.dl(), in.bias.dl(), dloss,
          dl_if(want.dq, out.dq), dl_if(want.dk, out.dk), dl_if(want.ds, out.ds), dl_if(want.dt, out.dt),
          workspace, bytes, nullptr);
  }
  return FLATMEM_STATUS_INTERNAL;
}

/** The outputs a call writes: forward only the loss, backward no loss. */
inline SigmoidRequest written_by(SigmoidCall call, SigmoidRequest want) {
  if (call == SigmoidCall::forward) return {true, false, false, false, false};
  if (call == SigmoidCall::backward) want.loss = false;
  return want;
}

/** The call on the device; the outputs come back in the result: those the call
 *  writes prefilled with NaN (so that a missing write fails the value check),
 *  the others with sentinel bytes (so that a stray write shows). */
inline SigmoidOutputs gpu_sigmoid(flatmem_contrastive_t *h, const SigmoidCase &c, SigmoidCall call,
                                  const SigmoidRequest &want = {}, double dloss = 1.0) {
  SigmoidOutputs o = c.outputs();
  const SigmoidRequest written = written_by(call, want);
  const std::pair<bool, HostTensor *> outputs[] = {
      {written.loss, &o.loss}, {written.dq, &o.dq}, {written.dk, &o.dk}, {written.ds, &o.ds}, {written.dt, &o.dt}};
  for (const auto &[filled, t] : outputs)
    if (filled) fill_nan_values(*t);
  DeviceSigmoidInputs in(c);
  DeviceSigmoidOutputs out(o);
  HostTensor g = HostTensor::scalar(Dtype::f32, dloss);
  DeviceTensor d_g(g);
  const bool grads = call != SigmoidCall::forward;
  DeviceBuffer workspace(gpu_sigmoid_workspace(h, in, out, grads && want.dq, grads && want.dk));
  const flatmem_status status = gpu_sigmoid_raw(h, call, want, d_g.dl(), in, out, workspace.data(),
                                                workspace.size());
  REQUIRE_MESSAGE(status == FLATMEM_STATUS_SUCCESS, describe(status));
  out.download(o);
  return o;
}

/** sigmoid_tolerance plus the tensor-core terms of the file comment. */
inline SigmoidTolerance gpu_sigmoid_tolerance(const SigmoidProblem &p, const SigmoidResult &r,
                                              Dtype dq_out, Dtype dk_out, Dtype input,
                                              flatmem_fp32_precision precision) {
  SigmoidTolerance t = sigmoid_tolerance(p, r, dq_out, dk_out);
  const TensorCoreError e = tensor_core_error(input, precision);
  const double dx_tc = p.scale * e.product * r.max_abs_dot;
  const double g = std::fabs(p.dloss);
  const double sum_abs_g1 = g > 0.0 ? r.sum_abs_g / g : double(p.c);
  const double floor = input == Dtype::f16 ? g / double(p.b) * 0x1p-25 : 0.0;
  t.loss += slack * dx_tc * sum_abs_g1;
  for (std::size_t n = 0; n < t.dq.size(); ++n)
    t.dq[n] += slack * p.scale * ((dx_tc + e.gradient) * r.dq_abs[n] + floor * r.dq_count[n]);
  for (std::size_t n = 0; n < t.dk.size(); ++n)
    t.dk[n] += slack * p.scale * ((dx_tc + e.gradient) * r.dk_abs[n] + floor * r.dk_count[n]);
  t.ds += slack * (dx_tc + e.product) * r.sum_abs_g_r;
  t.dt += slack * dx_tc * r.sum_abs_g;
  return t;
}

/** The outputs `which` names against the double reference of the case (g = dloss). */
inline void check_gpu_sigmoid(const SigmoidCase &c, const SigmoidOutputs &out, double dloss,
                              SigmoidChecks which, flatmem_fp32_precision precision) {
  const SigmoidProblem p = c.problem(dloss);
  const SigmoidResult r = sigmoid_reference(p);
  const SigmoidTolerance t =
      gpu_sigmoid_tolerance(p, r, out.dq.dtype(), out.dk.dtype(), c.shape.dtype, precision);
  if (which.loss) check_close("loss", out.loss, r.loss, t.loss);
  if (which.dq) check_close("dq", out.dq, r.dq, t.dq);
  if (which.dk) check_close("dk", out.dk, r.dk, t.dk);
  if (which.ds) check_close("dlogit_scale", out.ds, r.ds, t.ds);
  if (which.dt) check_close("dlogit_bias", out.dt, r.dt, t.dt);
}

}  // namespace flatmem_test
