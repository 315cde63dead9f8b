// A chain of execution: where one sequence of block steps runs. On the CPU a
// thread plus the workers of its pool (cpu/thread_chain.hpp); on CUDA a
// stream (cuda/stream_chain.hpp). The schedules (schedule_*.cpp) and block
// steps are written once against this interface; only the OVERLAPPED
// schedule, which joins two chains, has a version per backend.
#pragma once

#include <flatmem/flatmem.h>

#include <cstddef>
#include <memory>

#include "reversible/state.hpp"

namespace flatmem::reversible {

// Memory of a chain's device, freed by its deleter.
using ChainBuffer = std::unique_ptr<char, void (*)(char *)>;

class Chain {
 public:
  virtual ~Chain() = default;
  // y = a + y   (Y1 = X1 + F(X2) with F(X2) already in y)
  virtual void add_into(const StateLayout &s, const void *a, void *y) = 0;
  // y = a - y   (X2 = Y2 - G(Y1) with G(Y1) already in y)
  virtual void subtract_from(const StateLayout &s, const void *a, void *y) = 0;
  virtual void copy(const StateLayout &s, const void *from, void *to) = 0;
  // Fills the context fields that depend on the chain: num_threads, stream,
  // parallel_for, internal.
  virtual void describe(flatmem_reversible_context &context) = 0;
  // `bytes` of the chain's device memory (OUT_OF_MEMORY naming `what`).
  virtual ChainBuffer allocate(std::size_t bytes, const char *what) = 0;
};

}  // namespace flatmem::reversible
