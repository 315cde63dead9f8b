#include "reversible/cpu/thread_chain.hpp"

#include <algorithm>
#include <cstring>
#include <new>

#include "core/error.hpp"

namespace flatmem::reversible::cpu {
namespace {

// Elements per parallel item: big enough to amortise the hand-off, small
// enough to spread a (tokens x width) state over a few threads.
constexpr std::int64_t chunk = 1 << 15;

template <typename T>
void add_range(const T *a, T *y, std::int64_t n) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) y[i] = a[i] + y[i];
}

template <typename T>
void subtract_range(const T *a, T *y, std::int64_t n) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) y[i] = a[i] - y[i];
}

}  // namespace

// op(begin, count) for fixed chunks; element-wise results do not depend on
// the split anyway.
template <typename Op>
void ThreadChain::elementwise(const StateLayout &s, Op op) {
  const std::int64_t items = (s.elements + chunk - 1) / chunk;
  pool_.run(items, [&](std::int64_t item, int) {
    const std::int64_t begin = item * chunk;
    op(begin, std::min(chunk, s.elements - begin));
  });
}

void ThreadChain::add_into(const StateLayout &s, const void *a, void *y) {
  elementwise(s, [&](std::int64_t begin, std::int64_t n) {
    if (s.real == Real::f32)
      add_range(static_cast<const float *>(a) + begin, static_cast<float *>(y) + begin, n);
    else
      add_range(static_cast<const double *>(a) + begin, static_cast<double *>(y) + begin, n);
  });
}

void ThreadChain::subtract_from(const StateLayout &s, const void *a, void *y) {
  elementwise(s, [&](std::int64_t begin, std::int64_t n) {
    if (s.real == Real::f32)
      subtract_range(static_cast<const float *>(a) + begin, static_cast<float *>(y) + begin, n);
    else
      subtract_range(static_cast<const double *>(a) + begin, static_cast<double *>(y) + begin, n);
  });
}

void ThreadChain::copy(const StateLayout &s, const void *from, void *to) {
  if (from == to) return;
  const std::size_t bytes = s.element_bytes();
  elementwise(s, [&](std::int64_t begin, std::int64_t n) {
    std::memcpy(static_cast<char *>(to) + begin * bytes,
                static_cast<const char *>(from) + begin * bytes, std::size_t(n) * bytes);
  });
}

namespace {

void run_on_pool(const flatmem_reversible_context *context, std::int64_t items,
                 void (*body)(void *, std::int64_t, std::int32_t), void *arg) {
  if (context == nullptr || body == nullptr || items <= 0) return;
  auto *chain = static_cast<ThreadChain *>(context->internal);
  chain->pool().run(items, [&](std::int64_t item, int thread) { body(arg, item, thread); });
}

void delete_host(char *p) { delete[] p; }

}  // namespace

void ThreadChain::describe(flatmem_reversible_context &context) {
  context.num_threads = threads();
  context.stream = nullptr;
  context.parallel_for = run_on_pool;
  context.internal = this;
}

ChainBuffer ThreadChain::allocate(std::size_t bytes, const char *what) {
  char *p = new (std::nothrow) char[bytes];
  if (p == nullptr) fail(FLATMEM_STATUS_OUT_OF_MEMORY, what, ": could not allocate ", bytes, " bytes");
  return ChainBuffer(p, delete_host);
}

}  // namespace flatmem::reversible::cpu
