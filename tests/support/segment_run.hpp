// Runs a toy reversible segment (support/toy_reversible.hpp) through the C
// API: forward, then backward in a given mode, returning every output and the
// parameter gradients the callbacks accumulated.
#pragma once

#include <flatmem/flatmem.h>

#include <cstdint>
#include <vector>

#include "support/tensor.hpp"
#include "support/toy_reversible.hpp"

namespace flatmem_test {

struct SegmentInputs {
  HostTensor x1, x2, dy1, dy2;  // rows x width
  // Random N(0, 1) inputs and gradients of the given dtype (f32 or f64).
  SegmentInputs(Dtype dtype, std::int64_t rows, std::int64_t width, std::uint64_t seed);
};

struct SegmentRun {
  flatmem_status forward_status = FLATMEM_STATUS_SUCCESS, backward_status = FLATMEM_STATUS_SUCCESS;
  HostTensor y1, y2, dx1, dx2, x1, x2;  // x1, x2: the rebuilt input
  std::vector<std::vector<double>> d_weight_f, d_bias_f, d_weight_g, d_bias_g;
  flatmem_reversible_mode ran = FLATMEM_REVERSIBLE_AUTO;
};

struct SegmentSettings {
  flatmem_reversible_mode mode = FLATMEM_REVERSIBLE_VANILLA;
  int threads = 2;
  std::uint64_t seed = 7, offset = 11;
  int backwards = 1;  // backward calls after the forward (the last one is kept)
  std::uint64_t backward_offset_shift = 0;  // a backward given another offset than its forward
};

SegmentRun run_segment(ToySegment &segment, const SegmentInputs &in, const SegmentSettings &s);

// Bitwise equality of everything two runs produced.
bool same_bits(const SegmentRun &a, const SegmentRun &b);

}  // namespace flatmem_test
