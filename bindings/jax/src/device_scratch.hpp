// Device memory for one CUDA handler call: XLA's ScratchAllocator first (memory XLA accounts
// for, freed stream-ordered after the handler); where XLA has none to give -- seen on an H200
// with jax 0.11.2, whose scratch allocator returned nothing for any request, 200 bytes
// included -- a stream-ordered cudaMallocAsync on XLA's stream from the device's current
// memory pool (as flatmem's built-in CUDA blocks take their scratch), released by
// cudaFreeAsync on that stream when this object goes, i.e. after the handler has enqueued
// its work: the memory is reused only once the stream has passed that work. Every use of a
// handler's workspace is ordered before the call's last work on XLA's stream (the
// reversible OVERLAPPED rebuild stream is joined to it by events), so both are safe.
// Shared by handlers_cuda.cu and reversible_cuda.cu; compiled by nvcc as C++17.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace flatmem_jax {

class DeviceScratch {
 public:
  DeviceScratch(xla::ffi::ScratchAllocator &xla, cudaStream_t stream, int32_t ordinal)
      : xla_(xla), stream_(stream), ordinal_(ordinal) {}
  ~DeviceScratch() {
    if (own_.empty()) return;
    CurrentDevice device(ordinal_);
    for (void *p : own_) cudaFreeAsync(p, stream_);
    cudaGetLastError();  // nothing to report from a destructor; keep the runtime's error clear
  }
  DeviceScratch(const DeviceScratch &) = delete;
  DeviceScratch &operator=(const DeviceScratch &) = delete;

  // `bytes` of device memory aligned to 256 bytes (cudaMallocAsync's are), or the error.
  xla::ffi::ErrorOr<void *> allocate(std::size_t bytes) {
    namespace ffi = xla::ffi;
    if (std::optional<void *> data = xla_.Allocate(bytes, 256)) return *data;
    void *data = nullptr;
    cudaError_t status;
    {
      CurrentDevice device(ordinal_);
      status = device.status != cudaSuccess ? device.status : cudaMallocAsync(&data, bytes, stream_);
    }
    if (status != cudaSuccess) {
      cudaGetLastError();
      return ffi::Unexpected(ffi::Error(
          status == cudaErrorMemoryAllocation ? ffi::ErrorCode::kResourceExhausted : ffi::ErrorCode::kInternal,
          "flatmem_jax: " + std::to_string(bytes) + " bytes of workspace on CUDA device " +
              std::to_string(ordinal_) + ": XLA's scratch allocator had none, and cudaMallocAsync on XLA's "
              "stream failed (" + cudaGetErrorString(status) + ")"));
    }
    own_.push_back(data);
    return data;
  }

 private:
  // Makes `ordinal` the current device for a scope, restoring the caller's.
  struct CurrentDevice {
    int previous = -1;
    cudaError_t status = cudaSuccess;
    explicit CurrentDevice(int32_t ordinal) {
      status = cudaGetDevice(&previous);
      if (status == cudaSuccess && previous != ordinal) status = cudaSetDevice(ordinal);
      else previous = -1;
    }
    ~CurrentDevice() {
      if (previous >= 0) cudaSetDevice(previous);
    }
  };

  xla::ffi::ScratchAllocator &xla_;
  cudaStream_t stream_;
  int32_t ordinal_;
  std::vector<void *> own_;
};

}  // namespace flatmem_jax
