// A process-wide pool of flatmem contrastive handles, one list per loss kind
// and device kind: handles for CUDA buffers are created with
// FLATMEM_NONFINITE_PROPAGATE (flatmem refuses its default NaN scan on
// device tensors, which would need a host round trip); CPU handles keep the
// default scan.
// flatmem's thread rule is "one thread per handle at a time", and XLA may run
// two custom calls concurrently, so each call borrows a handle for its
// duration (PooledHandle) and gives it back; a new handle is created only when
// all are busy. Handles are never destroyed: destroying joins worker threads,
// which a static destructor at process exit must not do.
#pragma once

#include <flatmem/flatmem.h>

namespace flatmem_jax {

// num_threads every pooled handle is created with: $FLATMEM_JAX_NUM_THREADS
// read at first use (unset or empty: 0, i.e. all online processors; text that
// is not an integer: -1, which flatmem then refuses with its own message).
int pool_num_threads();

class PooledHandle {
 public:
  PooledHandle(flatmem_contrastive_loss loss, bool cuda);
  ~PooledHandle();
  PooledHandle(const PooledHandle &) = delete;
  PooledHandle &operator=(const PooledHandle &) = delete;

  // SUCCESS, or the status of the failed flatmem_contrastive_create (the
  // thread's flatmem_last_error() then holds its message).
  flatmem_status status() const { return status_; }
  flatmem_contrastive_t *get() const { return handle_; }

 private:
  flatmem_contrastive_loss loss_;
  bool cuda_;
  flatmem_contrastive_t *handle_ = nullptr;
  flatmem_status status_ = FLATMEM_STATUS_SUCCESS;
};

}  // namespace flatmem_jax
