// XLA FFI handlers of a reversible segment of flatmem's built-in blocks
// (pre-LN attention as F, pre-LN GELU MLP as G) for XLA:CPU. The segment
// cache, the parameter pointing and the flatmem calls are shared with the
// CUDA handlers (reversible_call.cpp); see flatmem_jax.h for the operands.
//
// The workspace is the handler's result after (y1, y2) / (dx1, dx2): a u8
// buffer of flatmem_jax_reversible_workspace_size() bytes, sized at trace
// time, as the contrastive CPU handlers do (XLA:CPU offers FFI handlers no
// scratch allocator).
#include <cstring>

#include "flatmem_jax.h"
#include "reversible_bindings.hpp"
#include "reversible_call.hpp"

namespace {

using namespace flatmem_jax;

constexpr DLDevice kCpu{kDLCPU, 0};
using Buffer = ffi::AnyBuffer;
using Out = ffi::Result<ffi::AnyBuffer>;

class CpuPlatform final : public ReversiblePlatform {
 public:
  explicit CpuPlatform(Buffer workspace) : workspace_(workspace) {}
  ffi::ErrorOr<Workspace> workspace(flatmem_reversible_t *, const DLTensor &, bool) override {
    // flatmem checks the size and says WORKSPACE_TOO_SMALL if it is short.
    return Workspace{workspace_.untyped_data(), workspace_.size_bytes()};
  }
  ffi::Error zero(Buffer buffer) override {
    std::memset(buffer.untyped_data(), 0, buffer.size_bytes());
    return ffi::Error::Success();
  }

 private:
  Buffer workspace_;
};

ffi::Error reversible_forward(Buffer x1, Buffer x2, ffi::RemainingArgs params, Out y1, Out y2,
                              Out workspace, ReversibleAttrs attrs) {
  CpuPlatform platform(*workspace);
  return run_reversible_forward(kCpu, nullptr, x1, x2, params, *y1, *y2, attrs, platform);
}

ffi::Error reversible_backward(Buffer y1, Buffer y2, Buffer dy1, Buffer dy2,
                               ffi::RemainingArgs params, Out dx1, Out dx2, Out workspace,
                               ffi::RemainingRets grads, ReversibleAttrs attrs) {
  CpuPlatform platform(*workspace);
  return run_reversible_backward(kCpu, nullptr, y1, y2, dy1, dy2, params, *dx1, *dx2, grads, attrs,
                                 platform);
}

}  // namespace

// The symbols are declared with FLATMEM_JAX_API in flatmem_jax.h. Lists:
// reversible_bindings.hpp, with the workspace result.
XLA_FFI_DEFINE_HANDLER_SYMBOL(flatmem_jax_reversible_forward_cpu, reversible_forward,
                              reversible_forward_binding<true>(ffi::Ffi::Bind()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(flatmem_jax_reversible_backward_cpu, reversible_backward,
                              reversible_backward_binding<true>(ffi::Ffi::Bind()));
