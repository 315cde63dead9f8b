// XLA FFI handlers of the ring losses and of the all-reduce for XLA:CPU. The
// attribute comm is the communicator's registry slot (ring_registry.hpp), and
// the losses' fp32_precision the ring handle's options.fp32_precision;
// the ring takes no workspace, so these have no workspace result. Operand
// lists: contrastive_bindings.hpp (Workspace = false, CommAttr).
#include "contrastive_bindings.hpp"
#include "flatmem_jax.h"
#include "ring_call.hpp"

namespace {

using namespace flatmem_jax;

constexpr DLDevice kCpu{kDLCPU, 0};
using Buffer = ffi::AnyBuffer;
using Out = ffi::Result<ffi::AnyBuffer>;

ffi::Error clip_forward(Buffer q, Buffer k, Buffer s, Out loss, Out row_lse, Out col_lse,
                        int64_t comm, int64_t fp32_precision) {
  RingSource handles(comm, FLATMEM_CONTRASTIVE_SYMMETRIC, fp32_precision);
  NoWorkspace ws;
  return call_forward(handles, kCpu, nullptr, {q, k, s, std::nullopt, *loss, *row_lse, *col_lse},
                      ws);
}

ffi::Error clip_backward(Buffer q, Buffer k, Buffer s, Buffer row_lse, Buffer col_lse, Buffer g,
                         Out dq, Out dk, Out ds, int64_t comm, int64_t fp32_precision) {
  RingSource handles(comm, FLATMEM_CONTRASTIVE_SYMMETRIC, fp32_precision);
  NoWorkspace ws;
  return call_backward(handles, kCpu, nullptr,
                       {q, k, s, std::nullopt, row_lse, col_lse, g, *dq, *dk, *ds}, ws);
}

ffi::Error infonce_forward(Buffer q, Buffer k, Buffer s, Out loss, Out row_lse,
                           std::optional<Buffer> labels, int64_t comm, int64_t fp32_precision) {
  RingSource handles(comm, FLATMEM_CONTRASTIVE_INFONCE, fp32_precision);
  NoWorkspace ws;
  return call_forward(handles, kCpu, nullptr, {q, k, s, labels, *loss, *row_lse, std::nullopt},
                      ws);
}

ffi::Error infonce_backward(Buffer q, Buffer k, Buffer s, Buffer row_lse, Buffer g, Out dq, Out dk,
                            Out ds, std::optional<Buffer> labels, int64_t comm,
                            int64_t fp32_precision) {
  RingSource handles(comm, FLATMEM_CONTRASTIVE_INFONCE, fp32_precision);
  NoWorkspace ws;
  return call_backward(handles, kCpu, nullptr,
                       {q, k, s, labels, row_lse, std::nullopt, g, *dq, *dk, *ds}, ws);
}

ffi::Error sigmoid(SigmoidCall call, int64_t comm, int64_t fp32_precision,
                   const SigmoidBuffers &io) {
  RingSource handles(comm, FLATMEM_CONTRASTIVE_SIGMOID, fp32_precision);
  NoWorkspace ws;
  return call_sigmoid(call, handles, kCpu, nullptr, io, ws);
}

ffi::Error sigmoid_forward(Buffer q, Buffer k, Buffer s, Buffer t, Out loss,
                           std::optional<Buffer> labels, int64_t comm, int64_t fp32_precision) {
  return sigmoid(SigmoidCall::forward, comm, fp32_precision,
                 {q, k, s, t, labels, std::nullopt, *loss, std::nullopt, std::nullopt,
                  std::nullopt, std::nullopt});
}

ffi::Error sigmoid_value_and_grad(Buffer q, Buffer k, Buffer s, Buffer t, Out loss, Out dq, Out dk,
                                  Out ds, Out dt, std::optional<Buffer> labels, int64_t comm,
                                  int64_t fp32_precision) {
  return sigmoid(SigmoidCall::value_and_grad, comm, fp32_precision,
                 {q, k, s, t, labels, std::nullopt, *loss, *dq, *dk, *ds, *dt});
}

ffi::Error sigmoid_backward(Buffer q, Buffer k, Buffer s, Buffer t, Buffer g, Out dq, Out dk,
                            Out ds, Out dt, std::optional<Buffer> labels, int64_t comm,
                            int64_t fp32_precision) {
  return sigmoid(SigmoidCall::backward, comm, fp32_precision,
                 {q, k, s, t, labels, g, std::nullopt, *dq, *dk, *ds, *dt});
}

ffi::Error all_reduce(Buffer x, Out sum, int64_t comm) { return ring_all_reduce(comm, x, *sum); }

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(flatmem_jax_ring_clip_forward_cpu, clip_forward,
                              (clip_forward_binding<false, CommAttr>(ffi::Ffi::Bind())));
XLA_FFI_DEFINE_HANDLER_SYMBOL(flatmem_jax_ring_clip_backward_cpu, clip_backward,
                              (clip_backward_binding<false, CommAttr>(ffi::Ffi::Bind())));
XLA_FFI_DEFINE_HANDLER_SYMBOL(flatmem_jax_ring_infonce_forward_cpu, infonce_forward,
                              (infonce_forward_binding<false, CommAttr>(ffi::Ffi::Bind())));
XLA_FFI_DEFINE_HANDLER_SYMBOL(flatmem_jax_ring_infonce_backward_cpu, infonce_backward,
                              (infonce_backward_binding<false, CommAttr>(ffi::Ffi::Bind())));
XLA_FFI_DEFINE_HANDLER_SYMBOL(flatmem_jax_ring_sigmoid_forward_cpu, sigmoid_forward,
                              (sigmoid_forward_binding<false, CommAttr>(ffi::Ffi::Bind())));
XLA_FFI_DEFINE_HANDLER_SYMBOL(flatmem_jax_ring_sigmoid_value_and_grad_cpu, sigmoid_value_and_grad,
                              (sigmoid_value_and_grad_binding<false, CommAttr>(ffi::Ffi::Bind())));
XLA_FFI_DEFINE_HANDLER_SYMBOL(flatmem_jax_ring_sigmoid_backward_cpu, sigmoid_backward,
                              (sigmoid_backward_binding<false, CommAttr>(ffi::Ffi::Bind())));
XLA_FFI_DEFINE_HANDLER_SYMBOL(flatmem_jax_ring_all_reduce_cpu, all_reduce,
                              ffi::Ffi::Bind().Arg<Buffer>().Ret<Buffer>().Attr<int64_t>("comm"));
