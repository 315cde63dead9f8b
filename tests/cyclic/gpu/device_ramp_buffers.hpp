// What the GPU tests of the cyclic handles share: device buffers for the
// ramp runs (tests/cyclic/ramp_run.hpp's RampBuffers on cudaMalloc'ed
// memory), the CUDA status check, bitwise comparison (the device count of
// the multi-rank cases: support/gpu.hpp device_ranks).
#pragma once

#include <cuda_runtime_api.h>
#include <dlpack/dlpack.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "cyclic/ramp_run.hpp"
#include "support/gpu.hpp"

namespace test {

inline void cuda_check(cudaError_t status, const char *what) {
  if (status != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}

inline bool has(const std::string &text, const std::string &part) { return text.find(part) != std::string::npos; }

template <typename T>
bool same_bits(const std::vector<T> &a, const std::vector<T> &b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

// Two cudaMalloc'ed gradient buffers per stage on `device`; write / read are
// synchronous copies on the legacy default stream (flatmem_cyclic_reduce's
// NULL stream, so the hand-over is ordered after the write).
template <typename T>
class DeviceRampBuffers final : public RampBuffers<T> {
 public:
  DeviceRampBuffers(int stages, int device) {
    cuda_check(cudaSetDevice(device), "cudaSetDevice");
    buffers_.reserve(std::size_t(2 * stages));
    shapes_.resize(std::size_t(2 * stages));
    tensors_.resize(std::size_t(2 * stages));
    for (int j = 0; j < stages; ++j)
      for (int p = 0; p < 2; ++p) {
        const std::size_t k = index(j, p);
        shapes_[k] = ramp_size(j);
        buffers_.emplace_back(std::size_t(shapes_[k]) * sizeof(T));
        DLTensor &t = tensors_[k];
        t.data = buffers_[k].data();
        t.device = {kDLCUDA, device};
        t.ndim = 1;
        t.dtype = {kDLFloat, std::uint8_t(8 * sizeof(T)), 1};
        t.shape = &shapes_[k];
      }
  }
  DLTensor *tensor(int stage, int parity) override { return &tensors_[index(stage, parity)]; }
  void write(int stage, int parity, const std::vector<T> &values) override {
    const std::size_t k = index(stage, parity);
    if (values.size() != std::size_t(shapes_[k])) throw std::runtime_error("DeviceRampBuffers::write: size");
    cuda_check(cudaMemcpy(buffers_[k].data(), values.data(), values.size() * sizeof(T), cudaMemcpyHostToDevice),
               "cudaMemcpy to the buffer");
  }
  std::vector<T> read(int stage, int parity) override {
    const std::size_t k = index(stage, parity);
    std::vector<T> values(static_cast<std::size_t>(shapes_[k]));
    cuda_check(cudaMemcpy(values.data(), buffers_[k].data(), values.size() * sizeof(T), cudaMemcpyDeviceToHost),
               "cudaMemcpy from the buffer");
    return values;
  }

 private:
  static std::size_t index(int stage, int parity) { return std::size_t(2 * stage + parity); }
  std::vector<flatmem_test::DeviceBuffer> buffers_;
  std::vector<std::int64_t> shapes_;
  std::vector<DLTensor> tensors_;
};

}  // namespace test
