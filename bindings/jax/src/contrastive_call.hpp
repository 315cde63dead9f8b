// The platform-independent body of the contrastive-loss handlers: DLPack views
// of the XLA buffers, a flatmem handle for the call (a pooled one of the
// call's loss, device kind and logit-cache budget, preferring the one whose
// last forward read the call's q and k: handle_pool.hpp; or, for the ring
// losses, the handle of the call's communicator: ring_registry.hpp), the
// workspace, one call of the C ABI, and its status turned into an XLA FFI
// error carrying flatmem's message. handlers_cpu.cpp, handlers_cuda.cu and
// ring_handlers.cpp only bind operands and say where the device, the stream,
// the handle and the workspace come from.
#pragma once

#include <flatmem/flatmem.h>

#include <cstddef>
#include <cstdint>
#include <optional>

#include "xla/ffi/api/ffi.h"

namespace flatmem_jax {

namespace ffi = xla::ffi;

struct Workspace {
  void *data = nullptr;
  std::size_t bytes = 0;
};

// Where a call's workspace comes from (the CPU handlers: a result buffer; the
// CUDA handlers: XLA's scratch allocator). dq and dk are NULL for the forward;
// `loss` says which of flatmem's workspace queries answers (workspace_size).
class WorkspaceSource {
 public:
  virtual ffi::ErrorOr<Workspace> get(flatmem_contrastive_loss loss, flatmem_contrastive_t *handle,
                                      const DLTensor &q, const DLTensor &k, const DLTensor *dq,
                                      const DLTensor *dk) = 0;

 protected:
  ~WorkspaceSource() = default;
};

// Where a call's flatmem handle comes from. acquire() is called once per
// call, with the data addresses of its q and k; the handle stays the call's
// until the source is destroyed. forward_done() reports the forward's outcome.
class HandleSource {
 public:
  virtual ffi::ErrorOr<flatmem_contrastive_t *> acquire(const void *q, const void *k) = 0;
  virtual void forward_done(bool /*ok*/) {}

 protected:
  ~HandleSource() = default;
};

// No workspace (the ring handles take none: flatmem.h, "Ring across ranks").
class NoWorkspace final : public WorkspaceSource {
 public:
  ffi::ErrorOr<Workspace> get(flatmem_contrastive_loss, flatmem_contrastive_t *, const DLTensor &,
                              const DLTensor &, const DLTensor *, const DLTensor *) override {
    return Workspace{};
  }
};

// flatmem's workspace query of a `loss` handle for q, k and the gradients dq,
// dk (NULL for a forward): the softmax losses' forward or backward query, or
// the sigmoid loss's one; on failure an XLA error naming the query.
ffi::ErrorOr<std::size_t> workspace_size(flatmem_contrastive_loss loss,
                                         const flatmem_contrastive_t *handle, const DLTensor &q,
                                         const DLTensor &k, const DLTensor *dq, const DLTensor *dk);

// flatmem status -> XLA error: "<function>: <STATUS>: <flatmem_last_error()>",
// with the closest XLA error code. Call it right after the failing call (the
// message is the calling thread's last one).
ffi::Error flatmem_error(flatmem_status status, const char *function);
// The same with a message copied earlier (the thread has made flatmem calls since).
ffi::Error flatmem_error(flatmem_status status, const char *function, const char *message);

struct ForwardBuffers {
  ffi::AnyBuffer q, k, logit_scale;
  std::optional<ffi::AnyBuffer> labels;  // InfoNCE only
  ffi::AnyBuffer loss, row_lse;
  std::optional<ffi::AnyBuffer> col_lse;  // symmetric only
};

struct BackwardBuffers {
  ffi::AnyBuffer q, k, logit_scale;
  std::optional<ffi::AnyBuffer> labels;   // InfoNCE only
  ffi::AnyBuffer row_lse;
  std::optional<ffi::AnyBuffer> col_lse;  // symmetric only
  ffi::AnyBuffer dloss, dq, dk, dlogit_scale;
};

// logit_cache_bytes: options.logit_cache_bytes of the pooled handle (the
// handlers' attribute of that name; CPU only -- the CUDA handlers pass 0).
// fp32_precision: its options.fp32_precision (the handlers' attribute of that
// name, a flatmem_fp32_precision value; flatmem_contrastive_create refuses
// any other with its own message).
ffi::Error run_forward(flatmem_contrastive_loss loss, std::size_t logit_cache_bytes,
                       std::int64_t fp32_precision, DLDevice device, void *stream,
                       const ForwardBuffers &io, WorkspaceSource &workspace);

ffi::Error run_backward(flatmem_contrastive_loss loss, std::size_t logit_cache_bytes,
                        std::int64_t fp32_precision, DLDevice device, void *stream,
                        const BackwardBuffers &io, WorkspaceSource &workspace);

// The sigmoid (SigLIP) loss (flatmem.h, "Sigmoid (SigLIP) loss"): one of its
// three C calls per custom call. Operands q, k, logit_scale, logit_bias
// [, dloss for the backward] [, labels]; results as the C call writes them.
enum class SigmoidCall {
  forward,         // flatmem_contrastive_sigmoid_forward: loss
  value_and_grad,  // flatmem_contrastive_sigmoid_value_and_grad: loss, dq, dk, ds, dt
  backward,        // flatmem_contrastive_sigmoid_backward: dloss -> dq, dk, ds, dt
};

struct SigmoidBuffers {
  ffi::AnyBuffer q, k, logit_scale, logit_bias;
  std::optional<ffi::AnyBuffer> labels;
  std::optional<ffi::AnyBuffer> dloss;  // backward only
  std::optional<ffi::AnyBuffer> loss;   // forward and value_and_grad
  std::optional<ffi::AnyBuffer> dq, dk, dlogit_scale, dlogit_bias;  // not the forward
};

ffi::Error run_sigmoid(SigmoidCall call, std::size_t logit_cache_bytes, std::int64_t fp32_precision,
                       DLDevice device, void *stream, const SigmoidBuffers &io,
                       WorkspaceSource &workspace);

// The same with the handle from `handles` (run_forward / run_backward /
// run_sigmoid lend one from the pool).
ffi::Error call_forward(HandleSource &handles, DLDevice device, void *stream,
                        const ForwardBuffers &io, WorkspaceSource &workspace);
ffi::Error call_backward(HandleSource &handles, DLDevice device, void *stream,
                         const BackwardBuffers &io, WorkspaceSource &workspace);
ffi::Error call_sigmoid(SigmoidCall call, HandleSource &handles, DLDevice device, void *stream,
                        const SigmoidBuffers &io, WorkspaceSource &workspace);

}  // namespace flatmem_jax
