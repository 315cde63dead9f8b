// The body of the ring handlers, shared by the CPU handlers
// (ring_handlers.cpp) and the CUDA ones (ring_cuda.cu):
// the handle source of a ring call -- the lease of the communicator's slot
// and its ring handle (ring_registry.hpp) -- and the all-reduce.
#pragma once

#include <cstdint>
#include <optional>

#include "contrastive_call.hpp"
#include "ring_registry.hpp"

namespace flatmem_jax {

// The ring handle of (slot, loss, fp32_precision, device kind), the slot locked for the call.
class RingSource final : public HandleSource {
 public:
  // on_cuda: the CUDA handlers' handle (FLATMEM_NONFINITE_PROPAGATE, as flatmem needs for
  // kDLCUDA tensors); the CPU handlers' keeps flatmem's default (ERROR).
  RingSource(std::int64_t slot, flatmem_contrastive_loss loss, std::int64_t fp32_precision,
             bool on_cuda = false)
      : slot_(slot), loss_(loss), fp32_precision_(fp32_precision), on_cuda_(on_cuda) {}
  ffi::ErrorOr<flatmem_contrastive_t *> acquire(const void *, const void *) override;

 private:
  std::int64_t slot_;
  flatmem_contrastive_loss loss_;
  std::int64_t fp32_precision_;
  bool on_cuda_;
  std::optional<RingLease> lease_;
};

// recv = sum over the ranks of slot's communicator of send (host buffers).
ffi::Error ring_all_reduce(std::int64_t slot, const ffi::AnyBuffer &send, ffi::AnyBuffer recv);

// What the CUDA all-reduce handler returns: it sums host buffers only.
ffi::Error ring_on_cuda_unsupported(const char *what);

}  // namespace flatmem_jax
