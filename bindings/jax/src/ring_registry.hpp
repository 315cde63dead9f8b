// The process's flatmem communicators, as the ring custom calls reference
// them: an XLA FFI attribute cannot carry a pointer safely (jaxlib cannot
// lower u64 attributes >= 2^63), so a call names its communicator by a small
// registry slot, the index the Python side got when the communicator was
// created (flatmem_jax_comm_create_from_env). Slots are never reused in a
// process: a slot whose communicator was destroyed stays closed, and a call
// naming it fails with a message saying so.
//
// Each slot holds the communicator and, made on first use, one ring
// contrastive handle per loss kind and options.fp32_precision (options.comm =
// the communicator). One
// mutex per slot serialises every use of them -- flatmem's thread rule is one
// thread at a time per handle and per communicator, and XLA may run two
// custom calls at once -- so a RingLease holds the slot's lock for a whole
// call. (Serialising does not order: calls are collective, and independent
// ring calls of one program must still run in the same order on every rank;
// see flatmem_jax.h.)
#pragma once

#include <flatmem/flatmem.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

namespace flatmem_jax {

struct CommSlot;

// Registers `comm` (ownership moves to the registry); returns its slot.
std::int64_t register_comm(flatmem_comm_t *comm);

// Destroys (abort = false: flatmem_comm_destroy, orderly) or aborts the
// communicator of `slot` and its ring handles, waiting for a call in progress
// on it to finish. A closed or unknown slot is INVALID_ARGUMENT; `message`
// then says why (flatmem's text otherwise).
flatmem_status close_comm(std::int64_t slot, bool abort, std::string &message);

// The slot's communicator, locked for as long as the lease lives.
class RingLease {
 public:
  explicit RingLease(std::int64_t slot);
  // SUCCESS, or INVALID_ARGUMENT with message() naming the slot.
  flatmem_status status() const { return status_; }
  const std::string &message() const { return message_; }
  flatmem_comm_t *comm() const;
  // The slot's ring handle of `loss`, `fp32_precision` and the device kind
  // (created on first use with the pool's num_threads; on_cuda: under
  // FLATMEM_NONFINITE_PROPAGATE); SUCCESS or flatmem_contrastive_create's
  // status (its message in flatmem_last_error(); a value that is no
  // flatmem_fp32_precision makes no handle).
  flatmem_status handle(flatmem_contrastive_loss loss, std::int64_t fp32_precision, bool on_cuda,
                        flatmem_contrastive_t **out);

 private:
  CommSlot *slot_ = nullptr;
  std::unique_lock<std::mutex> lock_;
  flatmem_status status_ = FLATMEM_STATUS_SUCCESS;
  std::string message_;
};

}  // namespace flatmem_jax
