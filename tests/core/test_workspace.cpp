// The workspace carver (src/core/workspace.hpp): the one place where the
// regions of every workspace are summed, so the size arithmetic of all of
// them is checked here: alignment, the measured total, and sizes that
// overflow or wrapped negative before they arrived (refused, never 0).
#include <doctest/doctest.h>

#include <cstdint>
#include <limits>
#include <vector>

#include "core/workspace.hpp"

using flatmem::WorkspaceCarver;

TEST_CASE("core/workspace/regions are aligned, disjoint and inside the measured size") {
  const std::int64_t counts[] = {1, 0, 7, 64, 3, 1000};
  WorkspaceCarver measure;
  for (std::int64_t n : counts) measure.take<float>(n);
  const std::size_t bytes = measure.bytes();
  std::vector<unsigned char> buffer(bytes + WorkspaceCarver::alignment);
  for (std::size_t shift = 0; shift < WorkspaceCarver::alignment; shift += 7) {  // any base alignment
    // The caller's workspace: exactly the measured bytes, from base on.
    unsigned char *base = buffer.data() + shift;
    WorkspaceCarver carver(base);
    const unsigned char *end = base + bytes;
    const unsigned char *previous_end = base;
    for (std::int64_t n : counts) {
      const auto *region = reinterpret_cast<const unsigned char *>(carver.take<float>(n));
      CHECK(reinterpret_cast<std::uintptr_t>(region) % WorkspaceCarver::alignment == 0);
      CHECK(region >= previous_end);
      previous_end = region + n * sizeof(float);
      CHECK(previous_end <= end);
    }
  }
}

TEST_CASE("core/workspace/sizes that overflow are refused") {
  WorkspaceCarver measure;
  measure.take<double>(std::numeric_limits<std::int64_t>::max() / 12);
  CHECK_THROWS_WITH_AS(measure.take<double>(std::numeric_limits<std::int64_t>::max() / 12),
                       doctest::Contains("overflow 64 bits"), flatmem::Error);
  WorkspaceCarver one;
  CHECK_THROWS_AS(one.take<double>(std::numeric_limits<std::int64_t>::max() / 4), flatmem::Error);
}

TEST_CASE("core/workspace/a size that wrapped negative is refused, not taken as 0") {
  // A size_t above 2^63 cast to int64_t, as block_bytes() results are.
  const std::size_t huge = std::size_t(1) << 63 | 448;
  WorkspaceCarver measure;
  CHECK_THROWS_WITH_AS(measure.take<char>(static_cast<std::int64_t>(huge)), doctest::Contains("overflowed"),
                       flatmem::Error);
  CHECK(measure.bytes() == WorkspaceCarver::alignment);  // nothing taken
}
