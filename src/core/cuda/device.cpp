#include "core/cuda/device.hpp"

#include "core/error.hpp"

namespace flatmem::cuda {
namespace {

// A failed runtime query leaves a (non-sticky) last error behind in this
// library's CUDA runtime; clear it so that the next launch check does not
// report it.
const char *consume(cudaError_t status) {
  cudaGetLastError();
  return cudaGetErrorString(status);
}

// The statuses that say no CUDA device can be used in this process at all
// (no driver, a driver older than the runtime, no device, a stub library):
// the tensor may well be device memory elsewhere; here kDLCUDA is unsupported.
bool no_usable_cuda(cudaError_t status) {
  switch (status) {
    case cudaErrorInsufficientDriver:
    case cudaErrorNoDevice:
    case cudaErrorStubLibrary:
    case cudaErrorInitializationError:
    case cudaErrorDevicesUnavailable:
    case cudaErrorSystemNotReady:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
      return true;
    default:
      return false;
  }
}

}  // namespace

DeviceGuard::DeviceGuard(int device, const char *name) {
  int current = -1;
  cudaError_t status = cudaGetDevice(&current);
  if (status != cudaSuccess)
    fail(FLATMEM_STATUS_UNSUPPORTED, "kDLCUDA tensors: the CUDA runtime cannot be used here (",
         consume(status), ")");
  if (current != device) {
    status = cudaSetDevice(device);
    if (status != cudaSuccess)
      invalid(name, ": device id ", device, " cannot be made current (", consume(status), ")");
    previous_ = current;
  }
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0) cudaSetDevice(previous_);
}

void check_device_pointer(const void *p, const char *name, int device) {
  cudaPointerAttributes attributes{};
  const cudaError_t status = cudaPointerGetAttributes(&attributes, p);
  if (no_usable_cuda(status))
    fail(FLATMEM_STATUS_UNSUPPORTED, name, ": kDLCUDA, but no CUDA device can be used here (", consume(status),
         ")");
  if (status != cudaSuccess)
    invalid(name, ": data ", p, " is not a CUDA pointer (", consume(status), ")");
  if (attributes.type != cudaMemoryTypeDevice && attributes.type != cudaMemoryTypeManaged)
    invalid(name, ": data ", p, " is ",
            attributes.type == cudaMemoryTypeHost ? "pinned host memory" : "host memory",
            ", not device memory, although the tensor says kDLCUDA");
  if (attributes.device != device)
    invalid(name, ": data ", p, " lives on CUDA device ", attributes.device,
            " but the tensor says device id ", device);
}

namespace {
int attribute(int device, cudaDeviceAttr which) {
  int value = 0;
  const cudaError_t status = cudaDeviceGetAttribute(&value, which, device);
  if (status != cudaSuccess)
    fail(FLATMEM_STATUS_UNSUPPORTED, "q: kDLCUDA device ", device, " cannot be queried (",
         consume(status), ")");
  return value;
}
}  // namespace

int multiprocessor_count(int device) { return attribute(device, cudaDevAttrMultiProcessorCount); }

int compute_capability_major(int device) { return attribute(device, cudaDevAttrComputeCapabilityMajor); }

void check_launch(cudaError_t status, const char *what) {
  if (status == cudaSuccess) return;
  fail(status == cudaErrorMemoryAllocation ? FLATMEM_STATUS_OUT_OF_MEMORY : FLATMEM_STATUS_INTERNAL, what, ": ",
       consume(status));
}

}  // namespace flatmem::cuda
