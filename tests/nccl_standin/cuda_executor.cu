#include "nccl_standin/cuda_executor.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace nccl_standin {
namespace {

void check(cudaError_t status, const char *call) {
  if (status == cudaSuccess) return;
  cudaGetLastError();
  throw std::runtime_error(std::string("NCCL stand-in: ") + call + " failed: " + cudaGetErrorString(status));
}

cudaStream_t as_stream(void *stream) { return static_cast<cudaStream_t>(stream); }
cudaEvent_t as_event(Token token) { return static_cast<cudaEvent_t>(token); }

// Element sums; the 16-bit floats add in float and round once, as NCCL's do.
template <typename T>
__device__ T plus(T a, T b) { return a + b; }
template <>
__device__ __half plus(__half a, __half b) { return __float2half(__half2float(a) + __half2float(b)); }
template <>
__device__ __nv_bfloat16 plus(__nv_bfloat16 a, __nv_bfloat16 b) {
  return __float2bfloat16(__bfloat162float(a) + __bfloat162float(b));
}

template <typename T>
__global__ void add_kernel(T *dst, const T *src, std::size_t count) {
  const std::size_t stride = std::size_t(gridDim.x) * blockDim.x;
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride)
    dst[i] = plus(dst[i], src[i]);
}

template <typename T>
void launch_add(void *dst, const void *src, std::size_t count, cudaStream_t stream) {
  constexpr unsigned threads = 256;
  const std::size_t blocks = (count + threads - 1) / threads;
  add_kernel<T><<<unsigned(blocks < 1024 ? blocks : 1024), threads, 0, stream>>>(static_cast<T *>(dst),
                                                                                 static_cast<const T *>(src), count);
  check(cudaGetLastError(), "the all-reduce's add kernel launch");
}

}  // namespace

Token CudaExecutor::mark(void *stream) {
  cudaEvent_t event = nullptr;
  check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreateWithFlags");
  if (const cudaError_t status = cudaEventRecord(event, as_stream(stream)); status != cudaSuccess) {
    cudaEventDestroy(event);
    check(status, "cudaEventRecord");
  }
  return event;
}

void CudaExecutor::wait(void *stream, Token token) {
  check(cudaStreamWaitEvent(as_stream(stream), as_event(token), 0), "cudaStreamWaitEvent");
}

void CudaExecutor::release(Token token) { check(cudaEventDestroy(as_event(token)), "cudaEventDestroy"); }

void CudaExecutor::copy(void *dst, const void *src, std::size_t bytes, void *stream) {
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, as_stream(stream)), "cudaMemcpyAsync");
}

void *CudaExecutor::stage(const void *src, std::size_t bytes, void *stream) {
  void *staged = nullptr;
  check(cudaMallocAsync(&staged, bytes, as_stream(stream)), "cudaMallocAsync (a staged send)");
  if (const cudaError_t status = cudaMemcpyAsync(staged, src, bytes, cudaMemcpyDeviceToDevice, as_stream(stream));
      status != cudaSuccess) {
    cudaFreeAsync(staged, as_stream(stream));
    check(status, "cudaMemcpyAsync (a staged send)");
  }
  return staged;
}

void CudaExecutor::drop(void *staged, void *stream) {
  check(cudaFreeAsync(staged, as_stream(stream)), "cudaFreeAsync (a staged send)");
}

Executor &library_executor() {
  static CudaExecutor cuda;
  return cuda;
}

void CudaExecutor::add(void *dst, const void *src, std::size_t count, ElementType type, void *stream) {
  const cudaStream_t s = as_stream(stream);
  switch (type) {
    case ElementType::i8: return launch_add<std::int8_t>(dst, src, count, s);
    case ElementType::u8: return launch_add<std::uint8_t>(dst, src, count, s);
    case ElementType::i32: return launch_add<std::int32_t>(dst, src, count, s);
    case ElementType::u32: return launch_add<std::uint32_t>(dst, src, count, s);
    case ElementType::i64: return launch_add<std::int64_t>(dst, src, count, s);
    case ElementType::u64: return launch_add<std::uint64_t>(dst, src, count, s);
    case ElementType::f16: return launch_add<__half>(dst, src, count, s);
    case ElementType::bf16: return launch_add<__nv_bfloat16>(dst, src, count, s);
    case ElementType::f32: return launch_add<float>(dst, src, count, s);
    case ElementType::f64: return launch_add<double>(dst, src, count, s);
  }
}

}  // namespace nccl_standin
