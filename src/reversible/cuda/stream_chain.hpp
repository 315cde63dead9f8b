// The CUDA chain: one stream of one device. Element-wise steps are kernels
// enqueued on the stream; callbacks get the stream in their context and must
// enqueue their work there. Nothing here synchronises.
#pragma once

#include <cuda_runtime_api.h>

#include "reversible/chain.hpp"

namespace flatmem::reversible::cuda {

class StreamChain final : public Chain {
 public:
  StreamChain(int device, cudaStream_t stream) : device_(device), stream_(stream) {}
  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }

  void add_into(const StateLayout &s, const void *a, void *y) override;
  void subtract_from(const StateLayout &s, const void *a, void *y) override;
  void copy(const StateLayout &s, const void *from, void *to) override;
  void describe(flatmem_reversible_context &context) override;
  // cudaMalloc: synchronising; used only where the header says a call allocates.
  ChainBuffer allocate(std::size_t bytes, const char *what) override;

 private:
  int device_;
  cudaStream_t stream_;
};

}  // namespace flatmem::reversible::cuda
