// The CPU chain: the thread that drives it plus the workers of its pool.
// Callbacks reach the pool through flatmem_reversible_context.parallel_for.
#pragma once

#include "core/thread_pool.hpp"
#include "reversible/chain.hpp"

namespace flatmem::reversible::cpu {

class ThreadChain final : public Chain {
 public:
  explicit ThreadChain(int threads) : pool_(threads) {}
  int threads() const { return pool_.size(); }
  ThreadPool &pool() { return pool_; }

  void add_into(const StateLayout &s, const void *a, void *y) override;
  void subtract_from(const StateLayout &s, const void *a, void *y) override;
  void copy(const StateLayout &s, const void *from, void *to) override;
  void describe(flatmem_reversible_context &context) override;
  ChainBuffer allocate(std::size_t bytes, const char *what) override;

 private:
  template <typename Op>
  void elementwise(const StateLayout &s, Op op);
  ThreadPool pool_;
};

}  // namespace flatmem::reversible::cpu
