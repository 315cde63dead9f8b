// XLA FFI handlers of the ring losses for XLA:GPU (CUDA): the CPU handlers'
// bodies (ring_handlers.cpp) on kDLCUDA views of XLA's buffers and XLA's
// stream. flatmem runs the ring on CUDA tensors over the communicator's NCCL
// device transport, which RingComm.init_device (flatmem_comm_init_device)
// creates; without it flatmem refuses, naming options.comm. The ring keeps
// its transit buffers in device memory the ring handle allocates itself
// (cudaMalloc, outside XLA's allocator), and it synchronises XLA's stream
// once per call (flatmem.h, "Ring across ranks"). The all-reduce stays
// host-only: it returns UNIMPLEMENTED on XLA:GPU, touching nothing.
#include <cuda_runtime_api.h>

#include "contrastive_bindings.hpp"
#include "cuda_binding.hpp"
#include "flatmem_jax.h"
#include "ring_call.hpp"

namespace {

using namespace flatmem_jax;

using Buffer = ffi::AnyBuffer;
using Out = ffi::Result<ffi::AnyBuffer>;
using Scratch = ffi::ScratchAllocator;

DLDevice on(int32_t device_ordinal) { return DLDevice{kDLCUDA, device_ordinal}; }

ffi::Error clip_forward(cudaStream_t stream, int32_t device, Scratch, Buffer q, Buffer k, Buffer s,
                        Out loss, Out row_lse, Out col_lse, int64_t comm, int64_t fp32_precision) {
  RingSource handles(comm, FLATMEM_CONTRASTIVE_SYMMETRIC, fp32_precision, true);
  NoWorkspace ws;
  return call_forward(handles, on(device), stream, {q, k, s, std::nullopt, *loss, *row_lse, *col_lse}, ws);
}

ffi::Error clip_backward(cudaStream_t stream, int32_t device, Scratch, Buffer q, Buffer k, Buffer s,
                         Buffer row_lse, Buffer col_lse, Buffer g, Out dq, Out dk, Out ds, int64_t comm,
                         int64_t fp32_precision) {
  RingSource handles(comm, FLATMEM_CONTRASTIVE_SYMMETRIC, fp32_precision, true);
  NoWorkspace ws;
  return call_backward(handles, on(device), stream,
                       {q, k, s, std::nullopt, row_lse, col_lse, g, *dq, *dk, *ds}, ws);
}

ffi::Error infonce_forward(cudaStream_t stream, int32_t device, Scratch, Buffer q, Buffer k, Buffer s,
                           Out loss, Out row_lse, std::optional<Buffer> labels, int64_t comm,
                           int64_t fp32_precision) {
  RingSource handles(comm, FLATMEM_CONTRASTIVE_INFONCE, fp32_precision, true);
  NoWorkspace ws;
  return call_forward(handles, on(device), stream, {q, k, s, labels, *loss, *row_lse, std::nullopt}, ws);
}

ffi::Error infonce_backward(cudaStream_t stream, int32_t device, Scratch, Buffer q, Buffer k, Buffer s,
                            Buffer row_lse, Buffer g, Out dq, Out dk, Out ds, std::optional<Buffer> labels,
                            int64_t comm, int64_t fp32_precision) {
  RingSource handles(comm, FLATMEM_CONTRASTIVE_INFONCE, fp32_precision, true);
  NoWorkspace ws;
  return call_backward(handles, on(device), stream,
                       {q, k, s, labels, row_lse, std::nullopt, g, *dq, *dk, *ds}, ws);
}

ffi::Error sigmoid(SigmoidCall call, cudaStream_t stream, int32_t device, int64_t comm,
                   int64_t fp32_precision, const SigmoidBuffers &io) {
  RingSource handles(comm, FLATMEM_CONTRASTIVE_SIGMOID, fp32_precision, true);
  NoWorkspace ws;
  return call_sigmoid(call, handles, on(device), stream, io, ws);
}

ffi::Error sigmoid_forward(cudaStream_t stream, int32_t device, Scratch, Buffer q, Buffer k, Buffer s,
                           Buffer t, Out loss, std::optional<Buffer> labels, int64_t comm,
                           int64_t fp32_precision) {
  return sigmoid(SigmoidCall::forward, stream, device, comm, fp32_precision,
                 {q, k, s, t, labels, std::nullopt, *loss, std::nullopt, std::nullopt, std::nullopt,
                  std::nullopt});
}

ffi::Error sigmoid_value_and_grad(cudaStream_t stream, int32_t device, Scratch, Buffer q, Buffer k,
                                  Buffer s, Buffer t, Out loss, Out dq, Out dk, Out ds, Out dt,
                                  std::optional<Buffer> labels, int64_t comm, int64_t fp32_precision) {
  return sigmoid(SigmoidCall::value_and_grad, stream, device, comm, fp32_precision,
                 {q, k, s, t, labels, std::nullopt, *loss, *dq, *dk, *ds, *dt});
}

ffi::Error sigmoid_backward(cudaStream_t stream, int32_t device, Scratch, Buffer q, Buffer k, Buffer s,
                            Buffer t, Buffer g, Out dq, Out dk, Out ds, Out dt, std::optional<Buffer> labels,
                            int64_t comm, int64_t fp32_precision) {
  return sigmoid(SigmoidCall::backward, stream, device, comm, fp32_precision,
                 {q, k, s, t, labels, g, std::nullopt, *dq, *dk, *ds, *dt});
}

ffi::Error all_reduce(cudaStream_t, int32_t, Scratch, Buffer, Out, int64_t) {
  return ring_on_cuda_unsupported("RingComm.all_reduce");
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(flatmem_jax_ring_clip_forward_cuda, clip_forward,
                              (clip_forward_binding<false, CommAttr>(cuda_binding())));
XLA_FFI_DEFINE_HANDLER_SYMBOL(flatmem_jax_ring_clip_backward_cuda, clip_backward,
                              (clip_backward_binding<false, CommAttr>(cuda_binding())));
XLA_FFI_DEFINE_HANDLER_SYMBOL(flatmem_jax_ring_infonce_forward_cuda, infonce_forward,
                              (infonce_forward_binding<false, CommAttr>(cuda_binding())));
XLA_FFI_DEFINE_HANDLER_SYMBOL(flatmem_jax_ring_infonce_backward_cuda, infonce_backward,
                              (infonce_backward_binding<false, CommAttr>(cuda_binding())));
XLA_FFI_DEFINE_HANDLER_SYMBOL(flatmem_jax_ring_sigmoid_forward_cuda, sigmoid_forward,
                              (sigmoid_forward_binding<false, CommAttr>(cuda_binding())));
XLA_FFI_DEFINE_HANDLER_SYMBOL(flatmem_jax_ring_sigmoid_value_and_grad_cuda, sigmoid_value_and_grad,
                              (sigmoid_value_and_grad_binding<false, CommAttr>(cuda_binding())));
XLA_FFI_DEFINE_HANDLER_SYMBOL(flatmem_jax_ring_sigmoid_backward_cuda, sigmoid_backward,
                              (sigmoid_backward_binding<false, CommAttr>(cuda_binding())));
XLA_FFI_DEFINE_HANDLER_SYMBOL(flatmem_jax_ring_all_reduce_cuda, all_reduce,
                              cuda_binding().Arg<Buffer>().Ret<Buffer>().Attr<int64_t>("comm"));
