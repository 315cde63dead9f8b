// The helpers of flatmem_jax.h that are not handlers: versions, whether the
// CUDA handlers are in, the workspace query the Python module calls at
// trace time to size the CPU handlers' workspace result, the contrastive
// pool's counters, and the communicators of the ring losses.
#include <cstdio>
#include <string>

#include "flatmem_jax.h"
#include "handle_pool.hpp"
#include "ring_registry.hpp"

namespace {

DLDataType dlpack_type(int code, int bits) {
  return DLDataType{static_cast<uint8_t>(code), static_cast<uint8_t>(bits), 1};
}

// A q or k for the workspace queries, which read device, dtype, ndim and shape only.
DLTensor shape_only(DLDataType dtype, int64_t *shape) {
  DLTensor t{};
  t.device = DLDevice{kDLCPU, 0};
  t.ndim = 2;
  t.dtype = dtype;
  t.shape = shape;
  return t;
}

void write_message(flatmem_status status, const char *text, char *message, size_t message_size) {
  if (message == nullptr || message_size == 0) return;
  std::snprintf(message, message_size, "%s: %s", flatmem_status_string(status), text);
}

void write_message(flatmem_status status, char *message, size_t message_size) {
  write_message(status, flatmem_last_error(), message, message_size);
}

// A call on the communicator of `slot`, its slot locked: `call(comm)` returns
// a flatmem status whose text is flatmem_last_error().
template <typename Call>
int with_comm(int64_t slot, char *message, size_t message_size, Call call) {
  flatmem_jax::RingLease lease(slot);
  if (lease.status() != FLATMEM_STATUS_SUCCESS) {
    write_message(lease.status(), lease.message().c_str(), message, message_size);
    return lease.status();
  }
  const flatmem_status status = call(lease.comm());
  if (status != FLATMEM_STATUS_SUCCESS) write_message(status, message, message_size);
  return status;
}

}  // namespace

extern "C" {

int flatmem_jax_header_version(void) { return FLATMEM_VERSION; }

int flatmem_jax_library_version(void) { return flatmem_version(); }

int flatmem_jax_has_cuda(void) {
#ifdef FLATMEM_JAX_HAVE_CUDA
  return 1;
#else
  return 0;
#endif
}

int flatmem_jax_workspace_size(int loss, int backward, int q_code, int q_bits, int64_t b,
                               int64_t dq, int k_code, int k_bits, int64_t c, int64_t dk,
                               size_t *bytes, char *message, size_t message_size) {
  if (loss != FLATMEM_CONTRASTIVE_SYMMETRIC && loss != FLATMEM_CONTRASTIVE_INFONCE &&
      loss != FLATMEM_CONTRASTIVE_SIGMOID) {
    if (message != nullptr && message_size > 0)
      std::snprintf(message, message_size,
                    "FLATMEM_STATUS_INVALID_ARGUMENT: loss: %d is none of "
                    "FLATMEM_CONTRASTIVE_SYMMETRIC (1), _INFONCE (2), _SIGMOID (3)", loss);
    return FLATMEM_STATUS_INVALID_ARGUMENT;
  }
  int64_t q_shape[2] = {b, dq};
  int64_t k_shape[2] = {c, dk};
  const DLTensor q = shape_only(dlpack_type(q_code, q_bits), q_shape);
  const DLTensor k = shape_only(dlpack_type(k_code, k_bits), k_shape);
  // Any CPU handle of the loss answers (neither the logit cache nor fp32_precision is part of
  // the workspace).
  flatmem_jax::PooledHandle handle({static_cast<flatmem_contrastive_loss>(loss), /*cuda=*/false, 0,
                                    FLATMEM_FP32_PRECISION_DEFAULT});
  flatmem_status status = handle.status();
  if (status == FLATMEM_STATUS_SUCCESS) {
    // dq like q and dk like k: the handlers return gradients in the input dtypes
    // (the sigmoid loss: "backward" = value_and_grad and backward, which take the same).
    const DLTensor *dq = backward ? &q : nullptr, *dk = backward ? &k : nullptr;
    if (loss == FLATMEM_CONTRASTIVE_SIGMOID)
      status = flatmem_contrastive_sigmoid_workspace_size(handle.get(), &q, &k, dq, dk, bytes);
    else if (backward)
      status = flatmem_contrastive_backward_workspace_size(handle.get(), &q, &k, dq, dk, bytes);
    else
      status = flatmem_contrastive_forward_workspace_size(handle.get(), &q, &k, bytes);
  }
  if (status != FLATMEM_STATUS_SUCCESS) write_message(status, message, message_size);
  return status;
}

void flatmem_jax_contrastive_pool_stats(int64_t *handles, int64_t *cached_backwards,
                                        int64_t *cached_backwards_on_forward_handle) {
  const flatmem_jax::PoolStats stats = flatmem_jax::pool_stats();
  if (handles != nullptr) *handles = stats.handles;
  if (cached_backwards != nullptr) *cached_backwards = stats.cached_backwards;
  if (cached_backwards_on_forward_handle != nullptr)
    *cached_backwards_on_forward_handle = stats.cached_backwards_on_forward_handle;
}

int flatmem_jax_comm_create_from_env(int64_t timeout_ms, int64_t connect_timeout_ms,
                                     int64_t *slot, char *message, size_t message_size) {
  flatmem_comm_options options;
  flatmem_status status = flatmem_comm_options_init(&options, sizeof(flatmem_comm_options));
  flatmem_comm_t *comm = nullptr;
  if (status == FLATMEM_STATUS_SUCCESS) {
    options.timeout_ms = timeout_ms;
    options.connect_timeout_ms = connect_timeout_ms;
    status = flatmem_comm_create_from_env(&comm, &options);
  }
  if (status != FLATMEM_STATUS_SUCCESS) {
    write_message(status, message, message_size);
    return status;
  }
  try {
    *slot = flatmem_jax::register_comm(comm);
  } catch (...) {
    flatmem_comm_abort(comm);
    write_message(FLATMEM_STATUS_OUT_OF_MEMORY, "no memory to register the communicator", message,
                  message_size);
    return FLATMEM_STATUS_OUT_OF_MEMORY;
  }
  return FLATMEM_STATUS_SUCCESS;
}

int flatmem_jax_comm_rank(int64_t slot, int32_t *rank, int32_t *world_size, char *message,
                          size_t message_size) {
  return with_comm(slot, message, message_size, [&](flatmem_comm_t *comm) {
    flatmem_status status = flatmem_comm_rank(comm, rank);
    return status == FLATMEM_STATUS_SUCCESS ? flatmem_comm_world_size(comm, world_size) : status;
  });
}

int flatmem_jax_comm_health(int64_t slot, char *message, size_t message_size) {
  return with_comm(slot, message, message_size,
                   [](flatmem_comm_t *comm) { return flatmem_comm_health(comm); });
}

int flatmem_jax_comm_barrier(int64_t slot, int64_t timeout_ms, char *message,
                             size_t message_size) {
  return with_comm(slot, message, message_size, [&](flatmem_comm_t *comm) {
    return flatmem_comm_barrier(comm, timeout_ms);
  });
}

int flatmem_jax_comm_init_device(int64_t slot, int32_t cuda_device, int64_t timeout_ms, char *message,
                                 size_t message_size) {
  return with_comm(slot, message, message_size, [&](flatmem_comm_t *comm) {
    return flatmem_comm_init_device(comm, cuda_device, timeout_ms);
  });
}

int flatmem_jax_comm_close(int64_t slot, int abort, char *message, size_t message_size) {
  std::string text;
  const flatmem_status status = flatmem_jax::close_comm(slot, abort != 0, text);
  if (status != FLATMEM_STATUS_SUCCESS) write_message(status, text.c_str(), message, message_size);
  return status;
}

}  // extern "C"
