// The helpers of flatmem_jax.h that are not handlers: versions, whether the
// CUDA handlers are in, the workspace query the Python module calls at
// trace time to size the CPU handlers' workspace result, and the contrastive
// pool's counters.
#include <cstdio>

#include "flatmem_jax.h"
#include "handle_pool.hpp"

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

void write_message(flatmem_status status, char *message, size_t message_size) {
  if (message == nullptr || message_size == 0) return;
  std::snprintf(message, message_size, "%s: %s", flatmem_status_string(status),
                flatmem_last_error());
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
  if (loss != FLATMEM_CONTRASTIVE_SYMMETRIC && loss != FLATMEM_CONTRASTIVE_INFONCE) {
    if (message != nullptr && message_size > 0)
      std::snprintf(message, message_size, "FLATMEM_STATUS_INVALID_ARGUMENT: loss: %d is neither FLATMEM_CONTRASTIVE_SYMMETRIC (1) "
                    "nor FLATMEM_CONTRASTIVE_INFONCE (2)", loss);
    return FLATMEM_STATUS_INVALID_ARGUMENT;
  }
  int64_t q_shape[2] = {b, dq};
  int64_t k_shape[2] = {c, dk};
  const DLTensor q = shape_only(dlpack_type(q_code, q_bits), q_shape);
  const DLTensor k = shape_only(dlpack_type(k_code, k_bits), k_shape);
  // Any CPU handle of the loss answers (the logit cache is not part of the workspace).
  flatmem_jax::PooledHandle handle({static_cast<flatmem_contrastive_loss>(loss), /*cuda=*/false, 0});
  flatmem_status status = handle.status();
  if (status == FLATMEM_STATUS_SUCCESS)
    status = backward  // dq like q and dk like k: the handlers return gradients in the input dtype
                 ? flatmem_contrastive_backward_workspace_size(handle.get(), &q, &k, &q, &k, bytes)
                 : flatmem_contrastive_forward_workspace_size(handle.get(), &q, &k, bytes);
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

}  // extern "C"
