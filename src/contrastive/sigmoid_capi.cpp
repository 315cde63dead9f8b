// extern "C" entry points of the sigmoid (SigLIP) loss (flatmem.h, "Sigmoid
// (SigLIP) loss"): argument checks shared with the softmax losses
// (validate.hpp), then the CPU driver (cpu/sigmoid.hpp) or, for a handle
// with a communicator, the ring across ranks (ring/ring_sigmoid.cpp), which
// runs the same checks on every rank before the agreement. kDLCUDA tensors are
// refused as UNSUPPORTED until the CUDA kernels exist; the logit cache is
// refused when the handle is created (validate.cpp).
#include <cmath>
#include <functional>

#include "contrastive/cpu/sigmoid.hpp"
#include "contrastive/handle.hpp"
#include "contrastive/plan.hpp"
#include "contrastive/ring/ring.hpp"
#include "contrastive/validate.hpp"
#include "core/cpu_isa.hpp"
#include "core/error.hpp"

using namespace flatmem;
using namespace flatmem::contrastive;

namespace {

constexpr Devices any = Devices::cpu_or_cuda;

void check_handle(const flatmem_contrastive_t *h, const char *function) {
  if (h == nullptr) invalid("handle: NULL (create one with flatmem_contrastive_create)");
  check_loss_kind(h->options, true, function);
}

void refuse_cuda(const MatrixView &q, const char *function) {
  if (q.device.device_type == kDLCUDA)
    fail(FLATMEM_STATUS_UNSUPPORTED, "q: device is kDLCUDA; ", function,
         " has no CUDA kernels yet (CPU tensors only)");
}

// One fp32 element on q's device, or NULL when `optional`.
float *scalar_on(const DLTensor *t, const char *name, const Inputs &in) {
  if (t == nullptr) return nullptr;
  const VectorView v = check_scalar(t, name, any);
  check_same_device(v.device, name, in.q.device, "q");
  return v.as<float>();
}

// The inputs every sigmoid call takes: features, labels, s and t.
Inputs check_sigmoid_inputs(const flatmem_contrastive_t *h, const DLTensor *q, const DLTensor *k,
                            const DLTensor *labels, const DLTensor *logit_scale,
                            const DLTensor *logit_bias, cpu::SigmoidArgs &args,
                            const char *function) {
  MatrixView qv, kv;  // the device first: CUDA tensors are refused before any pointer is read
  check_features(h->options, q, k, DataUse::metadata_only, qv, kv);
  refuse_cuda(qv, function);
  const Inputs in = check_inputs(h->options, q, k, labels, logit_scale,
                                 h->options.comm ? Scope::ring : Scope::single_process);
  if (logit_bias == nullptr) invalid("logit_bias: NULL; pass the bias t (0 for none)");
  args.bias = *scalar_on(logit_bias, "logit_bias", in);
  if (!std::isfinite(args.bias)) invalid("logit_bias: ", args.bias, "; expected a finite value");
  return in;
}

// dq, dk, dlogit_scale, dlogit_bias (each may be NULL) into args.
void check_sigmoid_gradients(const Inputs &in, DLTensor *dq, DLTensor *dk, DLTensor *dlogit_scale,
                             DLTensor *dlogit_bias, cpu::SigmoidArgs &args) {
  args.dq = check_gradient(dq, "dq", in.q, "q", DataUse::required);
  args.dk = check_gradient(dk, "dk", in.k, "k", DataUse::required);
  args.dscale = scalar_on(dlogit_scale, "dlogit_scale", in);
  args.dbias = scalar_on(dlogit_bias, "dlogit_bias", in);
}

Plan plan_for(const flatmem_contrastive_t *h, const MatrixView &q, const MatrixView &k) {
  return make_plan(q.rows, k.rows, q.cols, h->options);
}

void run(flatmem_contrastive_t *h, const Inputs &in, const cpu::SigmoidArgs &args,
         void *workspace, size_t workspace_bytes) {
  const Plan plan = plan_for(h, in.q, in.k);
  const std::size_t needed = cpu::sigmoid_workspace_bytes(
      plan, in.q.dtype, args.dq.data ? &args.dq.dtype : nullptr,
      args.dk.data ? &args.dk.dtype : nullptr, h->pool.size());
  cpu::sigmoid(h->pool, plan, in, args, h->workspace.resolve(workspace, workspace_bytes, needed));
}

// This rank's checks fill in `in` and `args`; then the ring (collective) or
// the single-process call.
using Check = std::function<void(Inputs &, cpu::SigmoidArgs &)>;
void dispatch(flatmem_contrastive_t *h, const char *function, const Check &check, void *workspace,
              size_t workspace_bytes) {
  if (h->options.comm) return ring::sigmoid(*h, function, check, workspace, workspace_bytes);
  Inputs in;
  cpu::SigmoidArgs args;
  check(in, args);
  run(h, in, args, workspace, workspace_bytes);
}

}  // namespace

extern "C" {

flatmem_status flatmem_contrastive_sigmoid_workspace_size(const flatmem_contrastive_t *handle,
                                                          const DLTensor *q, const DLTensor *k,
                                                          const DLTensor *dq, const DLTensor *dk,
                                                          size_t *bytes) {
  return guarded([&] {
    check_handle(handle, "flatmem_contrastive_sigmoid_workspace_size");
    if (bytes == nullptr) invalid("bytes: NULL");
    MatrixView qv, kv;
    check_features(handle->options, q, k, DataUse::metadata_only, qv, kv);
    refuse_cuda(qv, "flatmem_contrastive_sigmoid_workspace_size");
    if (handle->options.comm) {  // the ring uses the handle's own buffers
      *bytes = 0;
      return;
    }
    const MatrixView dqv = check_gradient(dq, "dq", qv, "q", DataUse::metadata_only);
    const MatrixView dkv = check_gradient(dk, "dk", kv, "k", DataUse::metadata_only);
    *bytes = cpu::sigmoid_workspace_bytes(plan_for(handle, qv, kv), qv.dtype,
                                          dq ? &dqv.dtype : nullptr, dk ? &dkv.dtype : nullptr,
                                          handle->pool.size());
  });
}

flatmem_status flatmem_contrastive_sigmoid_forward(flatmem_contrastive_t *handle, const DLTensor *q,
                                                   const DLTensor *k, const DLTensor *labels,
                                                   const DLTensor *logit_scale,
                                                   const DLTensor *logit_bias, DLTensor *loss,
                                                   void *workspace, size_t workspace_bytes,
                                                   void *stream) {
  return guarded([&] {
    (void)stream;  // CUDA only
    constexpr const char *fn = "flatmem_contrastive_sigmoid_forward";
    check_handle(handle, fn);
    cpu_isa::active();
    dispatch(handle, fn, [&](Inputs &in, cpu::SigmoidArgs &args) {
      in = check_sigmoid_inputs(handle, q, k, labels, logit_scale, logit_bias, args, fn);
      if (loss == nullptr) invalid("loss: NULL");
      args.loss = scalar_on(loss, "loss", in);
    }, workspace, workspace_bytes);
  });
}

flatmem_status flatmem_contrastive_sigmoid_value_and_grad(
    flatmem_contrastive_t *handle, const DLTensor *q, const DLTensor *k, const DLTensor *labels,
    const DLTensor *logit_scale, const DLTensor *logit_bias, DLTensor *loss, DLTensor *dq,
    DLTensor *dk, DLTensor *dlogit_scale, DLTensor *dlogit_bias, void *workspace,
    size_t workspace_bytes, void *stream) {
  return guarded([&] {
    (void)stream;  // CUDA only
    constexpr const char *fn = "flatmem_contrastive_sigmoid_value_and_grad";
    check_handle(handle, fn);
    cpu_isa::active();
    dispatch(handle, fn, [&](Inputs &in, cpu::SigmoidArgs &args) {
      in = check_sigmoid_inputs(handle, q, k, labels, logit_scale, logit_bias, args, fn);
      args.loss = scalar_on(loss, "loss", in);
      check_sigmoid_gradients(in, dq, dk, dlogit_scale, dlogit_bias, args);
      if (!args.loss && !args.wants_gradient())
        invalid("loss, dq, dk, dlogit_scale, dlogit_bias: all NULL; request at least one output");
    }, workspace, workspace_bytes);
  });
}

flatmem_status flatmem_contrastive_sigmoid_backward(
    flatmem_contrastive_t *handle, const DLTensor *q, const DLTensor *k, const DLTensor *labels,
    const DLTensor *logit_scale, const DLTensor *logit_bias, const DLTensor *dloss, DLTensor *dq,
    DLTensor *dk, DLTensor *dlogit_scale, DLTensor *dlogit_bias, void *workspace,
    size_t workspace_bytes, void *stream) {
  return guarded([&] {
    (void)stream;  // CUDA only
    constexpr const char *fn = "flatmem_contrastive_sigmoid_backward";
    check_handle(handle, fn);
    cpu_isa::active();
    dispatch(handle, fn, [&](Inputs &in, cpu::SigmoidArgs &args) {
      in = check_sigmoid_inputs(handle, q, k, labels, logit_scale, logit_bias, args, fn);
      if (const float *g = scalar_on(dloss, "dloss", in)) args.dloss = *g;
      if (handle->options.nonfinite == FLATMEM_NONFINITE_ERROR && !std::isfinite(args.dloss))
        fail(FLATMEM_STATUS_NON_FINITE, "dloss: ", args.dloss,
             "; expected a finite upstream gradient");
      check_sigmoid_gradients(in, dq, dk, dlogit_scale, dlogit_bias, args);
      if (!args.wants_gradient())
        invalid("dq, dk, dlogit_scale, dlogit_bias: all NULL; request at least one gradient");
    }, workspace, workspace_bytes);
  });
}

}  // extern "C"
