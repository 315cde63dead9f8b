// A process-wide pool of flatmem contrastive handles, one list per loss kind,
// device kind, logit-cache budget and options.fp32_precision: handles for CUDA buffers are created
// with FLATMEM_NONFINITE_PROPAGATE (flatmem refuses its default NaN scan on
// device tensors, which would need a host round trip); CPU handles keep the
// default scan. A handle made with options.logit_cache_bytes = B keeps up to
// B bytes of logit tiles from its last forward (flatmem.h, "Logit cache"), so
// calls with different budgets never share a handle: a call without a budget
// never fills, or makes the process hold, a cache it did not ask for.
// flatmem's thread rule is "one thread per handle at a time", and XLA may run
// two custom calls concurrently, so each call borrows a handle for its
// duration (PooledHandle) and gives it back; a new handle is created only when
// all are busy. Handles are never destroyed: destroying joins worker threads,
// which a static destructor at process exit must not do (a cache, min(B, 4 b c)
// bytes once filled, is held with its handle until the process exits).
//
// Cache hits. A backward reads the cached tiles only on the handle whose last
// forward saw the same q and k (flatmem checks a fingerprint of their
// contents; any other handle recomputes, which is correct, only slower). So
// each idle handle remembers the data addresses of the q and k of its last
// successful forward, and a call that names its q and k takes an idle handle
// that remembers them (XLA hands the backward the very buffers the forward
// read: jit keeps the residuals alive between the two), else the one given
// back last. A forward followed by its backward hits whenever no other forward
// of the same pool runs in between on that handle (serial training steps,
// eager calls); interleaved pairs (F1 F2 B2 B1 with one handle, vmap's
// sequential loop) hit for the last forward only.
#pragma once

#include <flatmem/flatmem.h>

#include <cstddef>
#include <cstdint>

namespace flatmem_jax {

// num_threads every pooled handle is created with: $FLATMEM_JAX_NUM_THREADS
// read at first use (unset or empty: 0, i.e. all online processors; text that
// is not an integer: -1, which flatmem then refuses with its own message).
int pool_num_threads();

// What the pool keys its handles by (CUDA handles take 0 as the budget:
// flatmem's CUDA backend neither fills nor reads the cache). fp32_precision is
// the handles' options.fp32_precision (a flatmem_fp32_precision value; a key
// with any other makes no handle: flatmem_contrastive_create refuses it).
struct PoolKey {
  flatmem_contrastive_loss loss;
  bool cuda;
  std::size_t logit_cache_bytes;
  std::int64_t fp32_precision = FLATMEM_FP32_PRECISION_DEFAULT;
};

// The data addresses of a call's q and k (NULL: no preference).
struct Inputs {
  const void *q = nullptr;
  const void *k = nullptr;
  bool operator==(const Inputs &o) const { return q == o.q && k == o.k; }
};

class PooledHandle {
 public:
  // Borrows an idle handle of `key` -- one whose last forward read `inputs`
  // when there is one -- or creates one.
  explicit PooledHandle(const PoolKey &key, Inputs inputs = {});
  ~PooledHandle();
  PooledHandle(const PooledHandle &) = delete;
  PooledHandle &operator=(const PooledHandle &) = delete;

  // SUCCESS, or the status of the failed flatmem_contrastive_create (the
  // thread's flatmem_last_error() then holds its message).
  flatmem_status status() const { return status_; }
  flatmem_contrastive_t *get() const { return handle_; }
  // True when the handle's last forward read the inputs this call named.
  bool found_inputs() const { return found_; }

  // After a forward on this handle: what it read (success) or nothing
  // (failure: flatmem dropped the cache); the handle remembers it when given back.
  void forward_done(bool ok, Inputs inputs) { last_ = ok ? inputs : Inputs{}; }

 private:
  PoolKey key_;
  flatmem_contrastive_t *handle_ = nullptr;
  Inputs last_;  // what this handle's last forward read
  bool found_ = false;
  flatmem_status status_ = FLATMEM_STATUS_SUCCESS;
};

// Counters for the tests (flatmem_jax_contrastive_pool_stats): pooled
// handles made; backward calls with a logit cache, and how many of them got
// the handle whose last forward read their q and k.
struct PoolStats {
  std::int64_t handles, cached_backwards, cached_backwards_on_forward_handle;
};
PoolStats pool_stats();
void count_cached_backward(bool on_forward_handle);

}  // namespace flatmem_jax
