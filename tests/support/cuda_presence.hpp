// The one documented answer to host memory labelled kDLCUDA, for CPU tests
// (flatmem.h, "Conventions"): UNSUPPORTED where the library cannot look at
// device memory -- built without its CUDA backend, or no usable device --
// and INVALID_ARGUMENT ("not device memory") where it can. Tests that meet
// such a tensor compute their expectation here, so that each run asserts
// exactly one status. A test built with FLATMEM_TEST_CUDA_BUILT links the
// CUDA runtime (tests/CMakeLists.txt) to ask whether a device is usable.
#pragma once

#include <flatmem/flatmem.h>

#ifdef FLATMEM_TEST_CUDA_BUILT
#include <cuda_runtime_api.h>
#endif

namespace flatmem_test {

inline bool library_can_use_a_cuda_device() {
#ifdef FLATMEM_TEST_CUDA_BUILT
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
#else
  return false;
#endif
}

inline flatmem_status status_for_host_memory_labelled_cuda() {
  return library_can_use_a_cuda_device() ? FLATMEM_STATUS_INVALID_ARGUMENT : FLATMEM_STATUS_UNSUPPORTED;
}

}  // namespace flatmem_test
