// A failed CUDA runtime call of the cyclic runtimes' device code:
// OUT_OF_MEMORY for an allocation, INTERNAL otherwise, naming what it was.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "core/error.hpp"

namespace flatmem::cyclic {

inline void check_cuda(cudaError_t status, const std::string &what) {
  if (status == cudaSuccess) return;
  cudaGetLastError();  // not sticky: do not let the next launch check report it
  fail(status == cudaErrorMemoryAllocation ? FLATMEM_STATUS_OUT_OF_MEMORY : FLATMEM_STATUS_INTERNAL,
       "cyclic device memory: ", what, ": ", cudaGetErrorString(status));
}

}  // namespace flatmem::cyclic
