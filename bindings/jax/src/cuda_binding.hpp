// What every CUDA handler binds first -- XLA's stream, the device ordinal and
// XLA's scratch allocator -- and the DLPack device of that ordinal. Shared by
// handlers_cuda.cu (contrastive loss) and reversible_cuda.cu; compiled by
// nvcc as C++17.
#pragma once

#include <cuda_runtime_api.h>
#include <flatmem/flatmem.h>

#include <cstdint>

#include "xla/ffi/api/ffi.h"

namespace flatmem_jax {

inline DLDevice cuda_device(int32_t ordinal) { return DLDevice{kDLCUDA, ordinal}; }

inline auto cuda_binding() {
  namespace ffi = xla::ffi;
  return ffi::Ffi::Bind()
      .Ctx<ffi::PlatformStream<cudaStream_t>>()
      .Ctx<ffi::DeviceOrdinal>()
      .Ctx<ffi::ScratchAllocator>();
}

}  // namespace flatmem_jax
