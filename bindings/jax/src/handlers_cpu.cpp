// XLA FFI handlers of the contrastive loss for XLA:CPU. The workspace is the
// handler's last result, a u8 buffer sized at trace time by
// flatmem_jax_workspace_size (exports.cpp), so XLA owns and plans it like any
// other buffer; XLA:CPU has no scratch allocator for FFI handlers. The
// attributes logit_cache_bytes and fp32_precision pick the pooled handle's
// cache budget and options.fp32_precision.
#include "contrastive_bindings.hpp"
#include "contrastive_call.hpp"
#include "flatmem_jax.h"

namespace {

using namespace flatmem_jax;

constexpr DLDevice kCpu{kDLCPU, 0};
using Buffer = ffi::AnyBuffer;
using Out = ffi::Result<ffi::AnyBuffer>;

class ResultWorkspace final : public WorkspaceSource {
 public:
  explicit ResultWorkspace(Buffer buffer) : buffer_(buffer) {}
  ffi::ErrorOr<Workspace> get(flatmem_contrastive_loss, flatmem_contrastive_t *, const DLTensor &,
                              const DLTensor &, const DLTensor *, const DLTensor *) override {
    // flatmem checks the size and says WORKSPACE_TOO_SMALL if it is short.
    return Workspace{buffer_.untyped_data(), buffer_.size_bytes()};
  }

 private:
  Buffer buffer_;
};

ffi::Error clip_forward(Buffer q, Buffer k, Buffer s, Out loss, Out row_lse, Out col_lse,
                        Out workspace, uint64_t logit_cache_bytes, int64_t fp32_precision) {
  ResultWorkspace ws(*workspace);
  return run_forward(FLATMEM_CONTRASTIVE_SYMMETRIC, logit_cache_bytes, fp32_precision, kCpu,
                     nullptr, {q, k, s, std::nullopt, *loss, *row_lse, *col_lse}, ws);
}

ffi::Error clip_backward(Buffer q, Buffer k, Buffer s, Buffer row_lse, Buffer col_lse, Buffer g,
                         Out dq, Out dk, Out ds, Out workspace, uint64_t logit_cache_bytes,
                         int64_t fp32_precision) {
  ResultWorkspace ws(*workspace);
  return run_backward(FLATMEM_CONTRASTIVE_SYMMETRIC, logit_cache_bytes, fp32_precision, kCpu,
                      nullptr, {q, k, s, std::nullopt, row_lse, col_lse, g, *dq, *dk, *ds}, ws);
}

ffi::Error infonce_forward(Buffer q, Buffer k, Buffer s, Out loss, Out row_lse, Out workspace,
                           std::optional<Buffer> labels, uint64_t logit_cache_bytes,
                           int64_t fp32_precision) {
  ResultWorkspace ws(*workspace);
  return run_forward(FLATMEM_CONTRASTIVE_INFONCE, logit_cache_bytes, fp32_precision, kCpu, nullptr,
                     {q, k, s, labels, *loss, *row_lse, std::nullopt}, ws);
}

ffi::Error infonce_backward(Buffer q, Buffer k, Buffer s, Buffer row_lse, Buffer g, Out dq, Out dk,
                            Out ds, Out workspace, std::optional<Buffer> labels,
                            uint64_t logit_cache_bytes, int64_t fp32_precision) {
  ResultWorkspace ws(*workspace);
  return run_backward(FLATMEM_CONTRASTIVE_INFONCE, logit_cache_bytes, fp32_precision, kCpu,
                      nullptr, {q, k, s, labels, row_lse, std::nullopt, g, *dq, *dk, *ds}, ws);
}

ffi::Error sigmoid_forward(Buffer q, Buffer k, Buffer s, Buffer t, Out loss, Out workspace,
                           std::optional<Buffer> labels, uint64_t logit_cache_bytes,
                           int64_t fp32_precision) {
  ResultWorkspace ws(*workspace);
  return run_sigmoid(SigmoidCall::forward, logit_cache_bytes, fp32_precision, kCpu, nullptr,
                     {q, k, s, t, labels, std::nullopt, *loss, std::nullopt, std::nullopt,
                      std::nullopt, std::nullopt},
                     ws);
}

ffi::Error sigmoid_value_and_grad(Buffer q, Buffer k, Buffer s, Buffer t, Out loss, Out dq, Out dk,
                                  Out ds, Out dt, Out workspace, std::optional<Buffer> labels,
                                  uint64_t logit_cache_bytes, int64_t fp32_precision) {
  ResultWorkspace ws(*workspace);
  return run_sigmoid(SigmoidCall::value_and_grad, logit_cache_bytes, fp32_precision, kCpu, nullptr,
                     {q, k, s, t, labels, std::nullopt, *loss, *dq, *dk, *ds, *dt}, ws);
}

ffi::Error sigmoid_backward(Buffer q, Buffer k, Buffer s, Buffer t, Buffer g, Out dq, Out dk,
                            Out ds, Out dt, Out workspace, std::optional<Buffer> labels,
                            uint64_t logit_cache_bytes, int64_t fp32_precision) {
  ResultWorkspace ws(*workspace);
  return run_sigmoid(SigmoidCall::backward, logit_cache_bytes, fp32_precision, kCpu, nullptr,
                     {q, k, s, t, labels, g, std::nullopt, *dq, *dk, *ds, *dt}, ws);
}

}  // namespace

// The symbols are declared with FLATMEM_JAX_API in flatmem_jax.h, which keeps
// them exported under -fvisibility=hidden. Lists: contrastive_bindings.hpp,
// with the workspace result.
XLA_FFI_DEFINE_HANDLER_SYMBOL(flatmem_jax_clip_forward_cpu, clip_forward,
                              clip_forward_binding<true>(ffi::Ffi::Bind()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(flatmem_jax_clip_backward_cpu, clip_backward,
                              clip_backward_binding<true>(ffi::Ffi::Bind()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(flatmem_jax_infonce_forward_cpu, infonce_forward,
                              infonce_forward_binding<true>(ffi::Ffi::Bind()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(flatmem_jax_infonce_backward_cpu, infonce_backward,
                              infonce_backward_binding<true>(ffi::Ffi::Bind()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(flatmem_jax_sigmoid_forward_cpu, sigmoid_forward,
                              sigmoid_forward_binding<true>(ffi::Ffi::Bind()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(flatmem_jax_sigmoid_value_and_grad_cpu, sigmoid_value_and_grad,
                              sigmoid_value_and_grad_binding<true>(ffi::Ffi::Bind()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(flatmem_jax_sigmoid_backward_cpu, sigmoid_backward,
                              sigmoid_backward_binding<true>(ffi::Ffi::Bind()));
