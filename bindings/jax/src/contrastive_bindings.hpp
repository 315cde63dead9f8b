// The argument and result lists of the contrastive-loss handlers, shared by
// the CPU and the CUDA handlers. Each platform starts from its own binder
// (CUDA: stream, device ordinal and scratch allocator contexts); the CPU
// handlers have one more result, the workspace, because XLA:CPU offers FFI
// handlers no scratch allocator (Workspace = true).
//
//   clip forward      q, k, logit_scale -> loss, row_lse, col_lse [, workspace]
//   clip backward     q, k, logit_scale, row_lse, col_lse, dloss
//                       -> dq, dk, dlogit_scale [, workspace]
//   infonce forward   q, k, logit_scale -> loss, row_lse [, workspace], labels?
//   infonce backward  q, k, logit_scale, row_lse, dloss
//                       -> dq, dk, dlogit_scale [, workspace], labels?
//   sigmoid forward   q, k, logit_scale, logit_bias -> loss [, workspace], labels?
//   sigmoid value_and_grad
//                     q, k, logit_scale, logit_bias
//                       -> loss, dq, dk, dlogit_scale, dlogit_bias [, workspace], labels?
//   sigmoid backward  q, k, logit_scale, logit_bias, dloss
//                       -> dq, dk, dlogit_scale, dlogit_bias [, workspace], labels?
//
// Every one of them has two attributes after the buffers, Attrs: by default
// logit_cache_bytes (u64), options.logit_cache_bytes of the pooled handle
// (handle_pool.hpp); the ring losses (ring_handlers.cpp) take CommAttr, the
// communicator's registry slot (s64, ring_registry.hpp), instead. Both end
// with fp32_precision (s64), options.fp32_precision of the handle (a
// flatmem_fp32_precision value; flatmem_contrastive_create judges it). XLA
// hands attributes over sorted by name; the binding maps them by name, so the
// order below is the handlers' parameter order only.
//
// xla::ffi::Binding can only be extended (its move constructor is private),
// so every step below calls a member on an rvalue and hands the new binder on
// by reference.
#pragma once

#include <cstdint>
#include <utility>

#include "xla/ffi/api/ffi.h"

namespace flatmem_jax {

namespace binding_detail {

using B = xla::ffi::AnyBuffer;

// N buffer arguments appended.
template <int N, typename Binder>
auto args(Binder &&b) {
  if constexpr (N == 1)
    return std::move(b).template Arg<B>();
  else
    return args<N - 1>(std::move(b).template Arg<B>());
}

// N buffer results appended.
template <int N, typename Binder>
auto rets(Binder &&b) {
  if constexpr (N == 1)
    return std::move(b).template Ret<B>();
  else
    return rets<N - 1>(std::move(b).template Ret<B>());
}

}  // namespace binding_detail

// The attribute lists, after the buffers.
struct CacheAttr {
  template <typename Binder>
  auto operator()(Binder &&b) const {
    return std::move(b)
        .template Attr<uint64_t>("logit_cache_bytes")
        .template Attr<int64_t>("fp32_precision");
  }
};

struct CommAttr {
  template <typename Binder>
  auto operator()(Binder &&b) const {
    return std::move(b).template Attr<int64_t>("comm").template Attr<int64_t>("fp32_precision");
  }
};

template <bool Workspace, typename Attrs = CacheAttr, typename Binder>
auto clip_forward_binding(Binder &&b) {
  using namespace binding_detail;
  return Attrs{}(rets<3 + Workspace>(args<3>(std::move(b))));
}

template <bool Workspace, typename Attrs = CacheAttr, typename Binder>
auto clip_backward_binding(Binder &&b) {
  using namespace binding_detail;
  return Attrs{}(rets<3 + Workspace>(args<6>(std::move(b))));
}

template <bool Workspace, typename Attrs = CacheAttr, typename Binder>
auto infonce_forward_binding(Binder &&b) {
  using namespace binding_detail;
  return Attrs{}(rets<2 + Workspace>(args<3>(std::move(b))).template OptionalArg<B>());
}

template <bool Workspace, typename Attrs = CacheAttr, typename Binder>
auto infonce_backward_binding(Binder &&b) {
  using namespace binding_detail;
  return Attrs{}(rets<3 + Workspace>(args<5>(std::move(b))).template OptionalArg<B>());
}

// The sigmoid loss: `Args` buffers (q, k, logit_scale, logit_bias [, dloss]),
// `Rets` results plus the workspace, the optional labels, the attributes.
template <int Args, int Rets, bool Workspace, typename Attrs = CacheAttr, typename Binder>
auto sigmoid_binding(Binder &&b) {
  using namespace binding_detail;
  return Attrs{}(rets<Rets + Workspace>(args<Args>(std::move(b))).template OptionalArg<B>());
}

template <bool Workspace, typename Attrs = CacheAttr, typename Binder>
auto sigmoid_forward_binding(Binder &&b) {
  return sigmoid_binding<4, 1, Workspace, Attrs>(std::move(b));
}

template <bool Workspace, typename Attrs = CacheAttr, typename Binder>
auto sigmoid_value_and_grad_binding(Binder &&b) {
  return sigmoid_binding<4, 5, Workspace, Attrs>(std::move(b));
}

template <bool Workspace, typename Attrs = CacheAttr, typename Binder>
auto sigmoid_backward_binding(Binder &&b) {
  return sigmoid_binding<5, 4, Workspace, Attrs>(std::move(b));
}

}  // namespace flatmem_jax
