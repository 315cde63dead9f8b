// Device-side helpers for the GPU tests (tests/contrastive/gpu): whether a
// CUDA device exists, device copies of test tensors, and the doctest main
// that turns "no device" into ctest's SKIP_RETURN_CODE.
//
// A DeviceTensor mirrors a HostTensor byte for byte (same shape, strides,
// padding) in cudaMalloc'ed memory and describes it with a kDLCUDA DLTensor;
// download() copies the device bytes back into the host tensor so that the
// host-side checks (values, padding untouched, same_bits) apply unchanged.
#pragma once

#include <dlpack/dlpack.h>

#include <cstddef>
#include <string>
#include <utility>

#include "support/tensor.hpp"

namespace flatmem_test {

/** The exit status of a GPU test without a device (CTest SKIP_RETURN_CODE). */
constexpr int skip_return_code = 77;

/** Ends this process with skip_return_code after printing "skipped: <why>": for a test case
 *  that cannot run here (e.g. it needs two GPUs), so that CTest, which runs every case in a
 *  process of its own, reports it skipped rather than passed. Run by hand without a filter,
 *  the binary stops at the first such case. */
[[noreturn]] void skip_this_case(const std::string &why);

/** Whether the CUDA runtime sees at least one device. */
bool cuda_device_available();

/** Whether FLATMEM_NCCL_LIBRARY names flatmem's NCCL stand-in (tests/nccl_standin, not NCCL):
 *  then the ranks of a multi-rank device test are threads of this process on CUDA device 0. */
bool nccl_standin_selected();

/** How many ranks a multi-rank device test can run, at most `most`: `most` over the NCCL
 *  stand-in, else one per visible CUDA device. */
int device_ranks(int most);

/** The CUDA device of rank `rank` in such a test: 0 over the NCCL stand-in, else `rank`. */
int device_of_rank(int rank);

/** cudaMalloc'ed bytes, freed by the destructor (test failure on CUDA errors). */
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes);
  DeviceBuffer(DeviceBuffer &&other) noexcept;
  DeviceBuffer &operator=(DeviceBuffer &&other) noexcept;
  DeviceBuffer(const DeviceBuffer &) = delete;
  DeviceBuffer &operator=(const DeviceBuffer &) = delete;
  ~DeviceBuffer();
  void *data() const { return data_; }
  std::size_t size() const { return bytes_; }

 private:
  void *data_ = nullptr;
  std::size_t bytes_ = 0;
};

class DeviceTensor {
 public:
  DeviceTensor() = default;
  /** A device copy of `host` (bytes and layout) on the current CUDA device. */
  explicit DeviceTensor(const HostTensor &host);
  DeviceTensor(DeviceTensor &&other) noexcept { *this = std::move(other); }
  DeviceTensor &operator=(DeviceTensor &&other) noexcept;  // re-points shape / strides
  DLTensor *dl() { return &tensor_; }
  const DLTensor *dl() const { return &tensor_; }
  /** Copies the device bytes into `host` (same layout as at construction). */
  void download(HostTensor &host) const;

 private:
  DeviceBuffer buffer_;
  DLTensor tensor_{};
  std::int64_t shape_[2] = {0, 0};
  std::int64_t strides_[2] = {0, 1};
};

/** Waits for all device work (the tests read results on the host). */
void device_synchronize();

}  // namespace flatmem_test
