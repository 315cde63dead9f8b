// Per-call device scratch of the CUDA blocks, stream-ordered: taken with
// cudaMallocAsync on the call's stream from the device's current memory pool
// and given back with cudaFreeAsync on that stream, so it is reused only
// after the stream has passed the call's last use. It also holds the
// call's cuBLASLt workspace.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "core/workspace.hpp"
#include "reversible/blocks/cuda/blocks.hpp"
#include "reversible/blocks/cuda/matmul.hpp"

namespace flatmem::blocks::cuda {

class CallScratch {
 public:
  // carve(WorkspaceCarver &) takes the call's regions; it runs twice, to
  // measure and then to point the regions into the allocation.
  template <typename Carve>
  CallScratch(const DeviceCall &call, Carve &&carve) : stream_(call.stream) {
    // The cuBLASLt workspace comes first, at the allocation's start: cublasLtMatmul refuses one
    // that is not 256-byte aligned (CUBLAS_STATUS_INVALID_VALUE, seen on an H200), and the
    // carver aligns later regions to 64 bytes only. cudaMallocAsync's pointers are 256-aligned.
    WorkspaceCarver measure;
    measure.take<char>(std::int64_t(matmul_workspace_bytes));
    carve(measure);
    allocate(call, measure.bytes());
    WorkspaceCarver regions(data_);
    matmul_.device = call.device;
    matmul_.tf32 = call.tf32;
    matmul_.stream = call.stream;
    matmul_.workspace = regions.take<char>(std::int64_t(matmul_workspace_bytes));
    matmul_.workspace_bytes = matmul_workspace_bytes;
    carve(regions);
  }
  ~CallScratch();
  CallScratch(const CallScratch &) = delete;
  CallScratch &operator=(const CallScratch &) = delete;

  const MatmulContext &matmul() const { return matmul_; }

 private:
  void allocate(const DeviceCall &call, std::size_t bytes);

  cudaStream_t stream_;
  void *data_ = nullptr;
  MatmulContext matmul_;
};

}  // namespace flatmem::blocks::cuda
