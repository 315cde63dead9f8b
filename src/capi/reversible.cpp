// extern "C" entry points of reversible segments: argument checks, then the
// CPU executor; exceptions become statuses (core/error.hpp).
#include <chrono>
#include <cstring>
#include <new>

#include "core/abi_struct.hpp"
#include "core/error.hpp"
#include "core/tensor.hpp"
#include "core/options.hpp"
#include "reversible/callbacks.hpp"
#include "reversible/schedules.hpp"
#if FLATMEM_HAVE_CUDA_BACKEND
#include "reversible/cuda/auto_timing.hpp"
#include "reversible/cuda/stream_chain.hpp"
#endif
#include "reversible/segment.hpp"

using namespace flatmem;
using namespace flatmem::reversible;

namespace {

constexpr std::int32_t max_blocks = 65536;

void check_handle(const flatmem_reversible_t *h) {
  if (h == nullptr) invalid("handle: NULL (create one with flatmem_reversible_create)");
}
void check_out(const void *p, const char *name) {
  if (p == nullptr) invalid(name, ": NULL");
}

flatmem_reversible_mode resolve_mode(std::int32_t mode) {
  switch (mode) {
    case FLATMEM_REVERSIBLE_AUTO:
    case FLATMEM_REVERSIBLE_STANDARD:
    case FLATMEM_REVERSIBLE_VANILLA:
    case FLATMEM_REVERSIBLE_OVERLAPPED: return flatmem_reversible_mode(mode);
    default: invalid("options.mode: ", mode, " is not a flatmem_reversible_mode");
  }
}

void check_function(const flatmem_reversible_function &fn, std::int32_t k, const char *part) {
  if (fn.forward == nullptr) invalid("blocks[", k, "].", part, ".forward: NULL");
  if (fn.vjp == nullptr) invalid("blocks[", k, "].", part, ".vjp: NULL");
}

// Runs body(chain) on the chain of the states' device: the handle's CPU
// chain, or the caller's CUDA stream.
template <typename Body>
void on_chain(flatmem_reversible_t *h, const StateLayout &s, void *stream, Body body) {
#if FLATMEM_HAVE_CUDA_BACKEND
  if (s.device.device_type == kDLCUDA) {
    cuda::StreamChain chain(s.device.device_id, static_cast<cudaStream_t>(stream));
    body(static_cast<Chain &>(chain));
    return;
  }
#else
  (void)stream;
#endif
  (void)s;
  body(static_cast<Chain &>(h->main_chain));
}

// The caller's workspace (checked), or the handle's own on the states'
// device (CUDA: cudaMalloc, which synchronises, only when it must grow).
void *resolve_workspace(flatmem_reversible_t *h, Chain &chain, const StateLayout &s, void *given,
                        std::size_t given_bytes, std::size_t needed) {
  if (given != nullptr || s.device.device_type == kDLCPU)
    return h->workspace.resolve(given, given_bytes, needed);
  if (given_bytes != 0) invalid("workspace: NULL with workspace_bytes = ", given_bytes, "; pass 0");
  if (h->device_workspace_bytes < needed) {
    h->device_workspace.reset();
    h->device_workspace_bytes = 0;
    h->device_workspace = chain.allocate(needed, "workspace");
    h->device_workspace_bytes = needed;
  }
  return h->device_workspace.get();
}

// The workspace a backward in `mode` needs (AUTO: the larger of its two).
std::size_t backward_bytes(const StateLayout &s, const ResidualPlan &r,
                           flatmem_reversible_mode mode) {
  if (mode == FLATMEM_REVERSIBLE_AUTO) mode = FLATMEM_REVERSIBLE_OVERLAPPED;
  return backward_workspace_bytes(s, r, mode);
}

}  // namespace

extern "C" {

flatmem_status flatmem_reversible_options_init(flatmem_reversible_options *options, size_t struct_size) {
  return guarded([&] {
    init_struct(options, struct_size, flatmem_reversible_options FLATMEM_REVERSIBLE_OPTIONS_INIT, "options");
  });
}

uint64_t flatmem_reversible_block_seed(uint64_t seed, int32_t block, int32_t part) {
  return block_seed(seed, block, part);
}

void flatmem_reversible_callback_error(const char *message) { set_callback_message(message); }

flatmem_status flatmem_reversible_create(flatmem_reversible_t **out,
                                         const flatmem_reversible_block *blocks,
                                         int32_t num_blocks,
                                         const flatmem_reversible_options *options) {
  return guarded([&] {
    check_out(out, "out");
    if (num_blocks < 1 || num_blocks > max_blocks)
      invalid("num_blocks: ", num_blocks, "; expected 1 to ", max_blocks);
    check_out(blocks, "blocks");
    for (std::int32_t k = 0; k < num_blocks; ++k) {
      check_function(blocks[k].f, k, "f");
      check_function(blocks[k].g, k, "g");
    }
    const flatmem_reversible_options o = read_options(
        options, "FLATMEM_REVERSIBLE_OPTIONS_INIT or flatmem_reversible_options_init");
    const flatmem_reversible_mode mode = resolve_mode(enum_value(o.mode));
    const int threads = resolve_threads(o.num_threads, "options.num_threads");
    *out = new flatmem_reversible_s(std::vector<flatmem_reversible_block>(blocks, blocks + num_blocks),
                                    mode, threads);
  });
}

flatmem_status flatmem_reversible_destroy(flatmem_reversible_t *handle) {
  return guarded([&] { delete handle; });
}

flatmem_status flatmem_reversible_forward_workspace_size(flatmem_reversible_t *handle,
                                                         const DLTensor *x, size_t *bytes) {
  return guarded([&] {
    check_handle(handle);
    check_out(bytes, "bytes");
    const StateLayout s = check_state(x, "x", DataUse::metadata_only);
    *bytes = handle->mode == FLATMEM_REVERSIBLE_STANDARD ? 0 : forward_workspace_bytes(s);
  });
}

flatmem_status flatmem_reversible_backward_workspace_size(flatmem_reversible_t *handle,
                                                          const DLTensor *x, size_t *bytes) {
  return guarded([&] {
    check_handle(handle);
    check_out(bytes, "bytes");
    const StateLayout s = check_state(x, "x", DataUse::metadata_only);
    *bytes = backward_bytes(s, plan_residuals(handle->blocks, s), handle->mode);
  });
}

flatmem_status flatmem_reversible_forward(flatmem_reversible_t *handle, const DLTensor *x1,
                                          const DLTensor *x2, uint64_t seed, uint64_t offset,
                                          DLTensor *y1, DLTensor *y2, void *workspace,
                                          size_t workspace_bytes, void *stream) {
  return guarded([&] {
    check_handle(handle);
    const StateLayout s = check_state(x1, "x1", DataUse::required);
    check_state_like(x2, "x2", s, "x1", DataUse::required);
    check_state_like(y1, "y1", s, "x1", DataUse::required);
    check_state_like(y2, "y2", s, "x1", DataUse::required);
    check_disjoint(y1, "y1", y2, "y2", s.bytes());
    const Randomness rng{seed, offset};
    on_chain(handle, s, stream, [&](Chain &chain) {
      if (handle->mode == FLATMEM_REVERSIBLE_STANDARD) {
        resolve_workspace(handle, chain, s, workspace, workspace_bytes, 0);
        record_forward(*handle, chain, s, plan_residuals(handle->blocks, s), data_of(x1),
                       data_of(x2), rng, data_of(y1), data_of(y2));
        return;
      }
      void *ws = resolve_workspace(handle, chain, s, workspace, workspace_bytes,
                                   forward_workspace_bytes(s));
      reversible::forward(*handle, chain, s, data_of(x1), data_of(x2), rng, data_of(y1),
                          data_of(y2), ws);
    });
  });
}

flatmem_status flatmem_reversible_backward(flatmem_reversible_t *handle, const DLTensor *y1,
                                           const DLTensor *y2, const DLTensor *dy1,
                                           const DLTensor *dy2, uint64_t seed, uint64_t offset,
                                           DLTensor *dx1, DLTensor *dx2, DLTensor *x1,
                                           DLTensor *x2, void *workspace, size_t workspace_bytes,
                                           void *stream) {
  return guarded([&] {
    check_handle(handle);
    const StateLayout s = check_state(y1, "y1", DataUse::required);
    check_state_like(y2, "y2", s, "y1", DataUse::required);
    check_state_like(dy1, "dy1", s, "y1", DataUse::required);
    check_state_like(dy2, "dy2", s, "y1", DataUse::required);
    check_state_like(dx1, "dx1", s, "y1", DataUse::required);
    check_state_like(dx2, "dx2", s, "y1", DataUse::required);
    if ((x1 == nullptr) != (x2 == nullptr))
      invalid(x1 ? "x2" : "x1", ": NULL while ", x1 ? "x1" : "x2",
              " is not; pass both rebuilt-input outputs or neither");
    std::vector<std::pair<const DLTensor *, const char *>> outputs{{dx1, "dx1"}, {dx2, "dx2"}};
    if (x1 != nullptr) {
      check_state_like(x1, "x1", s, "y1", DataUse::required);
      check_state_like(x2, "x2", s, "y1", DataUse::required);
      outputs.insert(outputs.end(), {{x1, "x1"}, {x2, "x2"}});
    }
    for (std::size_t i = 0; i < outputs.size(); ++i)
      for (std::size_t j = i + 1; j < outputs.size(); ++j)
        check_disjoint(outputs[i].first, outputs[i].second, outputs[j].first, outputs[j].second,
                       s.bytes());

    flatmem_reversible_mode mode = handle->mode;
    if (mode == FLATMEM_REVERSIBLE_STANDARD && !(handle->record.valid && handle->record.layout == s))
      invalid("y1: STANDARD mode needs a preceding forward of this handle with states of this "
              "shape and dtype (the forward keeps the activations the backward uses)");
    const ResidualPlan r = mode == FLATMEM_REVERSIBLE_STANDARD ? handle->record.residual_plan
                                                               : plan_residuals(handle->blocks, s);
    // AUTO: a timed choice (auto_mode.hpp); on CUDA timed by events that a
    // later backward reads (cuda/auto_timing.hpp), never by a host wait.
    const bool is_auto = mode == FLATMEM_REVERSIBLE_AUTO;
    const bool on_cuda = s.device.device_type == kDLCUDA;
    bool timed_auto = is_auto && !on_cuda;
    if (is_auto) {
#if FLATMEM_HAVE_CUDA_BACKEND
      if (on_cuda)
        mode = cuda::auto_backward_begin(*handle, s, static_cast<cudaStream_t>(stream), timed_auto);
      else
#endif
        mode = handle->chooser.next(s, handle->size());
    }
    const BackwardIo io{data_of(y1),  data_of(y2),  data_of(dy1),
                             data_of(dy2), data_of(dx1), data_of(dx2),
                             x1 ? data_of(x1) : nullptr, x2 ? data_of(x2) : nullptr};
    const auto start = std::chrono::steady_clock::now();
    on_chain(handle, s, stream, [&](Chain &chain) {
      void *ws = resolve_workspace(handle, chain, s, workspace, workspace_bytes,
                                   backward_bytes(s, r, handle->mode));
      reversible::backward(*handle, chain, mode, s, r, Randomness{seed, offset}, io, ws);
    });
#if FLATMEM_HAVE_CUDA_BACKEND
    if (timed_auto && on_cuda) cuda::auto_backward_end(*handle, s, mode, static_cast<cudaStream_t>(stream));
#endif
    if (timed_auto && !on_cuda)
      handle->chooser.record(
          s, mode, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    handle->last_mode = mode;
  });
}

flatmem_status flatmem_reversible_last_mode(const flatmem_reversible_t *handle,
                                            flatmem_reversible_mode *mode) {
  return guarded([&] {
    check_handle(handle);
    check_out(mode, "mode");
    *mode = handle->last_mode;
  });
}

flatmem_status flatmem_reversible_rebuild_error(flatmem_reversible_t *handle, const DLTensor *x1,
                                                const DLTensor *x2, uint64_t seed, uint64_t offset,
                                                DLTensor *errors, void * /*stream*/) {
  return guarded([&] {
    check_handle(handle);
    const StateLayout s = check_state(x1, "x1", DataUse::required);
    check_state_like(x2, "x2", s, "x1", DataUse::required);
    if (s.device.device_type != kDLCPU)
      fail(FLATMEM_STATUS_UNSUPPORTED, "x1: rebuild_error runs on CPU states only in this version");
    if (errors == nullptr) invalid("errors: tensor is NULL");
    if (device_type_of(errors->device) != kDLCPU || errors->dtype.code != kDLFloat ||
        errors->dtype.bits != 64 || errors->dtype.lanes != 1 || errors->ndim != 1 ||
        errors->shape == nullptr || errors->shape[0] != handle->size() ||
        (errors->strides != nullptr && errors->strides[0] != 1) || errors->data == nullptr ||
        reinterpret_cast<std::uintptr_t>(data_of(errors)) % alignof(double) != 0)
      invalid("errors: expected a contiguous fp64 CPU vector of ", handle->size(),
              " elements (one per block), 8-byte aligned data");
    std::vector<double> result(std::size_t(handle->size()));
    cpu::rebuild_error(*handle, s, plan_residuals(handle->blocks, s), data_of(x1), data_of(x2),
                       Randomness{seed, offset}, result.data());
    std::memcpy(data_of(errors), result.data(), result.size() * sizeof(double));
  });
}

}  // extern "C"
