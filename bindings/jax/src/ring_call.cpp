#include "ring_call.hpp"

#include <string>

#include "dlpack_view.hpp"

namespace flatmem_jax {

ffi::ErrorOr<flatmem_contrastive_t *> RingSource::acquire(const void *, const void *) {
  lease_.emplace(slot_);
  if (lease_->status() != FLATMEM_STATUS_SUCCESS)
    return ffi::Unexpected(
        flatmem_error(lease_->status(), "flatmem_jax ring", lease_->message().c_str()));
  flatmem_contrastive_t *handle = nullptr;
  const flatmem_status status = lease_->handle(loss_, fp32_precision_, on_cuda_, &handle);
  if (status != FLATMEM_STATUS_SUCCESS)
    return ffi::Unexpected(flatmem_error(status, "flatmem_contrastive_create"));
  return handle;
}

ffi::Error ring_all_reduce(std::int64_t slot, const ffi::AnyBuffer &send, ffi::AnyBuffer recv) {
  constexpr DLDevice cpu{kDLCPU, 0};
  ffi::ErrorOr<DLTensor> in = dlpack_view(send, cpu, "x");
  if (!in) return in.error();
  ffi::ErrorOr<DLTensor> out = dlpack_view(recv, cpu, "result");
  if (!out) return out.error();
  RingLease lease(slot);
  if (lease.status() != FLATMEM_STATUS_SUCCESS)
    return flatmem_error(lease.status(), "flatmem_jax ring", lease.message().c_str());
  const flatmem_status status =
      flatmem_comm_all_reduce(lease.comm(), &*in, &*out, /*timeout_ms=*/0, /*stream=*/nullptr);
  if (status != FLATMEM_STATUS_SUCCESS) return flatmem_error(status, "flatmem_comm_all_reduce");
  return ffi::Error::Success();
}

ffi::Error ring_on_cuda_unsupported(const char *what) {
  return ffi::Error(ffi::ErrorCode::kUnimplemented,
                    std::string("flatmem_jax: ") + what +
                        ": FLATMEM_STATUS_UNSUPPORTED: flatmem_jax's all-reduce sums host (kDLCPU) "
                        "buffers over the communicator's host transport only; put the operand on "
                        "the CPU (jax.device_put(x, jax.devices(\"cpu\")[0]))");
}

}  // namespace flatmem_jax
