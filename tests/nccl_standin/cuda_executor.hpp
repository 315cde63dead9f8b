// The NCCL stand-in's executor on one CUDA device: markers are CUDA events,
// copies cudaMemcpyAsync on the caller's stream, staged sends in memory of
// the stream-ordered allocator (cudaMallocAsync / cudaFreeAsync), sums a
// small kernel.
// Throws std::runtime_error naming the failed CUDA call.
#pragma once

#include "nccl_standin/standin_engine.hpp"

namespace nccl_standin {

class CudaExecutor final : public Executor {
 public:
  Token mark(void *stream) override;
  void wait(void *stream, Token token) override;
  void release(Token token) override;
  void copy(void *dst, const void *src, std::size_t bytes, void *stream) override;
  void *stage(const void *src, std::size_t bytes, void *stream) override;
  void drop(void *staged, void *stream) override;
  void add(void *dst, const void *src, std::size_t count, ElementType type, void *stream) override;
};

}  // namespace nccl_standin
