// extern "C" entry points of the sigmoid (SigLIP) loss (flatmem.h, "Sigmoid
// (SigLIP) loss"): argument checks shared with the softmax losses
// (validate.hpp), then the backend q's device selects: the CPU driver
// (cpu/sigmoid.hpp) or, for kDLCUDA tensors in a build with the CUDA backend,
// the CUDA kernels (cuda/backend.hpp; t and g then stay on the device, and
// the CUDA path is compiled everywhere but tested only where a GPU exists);
// or, for a handle with a communicator, the ring across ranks
// (ring/ring_sigmoid.cpp; ring/cuda/ on CUDA tensors), which runs the same checks on
// every rank before the agreement. The logit cache is refused when the handle
// is created (validate.cpp).
#include <cmath>
#include <functional>

#include "contrastive/cpu/sigmoid.hpp"
#ifdef FLATMEM_HAVE_CUDA_BACKEND
#include "contrastive/cuda/backend.hpp"
#endif
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

// Whether a validated call runs on the CUDA backend (the checks refuse
// kDLCUDA tensors in a build without it). On CUDA no value behind a pointer
// is read on the host.
bool on_cuda(const MatrixView &q) {
  return cuda_backend_built() && q.device.device_type == kDLCUDA;
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
                            const DLTensor *logit_bias, SigmoidArgs &args) {
  const Inputs in = check_inputs(h->options, q, k, labels, logit_scale,
                                 h->options.comm ? Scope::ring : Scope::single_process);
  if (logit_bias == nullptr) invalid("logit_bias: NULL; pass the bias t (0 for none)");
  args.bias_data = scalar_on(logit_bias, "logit_bias", in);
  if (on_cuda(in.q)) return in;  // t is read (and checked) on the device
  args.bias = *args.bias_data;
  if (!std::isfinite(args.bias)) invalid("logit_bias: ", args.bias, "; expected a finite value");
  return in;
}

// dq, dk, dlogit_scale, dlogit_bias (each may be NULL) into args.
void check_sigmoid_gradients(const Inputs &in, DLTensor *dq, DLTensor *dk, DLTensor *dlogit_scale,
                             DLTensor *dlogit_bias, SigmoidArgs &args) {
  args.dq = check_gradient(dq, "dq", in.q, "q", DataUse::required);
  args.dk = check_gradient(dk, "dk", in.k, "k", DataUse::required);
  args.dscale = scalar_on(dlogit_scale, "dlogit_scale", in);
  args.dbias = scalar_on(dlogit_bias, "dlogit_bias", in);
}

Plan plan_for(const flatmem_contrastive_t *h, const MatrixView &q, const MatrixView &k) {
  return make_plan(q.rows, k.rows, q.cols, h->options);
}

void run(flatmem_contrastive_t *h, const Inputs &in, const SigmoidArgs &args,
         void *workspace, size_t workspace_bytes, void *stream) {
  if (on_cuda(in.q)) {
#ifdef FLATMEM_HAVE_CUDA_BACKEND
    cuda::sigmoid(h->options, in, args, workspace, workspace_bytes, stream);
    return;
#else
    (void)stream;
    invalid("internal: kDLCUDA tensor in a build without CUDA");
#endif
  }
  const Plan plan = plan_for(h, in.q, in.k);
  const std::size_t needed = cpu::sigmoid_workspace_bytes(
      plan, in.q.dtype, args.dq.data ? &args.dq.dtype : nullptr,
      args.dk.data ? &args.dk.dtype : nullptr, h->pool.size());
  cpu::sigmoid(h->pool, plan, in, args, h->workspace.resolve(workspace, workspace_bytes, needed));
}

// This rank's checks fill in `in` and `args`; then the ring (collective, CPU
// tensors only) or the single-process call on q's device.
using Check = std::function<void(Inputs &, SigmoidArgs &)>;
void dispatch(flatmem_contrastive_t *h, const char *function, const Check &check, void *workspace,
              size_t workspace_bytes, void *stream) {
  if (h->options.comm) return ring::sigmoid(*h, function, check, workspace, workspace_bytes, stream);
  Inputs in;
  SigmoidArgs args;
  check(in, args);
  run(h, in, args, workspace, workspace_bytes, stream);
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
    if (handle->options.comm) {  // the ring uses the handle's own buffers
      *bytes = 0;
      return;
    }
    const MatrixView dqv = check_gradient(dq, "dq", qv, "q", DataUse::metadata_only);
    const MatrixView dkv = check_gradient(dk, "dk", kv, "k", DataUse::metadata_only);
#ifdef FLATMEM_HAVE_CUDA_BACKEND
    if (on_cuda(qv)) {
      *bytes = cuda::sigmoid_workspace_bytes(handle->options, qv, kv, dq != nullptr, dk != nullptr);
      return;
    }
#endif
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
    constexpr const char *fn = "flatmem_contrastive_sigmoid_forward";
    check_handle(handle, fn);
    cpu_isa::active();
    dispatch(handle, fn, [&](Inputs &in, SigmoidArgs &args) {
      in = check_sigmoid_inputs(handle, q, k, labels, logit_scale, logit_bias, args);
      if (loss == nullptr) invalid("loss: NULL");
      args.loss = scalar_on(loss, "loss", in);
    }, workspace, workspace_bytes, stream);
  });
}

flatmem_status flatmem_contrastive_sigmoid_value_and_grad(
    flatmem_contrastive_t *handle, const DLTensor *q, const DLTensor *k, const DLTensor *labels,
    const DLTensor *logit_scale, const DLTensor *logit_bias, DLTensor *loss, DLTensor *dq,
    DLTensor *dk, DLTensor *dlogit_scale, DLTensor *dlogit_bias, void *workspace,
    size_t workspace_bytes, void *stream) {
  return guarded([&] {
    constexpr const char *fn = "flatmem_contrastive_sigmoid_value_and_grad";
    check_handle(handle, fn);
    cpu_isa::active();
    dispatch(handle, fn, [&](Inputs &in, SigmoidArgs &args) {
      in = check_sigmoid_inputs(handle, q, k, labels, logit_scale, logit_bias, args);
      args.loss = scalar_on(loss, "loss", in);
      check_sigmoid_gradients(in, dq, dk, dlogit_scale, dlogit_bias, args);
      if (!args.loss && !args.wants_gradient())
        invalid("loss, dq, dk, dlogit_scale, dlogit_bias: all NULL; request at least one output");
    }, workspace, workspace_bytes, stream);
  });
}

flatmem_status flatmem_contrastive_sigmoid_backward(
    flatmem_contrastive_t *handle, const DLTensor *q, const DLTensor *k, const DLTensor *labels,
    const DLTensor *logit_scale, const DLTensor *logit_bias, const DLTensor *dloss, DLTensor *dq,
    DLTensor *dk, DLTensor *dlogit_scale, DLTensor *dlogit_bias, void *workspace,
    size_t workspace_bytes, void *stream) {
  return guarded([&] {
    constexpr const char *fn = "flatmem_contrastive_sigmoid_backward";
    check_handle(handle, fn);
    cpu_isa::active();
    dispatch(handle, fn, [&](Inputs &in, SigmoidArgs &args) {
      in = check_sigmoid_inputs(handle, q, k, labels, logit_scale, logit_bias, args);
      args.dloss_data = scalar_on(dloss, "dloss", in);
      if (args.dloss_data && !on_cuda(in.q)) args.dloss = *args.dloss_data;
      if (handle->options.nonfinite == FLATMEM_NONFINITE_ERROR && !std::isfinite(args.dloss))
        fail(FLATMEM_STATUS_NON_FINITE, "dloss: ", args.dloss,
             "; expected a finite upstream gradient");
      check_sigmoid_gradients(in, dq, dk, dlogit_scale, dlogit_bias, args);
      if (!args.wants_gradient())
        invalid("dq, dk, dlogit_scale, dlogit_bias: all NULL; request at least one gradient");
    }, workspace, workspace_bytes, stream);
  });
}

}  // extern "C"
