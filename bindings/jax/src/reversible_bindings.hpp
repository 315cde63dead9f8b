// The argument and result lists of the reversible-segment handlers, shared by
// the CPU and the CUDA handlers as contrastive_bindings.hpp does for the loss:
// each platform starts from its own binder (CUDA: stream, device ordinal and
// scratch allocator contexts); the CPU handlers have one more result, the
// workspace, after the two states (Workspace = true).
//
//   forward    x1, x2, params...            -> y1, y2 [, workspace]
//   backward   y1, y2, dy1, dy2, params...  -> dx1, dx2 [, workspace], grads...
//
// params: 12 buffers per block (RemainingArgs), grads their gradients
// (RemainingRets); the attributes decode into ReversibleAttrs.
#pragma once

#include <utility>

#include "contrastive_bindings.hpp"  // binding_detail::args / rets
#include "reversible_call.hpp"       // ReversibleAttrs and its decoding

namespace flatmem_jax {

template <bool Workspace, typename Binder>
auto reversible_forward_binding(Binder &&b) {
  using namespace binding_detail;
  return rets<2 + Workspace>(args<2>(std::move(b)).RemainingArgs())
      .template Attrs<ReversibleAttrs>();
}

template <bool Workspace, typename Binder>
auto reversible_backward_binding(Binder &&b) {
  using namespace binding_detail;
  return rets<2 + Workspace>(args<4>(std::move(b)).RemainingArgs())
      .RemainingRets()
      .template Attrs<ReversibleAttrs>();
}

}  // namespace flatmem_jax
