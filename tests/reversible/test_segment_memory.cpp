// Activation memory of a segment is flat in depth: the process's peak
// resident memory during forward + backward, measured by the kernel
// (support/peak_memory.hpp), at depth 4, 16 and 64 stays within 10% for
// VANILLA, OVERLAPPED and AUTO. The control: STANDARD (which stores every
// block's activations) grows with depth in the same measurement.
//
// States are 256 x 1024 fp32 (1 MiB per tensor), so the segment's buffers
// (VANILLA ~8 tensors, OVERLAPPED ~12) dwarf allocator noise. glibc is told
// to serve every allocation above 1 MiB with mmap so that freed buffers leave
// the resident set between measurements.
#include <doctest/doctest.h>
#include <flatmem/flatmem.h>
#include <malloc.h>

#include <algorithm>

#include "support/peak_memory.hpp"
#include "support/segment_run.hpp"
#include "support/toy_reversible.hpp"

using namespace flatmem_test;

namespace {

constexpr std::int64_t rows = 256;
constexpr int width = 1024;

std::int64_t peak_for(flatmem_reversible_mode mode, int depth) {
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
  ToySegment segment(depth, width, /*mixing=*/false, 3);
  const SegmentInputs in(Dtype::f32, rows, width, 1);
  HostTensor y1 = HostTensor::matrix(Dtype::f32, rows, width), y2 = HostTensor::matrix(Dtype::f32, rows, width);
  HostTensor dx1 = HostTensor::matrix(Dtype::f32, rows, width), dx2 = HostTensor::matrix(Dtype::f32, rows, width);
  flatmem_reversible_options options = FLATMEM_REVERSIBLE_OPTIONS_INIT;
  options.mode = mode;
  options.num_threads = 2;
  flatmem_reversible_t *h = nullptr;
  REQUIRE(flatmem_reversible_create(&h, segment.blocks.data(), depth, &options) == FLATMEM_STATUS_SUCCESS);
  malloc_trim(0);
  const std::int64_t peak = peak_bytes_during([&] {
    for (int step = 0; step < (mode == FLATMEM_REVERSIBLE_AUTO ? 5 : 1); ++step) {
      REQUIRE(flatmem_reversible_forward(h, in.x1.dl(), in.x2.dl(), 1, 2, y1.dl(), y2.dl(), nullptr, 0,
                                         nullptr) == FLATMEM_STATUS_SUCCESS);
      REQUIRE(flatmem_reversible_backward(h, y1.dl(), y2.dl(), in.dy1.dl(), in.dy2.dl(), 1, 2, dx1.dl(),
                                          dx2.dl(), nullptr, nullptr, nullptr, 0,
                                          nullptr) == FLATMEM_STATUS_SUCCESS);
    }
  });
  flatmem_reversible_destroy(h);
  return peak;
}

void check_flat(flatmem_reversible_mode mode) {
  REQUIRE_MESSAGE(reset_peak_memory(), "/proc/self/clear_refs is not writable: cannot measure peaks");
  std::int64_t lowest = INT64_MAX, highest = 0;
  for (int depth : {4, 16, 64}) {
    const std::int64_t peak = peak_for(mode, depth);
    MESSAGE("depth ", depth, ": peak ", peak / (1 << 20), " MiB above the baseline");
    lowest = std::min(lowest, peak);
    highest = std::max(highest, peak);
  }
  const std::int64_t tensor = rows * width * 4;
  CHECK(lowest >= 4 * tensor);  // the measurement sees the segment's buffers at all
  CHECK(double(highest) <= 1.10 * double(lowest));
}

}  // namespace

TEST_CASE("reversible/memory/flat_in_depth/vanilla") { check_flat(FLATMEM_REVERSIBLE_VANILLA); }
TEST_CASE("reversible/memory/flat_in_depth/overlapped") { check_flat(FLATMEM_REVERSIBLE_OVERLAPPED); }
TEST_CASE("reversible/memory/flat_in_depth/auto") { check_flat(FLATMEM_REVERSIBLE_AUTO); }

TEST_CASE("reversible/memory/standard_grows_with_depth") {
  REQUIRE(reset_peak_memory());
  const std::int64_t at4 = peak_for(FLATMEM_REVERSIBLE_STANDARD, 4);
  const std::int64_t at16 = peak_for(FLATMEM_REVERSIBLE_STANDARD, 16);
  MESSAGE("STANDARD: depth 4 ", at4 >> 20, " MiB, depth 16 ", at16 >> 20, " MiB");
  // 12 more blocks keep 12 * (2 states + 2 residual tensors) = 48 tensors more.
  CHECK(at16 - at4 >= 40 * rows * width * 4);
}
