#include "reversible/cuda/stream_chain.hpp"

#include <algorithm>

#include "core/cuda/device.hpp"
#include "core/error.hpp"

namespace flatmem::reversible::cuda {
namespace {

using flatmem::cuda::check_launch;
using flatmem::cuda::DeviceGuard;

// y = a + sign * y, grid-stride.
template <typename T>
__global__ void combine_kernel(const T *__restrict__ a, T *__restrict__ y, long long n, T sign) {
  const long long stride = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    y[i] = a[i] + sign * y[i];
}

void combine(const StateLayout &s, cudaStream_t stream, int device, const void *a, void *y,
             int sign, const char *what) {
  DeviceGuard guard(device);
  constexpr int threads = 256;
  const long long blocks = std::min<long long>((s.elements + threads - 1) / threads, 65535);
  if (s.real == Real::f32)
    combine_kernel<float><<<unsigned(blocks), threads, 0, stream>>>(
        static_cast<const float *>(a), static_cast<float *>(y), s.elements, float(sign));
  else
    combine_kernel<double><<<unsigned(blocks), threads, 0, stream>>>(
        static_cast<const double *>(a), static_cast<double *>(y), s.elements, double(sign));
  check_launch(cudaGetLastError(), what);
}

void run_serially(const flatmem_reversible_context *, std::int64_t items,
                  void (*body)(void *, std::int64_t, std::int32_t), void *arg) {
  if (body == nullptr) return;
  for (std::int64_t i = 0; i < items; ++i) body(arg, i, 0);
}

void free_device(char *p) { cudaFree(p); }

}  // namespace

void StreamChain::add_into(const StateLayout &s, const void *a, void *y) {
  combine(s, stream_, device_, a, y, +1, "reversible: add kernel");
}

void StreamChain::subtract_from(const StateLayout &s, const void *a, void *y) {
  combine(s, stream_, device_, a, y, -1, "reversible: subtract kernel");
}

void StreamChain::copy(const StateLayout &s, const void *from, void *to) {
  if (from == to) return;
  DeviceGuard guard(device_);
  check_launch(cudaMemcpyAsync(to, from, s.bytes(), cudaMemcpyDeviceToDevice, stream_),
               "reversible: state copy");
}

void StreamChain::describe(flatmem_reversible_context &context) {
  context.num_threads = 1;
  context.stream = stream_;
  context.parallel_for = run_serially;
  context.internal = this;
}

ChainBuffer StreamChain::allocate(std::size_t bytes, const char *what) {
  DeviceGuard guard(device_);
  void *p = nullptr;
  if (cudaMalloc(&p, std::max<std::size_t>(bytes, 1)) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free allocation error
    fail(FLATMEM_STATUS_OUT_OF_MEMORY, what, ": could not allocate ", bytes,
         " bytes on CUDA device ", device_);
  }
  return ChainBuffer(static_cast<char *>(p), free_device);
}

}  // namespace flatmem::reversible::cuda
