#include "core/device_workspace.hpp"

#include "core/error.hpp"

#ifdef FLATMEM_HAVE_CUDA_BACKEND
#include <cuda_runtime_api.h>

#include "core/cuda/device.hpp"
#endif

namespace flatmem {

DeviceWorkspace::~DeviceWorkspace() { release(); }

void DeviceWorkspace::release() noexcept {
#ifdef FLATMEM_HAVE_CUDA_BACKEND
  if (data_ != nullptr) {
    int previous = -1;
    cudaGetDevice(&previous);
    cudaSetDevice(device_);
    cudaDeviceSynchronize();  // queued kernels and transfers may still use it
    cudaFree(data_);
    if (previous >= 0) cudaSetDevice(previous);
  }
#endif
  data_ = nullptr;
  bytes_ = 0;
  device_ = -1;
}

void *DeviceWorkspace::resolve(int device, std::size_t bytes) {
#ifdef FLATMEM_HAVE_CUDA_BACKEND
  if (data_ != nullptr && device == device_ && bytes <= bytes_) return data_;
  release();
  if (bytes == 0) return nullptr;
  cuda::DeviceGuard guard(device);
  void *p = nullptr;
  const cudaError_t status = cudaMalloc(&p, bytes);
  if (status != cudaSuccess) {
    cudaGetLastError();  // clear it
    fail(FLATMEM_STATUS_OUT_OF_MEMORY, "the ring's device buffers: cudaMalloc of ", bytes,
         " bytes on device ", device, " failed (", cudaGetErrorString(status), ")");
  }
  data_ = p;
  bytes_ = bytes;
  device_ = device;
  return data_;
#else
  (void)device;
  (void)bytes;
  fail(FLATMEM_STATUS_UNSUPPORTED, "device memory: this libflatmem was built without CUDA");
#endif
}

}  // namespace flatmem
