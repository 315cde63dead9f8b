#include "support/gpu.hpp"

#include <cstdio>
#include <cstdlib>

#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

namespace flatmem_test {
namespace {

void check(cudaError_t status, const char *what) {
  if (status != cudaSuccess)
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}

}  // namespace

bool cuda_device_available() {
  int count = 0;
  const bool ok = cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
  cudaGetLastError();
  return ok;
}

bool nccl_standin_selected() {
  static const bool selected = [] {
    const char *path = std::getenv("FLATMEM_NCCL_LIBRARY");
    if (path == nullptr || *path == '\0') return false;
    // flatmem opens the same file at its first init_device; the handle stays open.
    void *library = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    return library != nullptr && dlsym(library, "flatmem_nccl_standin_description") != nullptr;
  }();
  return selected;
}

int device_ranks(int most) {
  if (nccl_standin_selected()) return most;
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
  cudaGetLastError();
  return count < most ? count : most;
}

int device_of_rank(int rank) { return nccl_standin_selected() ? 0 : rank; }

DeviceBuffer::DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
  check(cudaMalloc(&data_, bytes == 0 ? 1 : bytes), "cudaMalloc");
}
DeviceBuffer::DeviceBuffer(DeviceBuffer &&other) noexcept { *this = std::move(other); }
DeviceBuffer &DeviceBuffer::operator=(DeviceBuffer &&other) noexcept {
  std::swap(data_, other.data_);
  std::swap(bytes_, other.bytes_);
  return *this;
}
DeviceBuffer::~DeviceBuffer() {
  if (data_) cudaFree(data_);
}

DeviceTensor::DeviceTensor(const HostTensor &host) : buffer_(host.byte_count()) {
  check(cudaMemcpy(buffer_.data(), host.bytes(), host.byte_count(), cudaMemcpyHostToDevice),
        "cudaMemcpy to device");
  tensor_ = *host.dl();
  tensor_.data = buffer_.data();
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  tensor_.device = {kDLCUDA, device};
  for (int i = 0; i < tensor_.ndim && i < 2; ++i) shape_[i] = host.dl()->shape[i];
  tensor_.shape = tensor_.ndim > 0 ? shape_ : nullptr;
  if (host.dl()->strides) {
    for (int i = 0; i < tensor_.ndim && i < 2; ++i) strides_[i] = host.dl()->strides[i];
    tensor_.strides = strides_;
  }
}

DeviceTensor &DeviceTensor::operator=(DeviceTensor &&other) noexcept {
  buffer_ = std::move(other.buffer_);
  tensor_ = other.tensor_;
  std::memcpy(shape_, other.shape_, sizeof shape_);
  std::memcpy(strides_, other.strides_, sizeof strides_);
  if (tensor_.shape) tensor_.shape = shape_;
  if (tensor_.strides) tensor_.strides = strides_;
  return *this;
}

void DeviceTensor::download(HostTensor &host) const {
  device_synchronize();
  std::vector<unsigned char> bytes(host.byte_count());
  check(cudaMemcpy(bytes.data(), buffer_.data(), bytes.size(), cudaMemcpyDeviceToHost),
        "cudaMemcpy to host");
  std::memcpy(const_cast<unsigned char *>(host.bytes()), bytes.data(), bytes.size());
}

void device_synchronize() { check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

void skip_this_case(const std::string &why) {
  std::printf("skipped: %s\n", why.c_str());
  std::fflush(stdout);
  std::exit(skip_return_code);
}

}  // namespace flatmem_test
