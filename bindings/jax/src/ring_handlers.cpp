// XLA FFI handlers of the ring losses and of the all-reduce for XLA:CPU. The
// attribute comm is the communicator's registry slot (ring_registry.hpp);
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
                        int64_t comm) {
  RingSource handles(comm, FLATMEM_CONTRASTIVE_SYMMETRIC);
  NoWorkspace ws;
  return call_forward(handles, kCpu, nullptr, {q, k, s, std::nullopt, *loss, *row_lse, *col_lse},
                      ws);
}

ffi::Error clip_backward(Buffer q, Buffer k, Buffer s, Buffer row_lse, Buffer col_lse, Buffer g,
                         Out dq, Out dk, Out ds, int64_t comm) {
  RingSource handles(comm, FLATMEM_CONTRASTIVE_SYMMETRIC);
  NoWorkspace ws;
  return call_backward(handles, kCpu, nullptr,
                       {q, k, s, std::nullopt, row_lse, col_lse, g, *dq, *dk, *ds}, ws);
}

ffi::Error infonce_forward(Buffer q, Buffer k, Buffer s, Out loss, Out row_lse,
                           std::optional<Buffer> labels, int64_t comm) {
  RingSource handles(comm, FLATMEM_CONTRASTIVE_INFONCE);
  NoWorkspace ws;
  return call_forward(handles, kCpu, nullptr, {q, k, s, labels, *loss, *row_lse, std::nullopt},
                      ws);
}

ffi::Error infonce_backward(Buffer q, Buffer k, Buffer s, Buffer row_lse, Buffer g, Out dq, Out dk,
                            Out ds, std::optional<Buffer> labels, int64_t comm) {
  RingSource handles(comm, FLATMEM_CONTRASTIVE_INFONCE);
  NoWorkspace ws;
  return call_backward(handles, kCpu, nullptr,
                       {q, k, s, labels, row_lse, std::nullopt, g, *dq, *dk, *ds}, ws);
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
XLA_FFI_DEFINE_HANDLER_SYMBOL(flatmem_jax_ring_all_reduce_cpu, all_reduce,
                              ffi::Ffi::Bind().Arg<Buffer>().Ret<Buffer>().Attr<int64_t>("comm"));
