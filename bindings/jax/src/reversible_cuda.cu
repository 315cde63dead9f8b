// XLA FFI handlers of a reversible segment of flatmem's built-in blocks for
// XLA:GPU (CUDA), compiled by nvcc whenever it is found. The segment cache,
// the parameter pointing and the flatmem calls are reversible_call.cpp's, as
// for the CPU handlers; only the platform differs:
//
//   - device: kDLCUDA of XLA's device ordinal; parameters, their gradients
//     and the states are XLA's device buffers (flatmem_block_set_parameters
//     and the segment check that they are that device's memory);
//   - stream: XLA's (PlatformStream). flatmem enqueues the forward and the
//     gradient chain on it and returns without waiting; an OVERLAPPED
//     backward runs the rebuild chain on a stream of the segment handle,
//     joined to XLA's stream by events only: it first waits for XLA's stream
//     (inputs ready), and all of its work precedes the last gradient block
//     on XLA's stream (reversible.h; src/reversible/cuda/overlapped.cpp);
//   - workspace: sized by flatmem's query at run time and taken from XLA's
//     ScratchAllocator (or, where XLA has none to give, stream-ordered
//     cudaMallocAsync: device_scratch.hpp), as the contrastive CUDA handlers
//     do. XLA frees it
//     stream-ordered once the handler returns; that is safe because every
//     use of it -- the rebuild stream's included, per the join above -- is
//     ordered before the call's last work on XLA's stream. (Passing no
//     workspace would make flatmem cudaMalloc one per handle, synchronising
//     and shared by whichever call borrows the handle next.)
//   - gradient results: zeroed with cudaMemsetAsync on XLA's stream before
//     the backward accumulates into them (with cudaGetDevice/cudaSetDevice
//     around it, the only CUDA runtime calls of this library; made once
//     flatmem has accepted every parameter and gradient buffer).
//
// Besides the workspace, the built-in CUDA blocks take per-call scratch with
// cudaMallocAsync from the device's current memory pool (reversible.h), i.e.
// outside XLA's allocator: leave XLA some device memory for it (see the
// README, XLA_PYTHON_CLIENT_MEM_FRACTION).
//
// The handlers declare no command-buffer trait, so XLA never captures them
// into a CUDA graph (they record events on a second stream and allocate).
#include <cuda_runtime_api.h>

#include <optional>
#include <string>

#include "cuda_binding.hpp"
#include "device_scratch.hpp"
#include "flatmem_jax.h"
#include "reversible_bindings.hpp"
#include "reversible_call.hpp"

namespace {

using namespace flatmem_jax;

using Buffer = ffi::AnyBuffer;
using Out = ffi::Result<ffi::AnyBuffer>;

class CudaPlatform final : public ReversiblePlatform {
 public:
  CudaPlatform(cudaStream_t stream, int32_t ordinal, ffi::ScratchAllocator &scratch)
      : stream_(stream), ordinal_(ordinal), scratch_(scratch, stream, ordinal) {}

  ffi::ErrorOr<Workspace> workspace(flatmem_reversible_t *handle, const DLTensor &state,
                                    bool backward) override {
    std::size_t bytes = 0;
    const flatmem_status status =
        backward ? flatmem_reversible_backward_workspace_size(handle, &state, &bytes)
                 : flatmem_reversible_forward_workspace_size(handle, &state, &bytes);
    if (status != FLATMEM_STATUS_SUCCESS)
      return ffi::Unexpected(flatmem_error(status, backward
                                                       ? "flatmem_reversible_backward_workspace_size"
                                                       : "flatmem_reversible_forward_workspace_size"));
    if (bytes == 0) return Workspace{};  // NULL and 0: flatmem allocates nothing either
    ffi::ErrorOr<void *> data = scratch_.allocate(bytes);
    if (!data) return ffi::Unexpected(data.error());
    return Workspace{*data, bytes};
  }

  ffi::Error zero(Buffer buffer) override {
    if (buffer.size_bytes() == 0) return ffi::Error::Success();
    // XLA's stream belongs to device `ordinal`, normally current already;
    // make it current for the call otherwise, and restore the caller's.
    int previous = -1;
    cudaError_t status = cudaGetDevice(&previous);
    if (status == cudaSuccess && previous != ordinal_) status = cudaSetDevice(ordinal_);
    if (status == cudaSuccess)
      status = cudaMemsetAsync(buffer.untyped_data(), 0, buffer.size_bytes(), stream_);
    if (previous >= 0 && previous != ordinal_) cudaSetDevice(previous);
    if (status != cudaSuccess) {
      cudaGetLastError();  // clear it from this library's runtime
      return ffi::Error(ffi::ErrorCode::kInternal,
                        "flatmem_jax: zeroing a gradient result on CUDA device " +
                            std::to_string(ordinal_) + " (cudaMemsetAsync): " +
                            cudaGetErrorString(status));
    }
    return ffi::Error::Success();
  }

 private:
  cudaStream_t stream_;
  int32_t ordinal_;
  DeviceScratch scratch_;
};

ffi::Error reversible_forward(cudaStream_t stream, int32_t ordinal, ffi::ScratchAllocator scratch,
                              Buffer x1, Buffer x2, ffi::RemainingArgs params, Out y1, Out y2,
                              ReversibleAttrs attrs) {
  CudaPlatform platform(stream, ordinal, scratch);
  return run_reversible_forward(cuda_device(ordinal), stream, x1, x2, params, *y1, *y2, attrs,
                                platform);
}

ffi::Error reversible_backward(cudaStream_t stream, int32_t ordinal, ffi::ScratchAllocator scratch,
                               Buffer y1, Buffer y2, Buffer dy1, Buffer dy2,
                               ffi::RemainingArgs params, Out dx1, Out dx2,
                               ffi::RemainingRets grads, ReversibleAttrs attrs) {
  CudaPlatform platform(stream, ordinal, scratch);
  return run_reversible_backward(cuda_device(ordinal), stream, y1, y2, dy1, dy2, params, *dx1,
                                 *dx2, grads, attrs, platform);
}

}  // namespace

// Lists: reversible_bindings.hpp, behind the CUDA contexts (cuda_binding.hpp),
// without the workspace result.
XLA_FFI_DEFINE_HANDLER_SYMBOL(flatmem_jax_reversible_forward_cuda, reversible_forward,
                              reversible_forward_binding<false>(cuda_binding()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(flatmem_jax_reversible_backward_cuda, reversible_backward,
                              reversible_backward_binding<false>(cuda_binding()));
