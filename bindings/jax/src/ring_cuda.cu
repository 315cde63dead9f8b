// XLA FFI handlers of the ring losses and the all-reduce for XLA:GPU
// (CUDA): compiled with the other CUDA handlers, bound like them (XLA's
// stream, device ordinal and scratch allocator, then the operands of
// contrastive_bindings.hpp and the comm and fp32_precision attributes; the
// all-reduce's comm alone), and honest: flatmem's ring runs over the
// communicator's host transport on kDLCPU tensors only
// (flatmem.h, "Ring across ranks"), so each returns XLA's UNIMPLEMENTED with
// a message saying so, touching no buffer and no communicator. (flatmem's
// all-reduce does take kDLCUDA buffers after flatmem_comm_init_device, which
// flatmem_jax does not call.)
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

ffi::Error clip_forward(cudaStream_t, int32_t, Scratch, Buffer, Buffer, Buffer, Out, Out, Out,
                        int64_t, int64_t) {
  return ring_on_cuda_unsupported("clip_loss(comm=...)");
}

ffi::Error clip_backward(cudaStream_t, int32_t, Scratch, Buffer, Buffer, Buffer, Buffer, Buffer,
                         Buffer, Out, Out, Out, int64_t, int64_t) {
  return ring_on_cuda_unsupported("clip_loss(comm=...) backward");
}

ffi::Error infonce_forward(cudaStream_t, int32_t, Scratch, Buffer, Buffer, Buffer, Out, Out,
                           std::optional<Buffer>, int64_t, int64_t) {
  return ring_on_cuda_unsupported("infonce_loss(comm=...)");
}

ffi::Error infonce_backward(cudaStream_t, int32_t, Scratch, Buffer, Buffer, Buffer, Buffer, Buffer,
                            Out, Out, Out, std::optional<Buffer>, int64_t, int64_t) {
  return ring_on_cuda_unsupported("infonce_loss(comm=...) backward");
}

ffi::Error sigmoid_forward(cudaStream_t, int32_t, Scratch, Buffer, Buffer, Buffer, Buffer, Out,
                           std::optional<Buffer>, int64_t, int64_t) {
  return ring_on_cuda_unsupported("sigmoid_loss(comm=...)");
}

ffi::Error sigmoid_value_and_grad(cudaStream_t, int32_t, Scratch, Buffer, Buffer, Buffer, Buffer,
                                  Out, Out, Out, Out, Out, std::optional<Buffer>, int64_t,
                                  int64_t) {
  return ring_on_cuda_unsupported("sigmoid_loss(comm=...) value_and_grad");
}

ffi::Error sigmoid_backward(cudaStream_t, int32_t, Scratch, Buffer, Buffer, Buffer, Buffer, Buffer,
                            Out, Out, Out, Out, std::optional<Buffer>, int64_t, int64_t) {
  return ring_on_cuda_unsupported("sigmoid_loss(comm=...) backward");
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
