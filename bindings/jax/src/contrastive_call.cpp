#include "contrastive_call.hpp"

#include <string>

#include "dlpack_view.hpp"
#include "handle_pool.hpp"

namespace flatmem_jax {
namespace {

ffi::ErrorCode error_code(flatmem_status status) {
  switch (status) {
    case FLATMEM_STATUS_INVALID_ARGUMENT: return ffi::ErrorCode::kInvalidArgument;
    case FLATMEM_STATUS_NON_FINITE: return ffi::ErrorCode::kInvalidArgument;
    case FLATMEM_STATUS_UNSUPPORTED: return ffi::ErrorCode::kUnimplemented;
    case FLATMEM_STATUS_OUT_OF_MEMORY: return ffi::ErrorCode::kResourceExhausted;
    case FLATMEM_STATUS_WORKSPACE_TOO_SMALL: return ffi::ErrorCode::kFailedPrecondition;
    case FLATMEM_STATUS_TIMEOUT: return ffi::ErrorCode::kDeadlineExceeded;
    case FLATMEM_STATUS_PEER_FAILURE: return ffi::ErrorCode::kAborted;
    case FLATMEM_STATUS_COMM_POISONED: return ffi::ErrorCode::kAborted;
    default: return ffi::ErrorCode::kInternal;
  }
}

// Views of the operands of one call; an optional operand that is absent
// stays NULL. The first failed conversion is kept in `error`.
class Views {
 public:
  explicit Views(DLDevice device) : device_(device) {}

  const DLTensor *add(const ffi::AnyBuffer &buffer, const char *name) {
    return keep(dlpack_view(buffer, device_, name));
  }
  const DLTensor *add(const std::optional<ffi::AnyBuffer> &buffer, const char *name) {
    return buffer ? add(*buffer, name) : nullptr;
  }
  const DLTensor *add_labels(const std::optional<ffi::AnyBuffer> &buffer) {
    return buffer ? keep(labels_view(*buffer, device_)) : nullptr;
  }
  // Outputs: flatmem takes them as DLTensor *.
  DLTensor *out(const ffi::AnyBuffer &buffer, const char *name) {
    return const_cast<DLTensor *>(add(buffer, name));
  }
  DLTensor *out(const std::optional<ffi::AnyBuffer> &buffer, const char *name) {
    return const_cast<DLTensor *>(add(buffer, name));
  }

  const ffi::Error &error() const { return error_; }

 private:
  const DLTensor *keep(ffi::ErrorOr<DLTensor> view) {
    if (!view) {
      if (error_.success()) error_ = view.error();
      return nullptr;
    }
    tensors_[count_] = *view;
    return &tensors_[count_++];
  }

  DLDevice device_;
  DLTensor tensors_[12]{};  // at most 11 operands per call
  int count_ = 0;
  ffi::Error error_;
};

// The handle and the workspace of a call whose operands converted.
struct Prepared {
  flatmem_contrastive_t *handle;
  Workspace space;
};

ffi::ErrorOr<Prepared> prepare(HandleSource &handles, WorkspaceSource &workspace,
                               flatmem_contrastive_loss loss, const DLTensor &q, const DLTensor &k,
                               const DLTensor *dq, const DLTensor *dk) {
  ffi::ErrorOr<flatmem_contrastive_t *> handle = handles.acquire(q.data, k.data);
  if (!handle) return ffi::Unexpected(handle.error());
  ffi::ErrorOr<Workspace> space = workspace.get(loss, *handle, q, k, dq, dk);
  if (!space) return ffi::Unexpected(space.error());
  return Prepared{*handle, *space};
}

// The softmax loss of a call: SYMMETRIC when it has col_lse.
template <typename Buffers>
flatmem_contrastive_loss softmax_loss(const Buffers &io) {
  return io.col_lse ? FLATMEM_CONTRASTIVE_SYMMETRIC : FLATMEM_CONTRASTIVE_INFONCE;
}

}  // namespace

ffi::Error flatmem_error(flatmem_status status, const char *function) {
  return flatmem_error(status, function, flatmem_last_error());
}

ffi::Error flatmem_error(flatmem_status status, const char *function, const char *message) {
  return ffi::Error(error_code(status), std::string(function) + ": " +
                                            flatmem_status_string(status) + ": " + message);
}

namespace {

// The pool's handle of (loss, device kind, cache budget, fp32_precision), kept
// for the call.
class PoolSource final : public HandleSource {
 public:
  PoolSource(flatmem_contrastive_loss loss, std::size_t logit_cache_bytes,
             std::int64_t fp32_precision, DLDevice device, bool backward)
      : key_{loss, device.device_type == kDLCUDA, logit_cache_bytes, fp32_precision},
        backward_(backward) {}

  ffi::ErrorOr<flatmem_contrastive_t *> acquire(const void *q, const void *k) override {
    inputs_ = Inputs{q, k};
    handle_.emplace(key_, inputs_);
    if (handle_->status() != FLATMEM_STATUS_SUCCESS)
      return ffi::Unexpected(flatmem_error(handle_->status(), "flatmem_contrastive_create"));
    if (backward_ && key_.logit_cache_bytes != 0 && !key_.cuda)
      count_cached_backward(handle_->found_inputs());
    return handle_->get();
  }
  void forward_done(bool ok) override { handle_->forward_done(ok, inputs_); }

 private:
  PoolKey key_;
  bool backward_;
  Inputs inputs_;
  std::optional<PooledHandle> handle_;
};

}  // namespace

ffi::ErrorOr<std::size_t> workspace_size(flatmem_contrastive_loss loss,
                                         const flatmem_contrastive_t *handle, const DLTensor &q,
                                         const DLTensor &k, const DLTensor *dq, const DLTensor *dk) {
  const bool forward = dq == nullptr && dk == nullptr;
  std::size_t bytes = 0;
  flatmem_status status;
  const char *function;
  if (loss == FLATMEM_CONTRASTIVE_SIGMOID) {
    function = "flatmem_contrastive_sigmoid_workspace_size";
    status = flatmem_contrastive_sigmoid_workspace_size(handle, &q, &k, dq, dk, &bytes);
  } else if (forward) {
    function = "flatmem_contrastive_forward_workspace_size";
    status = flatmem_contrastive_forward_workspace_size(handle, &q, &k, &bytes);
  } else {
    function = "flatmem_contrastive_backward_workspace_size";
    status = flatmem_contrastive_backward_workspace_size(handle, &q, &k, dq, dk, &bytes);
  }
  if (status != FLATMEM_STATUS_SUCCESS) return ffi::Unexpected(flatmem_error(status, function));
  return bytes;
}

ffi::Error run_forward(flatmem_contrastive_loss loss, std::size_t logit_cache_bytes,
                       std::int64_t fp32_precision, DLDevice device, void *stream,
                       const ForwardBuffers &io, WorkspaceSource &workspace) {
  PoolSource handles(loss, logit_cache_bytes, fp32_precision, device, /*backward=*/false);
  return call_forward(handles, device, stream, io, workspace);
}

ffi::Error run_backward(flatmem_contrastive_loss loss, std::size_t logit_cache_bytes,
                        std::int64_t fp32_precision, DLDevice device, void *stream,
                        const BackwardBuffers &io, WorkspaceSource &workspace) {
  PoolSource handles(loss, logit_cache_bytes, fp32_precision, device, /*backward=*/true);
  return call_backward(handles, device, stream, io, workspace);
}

ffi::Error run_sigmoid(SigmoidCall call, std::size_t logit_cache_bytes, std::int64_t fp32_precision,
                       DLDevice device, void *stream, const SigmoidBuffers &io,
                       WorkspaceSource &workspace) {
  PoolSource handles(FLATMEM_CONTRASTIVE_SIGMOID, logit_cache_bytes, fp32_precision, device,
                     /*backward=*/false);
  return call_sigmoid(call, handles, device, stream, io, workspace);
}

ffi::Error call_forward(HandleSource &handles, DLDevice device, void *stream,
                        const ForwardBuffers &io, WorkspaceSource &workspace) {
  Views v(device);
  const DLTensor *q = v.add(io.q, "q");
  const DLTensor *k = v.add(io.k, "k");
  const DLTensor *labels = v.add_labels(io.labels);
  const DLTensor *logit_scale = v.add(io.logit_scale, "logit_scale");
  DLTensor *loss_out = v.out(io.loss, "loss");
  DLTensor *row_lse = v.out(io.row_lse, "row_lse");
  DLTensor *col_lse = v.out(io.col_lse, "col_lse");
  if (v.error().failure()) return v.error();

  ffi::ErrorOr<Prepared> p = prepare(handles, workspace, softmax_loss(io), *q, *k, nullptr, nullptr);
  if (!p) return p.error();
  const flatmem_status status =
      flatmem_contrastive_forward(p->handle, q, k, labels, logit_scale, loss_out, row_lse,
                                  col_lse, p->space.data, p->space.bytes, stream);
  handles.forward_done(status == FLATMEM_STATUS_SUCCESS);
  if (status != FLATMEM_STATUS_SUCCESS) return flatmem_error(status, "flatmem_contrastive_forward");
  return ffi::Error::Success();
}

ffi::Error call_backward(HandleSource &handles, DLDevice device, void *stream,
                         const BackwardBuffers &io, WorkspaceSource &workspace) {
  Views v(device);
  const DLTensor *q = v.add(io.q, "q");
  const DLTensor *k = v.add(io.k, "k");
  const DLTensor *labels = v.add_labels(io.labels);
  const DLTensor *logit_scale = v.add(io.logit_scale, "logit_scale");
  const DLTensor *row_lse = v.add(io.row_lse, "row_lse");
  const DLTensor *col_lse = v.add(io.col_lse, "col_lse");
  const DLTensor *dloss = v.add(io.dloss, "dloss");
  DLTensor *dq = v.out(io.dq, "dq");
  DLTensor *dk = v.out(io.dk, "dk");
  DLTensor *dlogit_scale = v.out(io.dlogit_scale, "dlogit_scale");
  if (v.error().failure()) return v.error();

  ffi::ErrorOr<Prepared> p = prepare(handles, workspace, softmax_loss(io), *q, *k, dq, dk);
  if (!p) return p.error();
  const flatmem_status status = flatmem_contrastive_backward(
      p->handle, q, k, labels, logit_scale, row_lse, col_lse, dloss, dq, dk, dlogit_scale,
      p->space.data, p->space.bytes, stream);
  if (status != FLATMEM_STATUS_SUCCESS)
    return flatmem_error(status, "flatmem_contrastive_backward");
  return ffi::Error::Success();
}

ffi::Error call_sigmoid(SigmoidCall call, HandleSource &handles, DLDevice device, void *stream,
                        const SigmoidBuffers &io, WorkspaceSource &workspace) {
  Views v(device);
  const DLTensor *q = v.add(io.q, "q");
  const DLTensor *k = v.add(io.k, "k");
  const DLTensor *labels = v.add_labels(io.labels);
  const DLTensor *logit_scale = v.add(io.logit_scale, "logit_scale");
  const DLTensor *logit_bias = v.add(io.logit_bias, "logit_bias");
  const DLTensor *dloss = v.add(io.dloss, "dloss");
  DLTensor *loss_out = v.out(io.loss, "loss");
  DLTensor *dq = v.out(io.dq, "dq");
  DLTensor *dk = v.out(io.dk, "dk");
  DLTensor *dlogit_scale = v.out(io.dlogit_scale, "dlogit_scale");
  DLTensor *dlogit_bias = v.out(io.dlogit_bias, "dlogit_bias");
  if (v.error().failure()) return v.error();

  ffi::ErrorOr<Prepared> p = prepare(handles, workspace, FLATMEM_CONTRASTIVE_SIGMOID, *q, *k, dq, dk);
  if (!p) return p.error();
  flatmem_contrastive_t *handle = p->handle;
  void *space = p->space.data;
  const std::size_t bytes = p->space.bytes;
  flatmem_status status;
  const char *function;
  switch (call) {
    case SigmoidCall::forward:
      function = "flatmem_contrastive_sigmoid_forward";
      status = flatmem_contrastive_sigmoid_forward(handle, q, k, labels, logit_scale, logit_bias,
                                                   loss_out, space, bytes, stream);
      break;
    case SigmoidCall::value_and_grad:
      function = "flatmem_contrastive_sigmoid_value_and_grad";
      status = flatmem_contrastive_sigmoid_value_and_grad(
          handle, q, k, labels, logit_scale, logit_bias, loss_out, dq, dk, dlogit_scale,
          dlogit_bias, space, bytes, stream);
      break;
    default:
      function = "flatmem_contrastive_sigmoid_backward";
      status = flatmem_contrastive_sigmoid_backward(handle, q, k, labels, logit_scale, logit_bias,
                                                    dloss, dq, dk, dlogit_scale, dlogit_bias,
                                                    space, bytes, stream);
      break;
  }
  if (status != FLATMEM_STATUS_SUCCESS) return flatmem_error(status, function);
  return ffi::Error::Success();
}

}  // namespace flatmem_jax
