// Host-side CUDA runtime helpers shared by the CUDA code of the library (the
// contrastive backend, the reversible executor, the NCCL device transport):
// the device a call runs on, checks that a pointer really is device memory of
// that device, and CUDA errors turned into flatmem errors. None of them
// synchronises.
#pragma once

#include <cuda_runtime_api.h>

namespace flatmem::cuda {

// Makes `device` current for the guard's lifetime (restores the caller's).
// `name` is the argument the device id came from, for the message when it
// cannot be made current.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device, const char *name = "q");
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard &) = delete;
  DeviceGuard &operator=(const DeviceGuard &) = delete;

 private:
  int previous_ = -1;
};

// Fails (INVALID_ARGUMENT, naming `name`) unless p points to device or
// managed memory that belongs to `device`; UNSUPPORTED when no CUDA device
// can be used in this process (no driver, none installed, a stub library).
void check_device_pointer(const void *p, const char *name, int device);

// Streaming multiprocessors of `device` (a host attribute query).
int multiprocessor_count(int device);

// The major compute capability of `device` (9 on Hopper; a host attribute query).
int compute_capability_major(int device);

// The one check of a CUDA runtime call's status in the library: unless it is
// cudaSuccess, clears the (non-sticky) last error and throws
// FLATMEM_STATUS_OUT_OF_MEMORY for a failed allocation, FLATMEM_STATUS_INTERNAL
// otherwise, "<what>: <CUDA error text>".
void check_launch(cudaError_t status, const char *what);

}  // namespace flatmem::cuda
