// Work distribution inside a block callback: context->parallel_for with a
// partition fixed by the shapes alone (row slabs, (batch, head) pairs, column
// slabs of a parameter gradient), never by the thread count, so that every
// output element is computed by the same calls in the same order whatever
// the number of threads. Thread indices only pick per-thread scratch.
#pragma once

#include <flatmem/flatmem.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace flatmem::blocks::cpu {

// Rows per item of token-wise work (LayerNorm, bias, GELU) and of the GEMMs
// that produce activations; columns per item of a parameter-gradient GEMM.
constexpr std::int64_t slab_rows = 64;
constexpr std::int64_t slab_cols = 64;

inline std::int64_t slab_count(std::int64_t n, std::int64_t slab) { return (n + slab - 1) / slab; }

// [begin, end) of slab `i` of `n` things cut into pieces of `slab`.
struct Range {
  std::int64_t begin, end;
  std::int64_t size() const { return end - begin; }
};
inline Range slab_range(std::int64_t i, std::int64_t n, std::int64_t slab) {
  return {i * slab, std::min(n, (i + 1) * slab)};
}

class Parallel {
 public:
  // context may be NULL or have no parallel_for: everything runs on the
  // calling thread (thread 0).
  explicit Parallel(const flatmem_reversible_context *context)
      : context_(context && context->parallel_for ? context : nullptr),
        threads_(context_ ? std::max<std::int32_t>(1, context->num_threads) : 1) {}

  int threads() const { return threads_; }

  // body(item, thread) for item in [0, items); body must not throw.
  template <typename Body>
  void run(std::int64_t items, Body &&body) const {
    using B = std::remove_reference_t<Body>;
    if (items <= 0) return;
    if (context_ == nullptr || threads_ == 1 || items == 1) {
      for (std::int64_t i = 0; i < items; ++i) body(i, 0);
      return;
    }
    context_->parallel_for(
        context_, items,
        [](void *arg, std::int64_t item, std::int32_t thread) { (*static_cast<B *>(arg))(item, thread); },
        const_cast<void *>(static_cast<const void *>(&body)));
  }

 private:
  const flatmem_reversible_context *context_;
  int threads_;
};

// The parameter-gradient phase of a VJP: task k owns columns[k] output
// columns, cut into slabs of slab_cols; every (task, slab) pair is one item
// (a GEMM over all rows for that slab), all tasks in one parallel_for.
// body(task, Range columns).
template <std::size_t N, typename Body>
void run_column_slabs(const Parallel &parallel, const std::array<std::int64_t, N> &columns,
                      Body &&body) {
  std::array<std::int64_t, N + 1> first{};
  for (std::size_t k = 0; k < N; ++k) first[k + 1] = first[k] + slab_count(columns[k], slab_cols);
  parallel.run(first[N], [&](std::int64_t item, int) {
    std::size_t k = 0;
    while (item >= first[k + 1]) ++k;
    body(k, slab_range(item - first[k], columns[k], slab_cols));
  });
}

}  // namespace flatmem::blocks::cpu
