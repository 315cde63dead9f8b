// extern "C" entry points of the contrastive loss: argument checks, then the
// backend the tensors' device selects (kDLCPU: cpu/, kDLCUDA: cuda/ when
// built with it); exceptions become statuses (core/error.hpp).
#define FLATMEM_EXPERIMENTAL 1  // defines flatmem_contrastive_ring_stats_get
#include "contrastive/cpu/forward.hpp"
#ifdef FLATMEM_HAVE_CUDA_BACKEND
#include "contrastive/cuda/backend.hpp"
#endif
#include "contrastive/handle.hpp"
#include "contrastive/plan.hpp"
#include "contrastive/ring/ring.hpp"
#include "contrastive/validate.hpp"
#include "core/abi_struct.hpp"
#include "core/cpu_isa.hpp"
#include "core/error.hpp"

#include <algorithm>
#include <cstring>

using namespace flatmem;
using namespace flatmem::contrastive;

namespace {

void check_handle(const flatmem_contrastive_t *h) {
  if (h == nullptr) invalid("handle: NULL (create one with flatmem_contrastive_create)");
}
void check_out(const void *p, const char *name) {
  if (p == nullptr) invalid(name, ": NULL");
}

Plan plan_for(const flatmem_contrastive_t *h, const MatrixView &q, const MatrixView &k) {
  return make_plan(q.rows, k.rows, q.cols, h->options);
}

// Whether a validated call runs on the CUDA backend (validation refuses
// kDLCUDA tensors in a build without it).
bool on_cuda(const MatrixView &q) {
  return cuda_backend_built() && q.device.device_type == kDLCUDA;
}

#ifdef FLATMEM_HAVE_CUDA_BACKEND
#define FLATMEM_CUDA_ONLY(statement) statement
#else
#define FLATMEM_CUDA_ONLY(statement) invalid("internal: kDLCUDA tensor in a build without CUDA")
#endif

}  // namespace

extern "C" {

flatmem_status flatmem_contrastive_options_init(flatmem_contrastive_options *options,
                                                size_t struct_size) {
  return guarded([&] {
    init_struct(options, struct_size, flatmem_contrastive_options FLATMEM_CONTRASTIVE_OPTIONS_INIT,
                "options");
  });
}

flatmem_status flatmem_contrastive_create(flatmem_contrastive_t **out,
                                          const flatmem_contrastive_options *options) {
  return guarded([&] {
    check_out(out, "out");
    cpu_isa::active();  // FLATMEM_CPU_ISA asking for more than the CPU has: refused here
    const Options resolved = resolve_options(options);
    *out = new flatmem_contrastive_s(resolved);
  });
}

flatmem_status flatmem_contrastive_destroy(flatmem_contrastive_t *handle) {
  return guarded([&] { delete handle; });
}

flatmem_status flatmem_contrastive_forward_workspace_size(const flatmem_contrastive_t *handle,
                                                          const DLTensor *q, const DLTensor *k,
                                                          size_t *bytes) {
  return guarded([&] {
    check_handle(handle);
    check_loss_kind(handle->options, false, "flatmem_contrastive_forward_workspace_size");
    check_out(bytes, "bytes");
    MatrixView qv, kv;
    check_features(handle->options, q, k, DataUse::metadata_only, qv, kv);
    if (handle->options.comm) {  // the ring uses the handle's own buffers
      *bytes = 0;
      return;
    }
    if (on_cuda(qv)) {
      FLATMEM_CUDA_ONLY(*bytes = cuda::forward_workspace_bytes(handle->options, qv, kv));
      return;
    }
    *bytes = cpu::forward_workspace_bytes(plan_for(handle, qv, kv), handle->options.loss, qv.dtype,
                                          handle->pool.size());
  });
}

flatmem_status flatmem_contrastive_backward_workspace_size(const flatmem_contrastive_t *handle,
                                                           const DLTensor *q, const DLTensor *k,
                                                           const DLTensor *dq, const DLTensor *dk,
                                                           size_t *bytes) {
  return guarded([&] {
    check_handle(handle);
    check_loss_kind(handle->options, false, "flatmem_contrastive_backward_workspace_size");
    check_out(bytes, "bytes");
    MatrixView qv, kv;
    check_features(handle->options, q, k, DataUse::metadata_only, qv, kv);
    const MatrixView dqv = check_gradient(dq, "dq", qv, "q", DataUse::metadata_only);
    const MatrixView dkv = check_gradient(dk, "dk", kv, "k", DataUse::metadata_only);
    if (handle->options.comm) {  // the ring uses the handle's own buffers
      *bytes = 0;
      return;
    }
    if (on_cuda(qv)) {
      FLATMEM_CUDA_ONLY(*bytes = cuda::backward_workspace_bytes(handle->options, qv, kv, dq != nullptr, dk != nullptr));
      return;
    }
    *bytes = cpu::backward_workspace_bytes(plan_for(handle, qv, kv), qv.dtype,
                                           dq ? &dqv.dtype : nullptr, dk ? &dkv.dtype : nullptr,
                                           handle->pool.size());
  });
}

flatmem_status flatmem_contrastive_forward(flatmem_contrastive_t *handle, const DLTensor *q,
                                           const DLTensor *k, const DLTensor *labels,
                                           const DLTensor *logit_scale, DLTensor *loss,
                                           DLTensor *row_lse, DLTensor *col_lse, void *workspace,
                                           size_t workspace_bytes, void *stream) {
  return guarded([&] {
    (void)stream;  // CUDA only
    check_handle(handle);
    check_loss_kind(handle->options, false, "flatmem_contrastive_forward");
    cpu_isa::active();
    if (handle->options.comm)
      return ring::forward(*handle, q, k, labels, logit_scale, loss, row_lse, col_lse, workspace,
                           workspace_bytes, stream);
    const Inputs in = check_inputs(handle->options, q, k, labels, logit_scale);
    const ForwardOutputs out = check_forward_outputs(in, loss, row_lse, col_lse);
    handle->logit_cache.invalidate();  // a failed or CUDA forward leaves no tiles to trust
    if (on_cuda(in.q)) {
      FLATMEM_CUDA_ONLY(cuda::forward(handle->options, in, out, workspace, workspace_bytes, stream));
      return;
    }
    const Plan plan = plan_for(handle, in.q, in.k);
    const std::size_t needed =
        cpu::forward_workspace_bytes(plan, in.loss, in.q.dtype, handle->pool.size());
    void *ws = handle->workspace.resolve(workspace, workspace_bytes, needed);
    const cpu::CachedTiles cache = handle->logit_cache.begin_forward(handle->pool, plan, in);
    cpu::forward(handle->pool, plan, in, out, ws, cache);
    handle->logit_cache.finish_forward();
  });
}

flatmem_status flatmem_contrastive_backward(flatmem_contrastive_t *handle, const DLTensor *q,
                                            const DLTensor *k, const DLTensor *labels,
                                            const DLTensor *logit_scale, const DLTensor *row_lse,
                                            const DLTensor *col_lse, const DLTensor *dloss,
                                            DLTensor *dq, DLTensor *dk, DLTensor *dlogit_scale,
                                            void *workspace, size_t workspace_bytes,
                                            void *stream) {
  return guarded([&] {
    (void)stream;  // CUDA only
    check_handle(handle);
    check_loss_kind(handle->options, false, "flatmem_contrastive_backward");
    cpu_isa::active();
    if (handle->options.comm)
      return ring::backward(*handle, q, k, labels, logit_scale, row_lse, col_lse, dloss, dq, dk,
                            dlogit_scale, workspace, workspace_bytes, stream);
    const Inputs in = check_inputs(handle->options, q, k, labels, logit_scale);
    const BackwardArgs args = check_backward_args(handle->options, in, row_lse, col_lse, dloss, dq,
                                                 dk, dlogit_scale);
    if (on_cuda(in.q)) {
      FLATMEM_CUDA_ONLY(cuda::backward(handle->options, in, args, workspace, workspace_bytes, stream));
      return;
    }
    const Plan plan = plan_for(handle, in.q, in.k);
    const std::size_t needed = cpu::backward_workspace_bytes(
        plan, in.q.dtype, args.dq.data ? &args.dq.dtype : nullptr,
        args.dk.data ? &args.dk.dtype : nullptr, handle->pool.size());
    void *ws = handle->workspace.resolve(workspace, workspace_bytes, needed);
    cpu::backward(handle->pool, plan, in, args, ws,
                  handle->logit_cache.for_backward(handle->pool, plan, in));
  });
}

flatmem_status flatmem_contrastive_ring_stats_get(const flatmem_contrastive_t *handle,
                                                  int32_t backward,
                                                  flatmem_contrastive_ring_stats *stats,
                                                  size_t stats_size) {
  return guarded([&] {
    check_handle(handle);
    const ring::Stats &s = backward ? handle->ring_backward_stats : handle->ring_forward_stats;
    const flatmem_contrastive_ring_stats full{s.bytes_sent, s.messages_sent, s.wait_seconds,
                                              s.seconds, s.steps, 0};
    write_struct(stats, stats_size, full, "stats", "stats_size");
  });
}

}  // extern "C"
