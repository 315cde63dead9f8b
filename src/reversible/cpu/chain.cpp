#include "reversible/cpu/chain.hpp"

#include <algorithm>
#include <cstring>

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
void Chain::elementwise(const StateLayout &s, Op op) {
  const std::int64_t items = (s.elements + chunk - 1) / chunk;
  pool_.run(items, [&](std::int64_t item, int) {
    const std::int64_t begin = item * chunk;
    op(begin, std::min(chunk, s.elements - begin));
  });
}

void Chain::add_into(const StateLayout &s, const void *a, void *y) {
  elementwise(s, [&](std::int64_t begin, std::int64_t n) {
    if (s.real == Real::f32)
      add_range(static_cast<const float *>(a) + begin, static_cast<float *>(y) + begin, n);
    else
      add_range(static_cast<const double *>(a) + begin, static_cast<double *>(y) + begin, n);
  });
}

void Chain::subtract_from(const StateLayout &s, const void *a, void *y) {
  elementwise(s, [&](std::int64_t begin, std::int64_t n) {
    if (s.real == Real::f32)
      subtract_range(static_cast<const float *>(a) + begin, static_cast<float *>(y) + begin, n);
    else
      subtract_range(static_cast<const double *>(a) + begin, static_cast<double *>(y) + begin, n);
  });
}

void Chain::copy(const StateLayout &s, const void *from, void *to) {
  if (from == to) return;
  const std::size_t bytes = s.element_bytes();
  elementwise(s, [&](std::int64_t begin, std::int64_t n) {
    std::memcpy(static_cast<char *>(to) + begin * bytes,
                static_cast<const char *>(from) + begin * bytes, std::size_t(n) * bytes);
  });
}

}  // namespace flatmem::reversible::cpu
