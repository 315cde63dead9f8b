#include "reversible/blocks/cuda/scratch.hpp"

#include "core/error.hpp"

namespace flatmem::blocks::cuda {

void CallScratch::allocate(const DeviceCall &call, std::size_t bytes) {
  const cudaError_t status = cudaMallocAsync(&data_, bytes, stream_);
  if (status != cudaSuccess) {
    cudaGetLastError();  // not sticky: clear it for the next launch check
    data_ = nullptr;
    fail(status == cudaErrorMemoryAllocation ? FLATMEM_STATUS_OUT_OF_MEMORY : FLATMEM_STATUS_INTERNAL,
         "built-in block scratch: cudaMallocAsync of ", bytes, " bytes on CUDA device ", call.device,
         " failed (", cudaGetErrorString(status), ")");
  }
}

CallScratch::~CallScratch() {
  if (data_ != nullptr) cudaFreeAsync(data_, stream_);
}

}  // namespace flatmem::blocks::cuda
