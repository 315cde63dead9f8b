#include "cyclic/cuda/kernels.hpp"

#include <algorithm>

#include "core/cuda/device.hpp"

namespace flatmem::cyclic::device {
namespace {

using flatmem::cuda::check_launch;

constexpr int threads = 256;

unsigned blocks_for(std::size_t count) {
  return unsigned(std::min<std::size_t>((count + threads - 1) / threads, 65535));
}

template <typename T>
__global__ void add_kernel(T *__restrict__ into, const T *__restrict__ from, std::size_t n) {
  const std::size_t stride = std::size_t(gridDim.x) * blockDim.x;
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    into[i] = into[i] + from[i];
}

template <typename T>
__global__ void scale_kernel(T *__restrict__ data, std::size_t n, T factor) {
  const std::size_t stride = std::size_t(gridDim.x) * blockDim.x;
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    data[i] = data[i] * factor;
}

template <typename T>
__global__ void nonfinite_kernel(const T *__restrict__ data, std::size_t n, unsigned long long *first) {
  const std::size_t stride = std::size_t(gridDim.x) * blockDim.x;
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    // The plain read filters: an all-NaN buffer does not serialise on the atomic.
    if (!isfinite(data[i]) && (unsigned long long)i < *(volatile unsigned long long *)first)
      atomicMin(first, (unsigned long long)i);
}

struct Words {
  unsigned long long w[4];
};

__global__ void words_kernel(unsigned long long *dst, Words words) {
  if (threadIdx.x < 4) dst[threadIdx.x] = words.w[threadIdx.x];
}

}  // namespace

void write_words(void *dst, const unsigned long long (&words)[4], cudaStream_t stream) {
  const Words w{{words[0], words[1], words[2], words[3]}};
  words_kernel<<<1, 32, 0, stream>>>(static_cast<unsigned long long *>(dst), w);
  check_launch(cudaGetLastError(), "cyclic stages: header kernel");
}

void add(bool f64, void *into, const void *from, std::size_t count, cudaStream_t stream) {
  if (count == 0) return;
  if (f64)
    add_kernel<double><<<blocks_for(count), threads, 0, stream>>>(static_cast<double *>(into),
                                                                  static_cast<const double *>(from), count);
  else
    add_kernel<float><<<blocks_for(count), threads, 0, stream>>>(static_cast<float *>(into),
                                                                 static_cast<const float *>(from), count);
  check_launch(cudaGetLastError(), "cyclic device chain: add kernel");
}

void scale_to_average(bool f64, void *data, std::size_t count, long long n, cudaStream_t stream) {
  if (count == 0) return;
  // The factor as the host forms it: 1/n in double, rounded once to the element type.
  const double factor = 1.0 / double(n);
  if (f64)
    scale_kernel<double><<<blocks_for(count), threads, 0, stream>>>(static_cast<double *>(data), count, factor);
  else
    scale_kernel<float><<<blocks_for(count), threads, 0, stream>>>(static_cast<float *>(data), count,
                                                                   float(factor));
  check_launch(cudaGetLastError(), "cyclic device chain: average kernel");
}

void first_nonfinite(bool f64, const void *data, std::size_t count, unsigned long long *first,
                     cudaStream_t stream) {
  if (count == 0) return;
  if (f64)
    nonfinite_kernel<double><<<blocks_for(count), threads, 0, stream>>>(static_cast<const double *>(data), count,
                                                                        first);
  else
    nonfinite_kernel<float><<<blocks_for(count), threads, 0, stream>>>(static_cast<const float *>(data), count,
                                                                       first);
  check_launch(cudaGetLastError(), "cyclic device chain: non-finite scan kernel");
}

}  // namespace flatmem::cyclic::device
