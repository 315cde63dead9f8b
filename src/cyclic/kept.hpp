// Small pieces the data-parallel runtime (src/cyclic/) and the stage-parallel
// one (src/cyclic/stages/) share: the alignment check of a gradient they read
// as floats, the average with its factor rounded to the element type, and the
// walk over the per-time-step statistics a ring of records keeps.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "comm/communicator.hpp"
#include "core/error.hpp"

namespace flatmem::cyclic {

// A gradient both runtimes read as float / double: data + byte_offset must be
// aligned to the element size (misaligned loads are undefined behaviour).
inline void check_element_aligned(const void *data, std::size_t element, const char *name) {
  if (reinterpret_cast<std::uintptr_t>(data) % element != 0)
    invalid(name, ": data + byte_offset (", reinterpret_cast<std::uintptr_t>(data), ") is not aligned to the ",
            element, "-byte element size");
}

// data *= 1/n (count elements of `type`, f32 or f64), the factor rounded to
// the element type: every rank and both runtimes form the same bits.
inline void to_average(comm::SumType type, char *data, std::size_t count, std::int64_t n) {
  if (type == comm::SumType::f32) {
    const float factor = float(1.0 / double(n));
    float *v = reinterpret_cast<float *>(data);
    for (std::size_t i = 0; i < count; ++i) v[i] *= factor;
  } else {
    const double factor = 1.0 / double(n);
    double *v = reinterpret_cast<double *>(data);
    for (std::size_t i = 0; i < count; ++i) v[i] *= factor;
  }
}

// f(slot) for each record of `ring` still kept (the last ring.size() of the
// `begun` records written in turn, slot = index mod size) whose time_step
// lies in [first, first + count), oldest first.
template <typename Record, typename F>
void for_kept(const std::vector<Record> &ring, std::int64_t begun, std::int64_t first,
              std::int64_t count, F f) {
  const std::int64_t kept = std::min<std::int64_t>(begun, std::int64_t(ring.size()));
  for (std::int64_t i = begun - kept; i < begun; ++i) {
    const std::size_t slot = std::size_t(i) % ring.size();
    const std::int64_t t = ring[slot].time_step;
    // t - first in unsigned arithmetic: exact for t >= first, whatever `first`
    // (a caller may pass INT64_MIN); count < 0 selects nothing.
    if (t >= first && count > 0 && std::uint64_t(t) - std::uint64_t(first) < std::uint64_t(count)) f(slot);
  }
}

}  // namespace flatmem::cyclic
