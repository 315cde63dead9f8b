// XLA FFI handlers of the contrastive loss for XLA:GPU (CUDA), compiled by
// nvcc whenever it is found. They run on XLA's stream and take their
// workspace from XLA's ScratchAllocator (the device allocator XLA itself
// uses, ordered on that stream), or stream-ordered cudaMallocAsync where XLA
// has none to give (device_scratch.hpp), sized by flatmem's query at run
// time, so their ffi_call has no workspace result.
//
// A flatmem built with its CUDA backend runs the loss on XLA's stream (its
// pooled CUDA handles use FLATMEM_NONFINITE_PROPAGATE, handle_pool.hpp); a
// flatmem built without CUDA refuses kDLCUDA tensors with
// FLATMEM_STATUS_UNSUPPORTED, which these handlers return as XLA's
// UNIMPLEMENTED error with flatmem's message, touching no memory.
//
// The logit cache is the CPU backend's (flatmem.h: a call with kDLCUDA
// tensors neither fills nor reads it), so these handlers take the
// logit_cache_bytes attribute the Python side passes to both platforms --
// one jitted function lowers for either -- and ignore it: their handles are
// pooled without a budget, and code that asks for a cache runs on a GPU
// unchanged, recomputing the tiles as without one. Their fp32_precision
// attribute is the pooled handle's options.fp32_precision (TF32 or 3xTF32
// products for fp32 inputs).
#include <cuda_runtime_api.h>

#include "contrastive_bindings.hpp"
#include "contrastive_call.hpp"
#include "cuda_binding.hpp"
#include "device_scratch.hpp"
#include "flatmem_jax.h"

namespace {

using namespace flatmem_jax;

using Buffer = ffi::AnyBuffer;
using Out = ffi::Result<ffi::AnyBuffer>;

class ScratchWorkspace final : public WorkspaceSource {
 public:
  ScratchWorkspace(ffi::ScratchAllocator &scratch, cudaStream_t stream, int32_t ordinal)
      : scratch_(scratch, stream, ordinal) {}
  ffi::ErrorOr<Workspace> get(flatmem_contrastive_loss loss, flatmem_contrastive_t *handle,
                              const DLTensor &q, const DLTensor &k, const DLTensor *dq,
                              const DLTensor *dk) override {
    ffi::ErrorOr<std::size_t> bytes = workspace_size(loss, handle, q, k, dq, dk);
    if (!bytes) return ffi::Unexpected(bytes.error());
    ffi::ErrorOr<void *> data = scratch_.allocate(*bytes);
    if (!data) return ffi::Unexpected(data.error());
    return Workspace{*data, *bytes};
  }

 private:
  DeviceScratch scratch_;
};

ffi::Error clip_forward(cudaStream_t stream, int32_t ordinal, ffi::ScratchAllocator scratch,
                        Buffer q, Buffer k, Buffer s, Out loss, Out row_lse, Out col_lse,
                        uint64_t /*logit_cache_bytes: CPU only*/, int64_t fp32_precision) {
  ScratchWorkspace ws(scratch, stream, ordinal);
  return run_forward(FLATMEM_CONTRASTIVE_SYMMETRIC, 0, fp32_precision, cuda_device(ordinal),
                     stream, {q, k, s, std::nullopt, *loss, *row_lse, *col_lse}, ws);
}

ffi::Error clip_backward(cudaStream_t stream, int32_t ordinal, ffi::ScratchAllocator scratch,
                         Buffer q, Buffer k, Buffer s, Buffer row_lse, Buffer col_lse, Buffer g,
                         Out dq, Out dk, Out ds, uint64_t /*logit_cache_bytes: CPU only*/,
                         int64_t fp32_precision) {
  ScratchWorkspace ws(scratch, stream, ordinal);
  return run_backward(FLATMEM_CONTRASTIVE_SYMMETRIC, 0, fp32_precision, cuda_device(ordinal),
                      stream, {q, k, s, std::nullopt, row_lse, col_lse, g, *dq, *dk, *ds}, ws);
}

ffi::Error infonce_forward(cudaStream_t stream, int32_t ordinal, ffi::ScratchAllocator scratch,
                           Buffer q, Buffer k, Buffer s, Out loss, Out row_lse,
                           std::optional<Buffer> labels, uint64_t /*logit_cache_bytes: CPU only*/,
                           int64_t fp32_precision) {
  ScratchWorkspace ws(scratch, stream, ordinal);
  return run_forward(FLATMEM_CONTRASTIVE_INFONCE, 0, fp32_precision, cuda_device(ordinal), stream,
                     {q, k, s, labels, *loss, *row_lse, std::nullopt}, ws);
}

ffi::Error infonce_backward(cudaStream_t stream, int32_t ordinal, ffi::ScratchAllocator scratch,
                            Buffer q, Buffer k, Buffer s, Buffer row_lse, Buffer g, Out dq, Out dk,
                            Out ds, std::optional<Buffer> labels,
                            uint64_t /*logit_cache_bytes: CPU only*/, int64_t fp32_precision) {
  ScratchWorkspace ws(scratch, stream, ordinal);
  return run_backward(FLATMEM_CONTRASTIVE_INFONCE, 0, fp32_precision, cuda_device(ordinal), stream,
                      {q, k, s, labels, row_lse, std::nullopt, g, *dq, *dk, *ds}, ws);
}

ffi::Error sigmoid_forward(cudaStream_t stream, int32_t ordinal, ffi::ScratchAllocator scratch,
                           Buffer q, Buffer k, Buffer s, Buffer t, Out loss,
                           std::optional<Buffer> labels, uint64_t /*logit_cache_bytes: CPU only*/,
                           int64_t fp32_precision) {
  ScratchWorkspace ws(scratch, stream, ordinal);
  return run_sigmoid(SigmoidCall::forward, 0, fp32_precision, cuda_device(ordinal), stream,
                     {q, k, s, t, labels, std::nullopt, *loss, std::nullopt, std::nullopt,
                      std::nullopt, std::nullopt},
                     ws);
}

ffi::Error sigmoid_value_and_grad(cudaStream_t stream, int32_t ordinal,
                                  ffi::ScratchAllocator scratch, Buffer q, Buffer k, Buffer s,
                                  Buffer t, Out loss, Out dq, Out dk, Out ds, Out dt,
                                  std::optional<Buffer> labels,
                                  uint64_t /*logit_cache_bytes: CPU only*/,
                                  int64_t fp32_precision) {
  ScratchWorkspace ws(scratch, stream, ordinal);
  return run_sigmoid(SigmoidCall::value_and_grad, 0, fp32_precision, cuda_device(ordinal), stream,
                     {q, k, s, t, labels, std::nullopt, *loss, *dq, *dk, *ds, *dt}, ws);
}

ffi::Error sigmoid_backward(cudaStream_t stream, int32_t ordinal, ffi::ScratchAllocator scratch,
                            Buffer q, Buffer k, Buffer s, Buffer t, Buffer g, Out dq, Out dk,
                            Out ds, Out dt, std::optional<Buffer> labels,
                            uint64_t /*logit_cache_bytes: CPU only*/, int64_t fp32_precision) {
  ScratchWorkspace ws(scratch, stream, ordinal);
  return run_sigmoid(SigmoidCall::backward, 0, fp32_precision, cuda_device(ordinal), stream,
                     {q, k, s, t, labels, g, std::nullopt, *dq, *dk, *ds, *dt}, ws);
}

}  // namespace

// Lists: contrastive_bindings.hpp, behind the CUDA contexts (cuda_binding.hpp).
XLA_FFI_DEFINE_HANDLER_SYMBOL(flatmem_jax_clip_forward_cuda, clip_forward,
                              clip_forward_binding<false>(cuda_binding()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(flatmem_jax_clip_backward_cuda, clip_backward,
                              clip_backward_binding<false>(cuda_binding()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(flatmem_jax_infonce_forward_cuda, infonce_forward,
                              infonce_forward_binding<false>(cuda_binding()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(flatmem_jax_infonce_backward_cuda, infonce_backward,
                              infonce_backward_binding<false>(cuda_binding()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(flatmem_jax_sigmoid_forward_cuda, sigmoid_forward,
                              sigmoid_forward_binding<false>(cuda_binding()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(flatmem_jax_sigmoid_value_and_grad_cuda, sigmoid_value_and_grad,
                              sigmoid_value_and_grad_binding<false>(cuda_binding()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(flatmem_jax_sigmoid_backward_cuda, sigmoid_backward,
                              sigmoid_backward_binding<false>(cuda_binding()));
