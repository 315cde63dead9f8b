// A chain of execution on the CPU: the thread that drives it plus the
// workers of its pool. Callbacks reach the pool through
// flatmem_reversible_context.parallel_for; the executor uses it for the
// element-wise steps of the reversible recurrences.
#pragma once

#include <cstdint>

#include "core/thread_pool.hpp"
#include "reversible/state.hpp"

namespace flatmem::reversible::cpu {

class Chain {
 public:
  explicit Chain(int threads) : pool_(threads) {}
  int threads() const { return pool_.size(); }
  ThreadPool &pool() { return pool_; }

  // y = a + y   (Y1 = X1 + F(X2) with F(X2) already in y)
  void add_into(const StateLayout &s, const void *a, void *y);
  // y = a - y   (X2 = Y2 - G(Y1) with G(Y1) already in y)
  void subtract_from(const StateLayout &s, const void *a, void *y);
  void copy(const StateLayout &s, const void *from, void *to);

 private:
  template <typename Op>
  void elementwise(const StateLayout &s, Op op);
  ThreadPool pool_;
};

}  // namespace flatmem::reversible::cpu
