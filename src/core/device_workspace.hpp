// Device memory a handle keeps for itself (the ring loss on CUDA tensors,
// whose transit buffers depend on the other ranks' shapes, so the caller
// cannot size a workspace): grown on demand with cudaMalloc, released by the
// destructor. Builds without the CUDA backend never allocate (resolve throws
// UNSUPPORTED), so this header carries no CUDA types.
#pragma once

#include <cstddef>

namespace flatmem {

class DeviceWorkspace {
 public:
  DeviceWorkspace() = default;
  ~DeviceWorkspace();
  DeviceWorkspace(const DeviceWorkspace &) = delete;
  DeviceWorkspace &operator=(const DeviceWorkspace &) = delete;

  // At least `bytes` of memory on CUDA device `device` (256-byte aligned);
  // the previous contents are lost when it grows or the device changes.
  // Synchronises the device before freeing a smaller buffer (work queued on
  // it may still use it). Throws OUT_OF_MEMORY.
  void *resolve(int device, std::size_t bytes);
  std::size_t bytes() const { return bytes_; }

 private:
  void release() noexcept;
  void *data_ = nullptr;
  std::size_t bytes_ = 0;
  int device_ = -1;
};

}  // namespace flatmem
