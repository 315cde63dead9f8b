// What every backend of the built-in blocks is given after the checks: the
// state's shape with the block's sizes, and the parameter pointers.
#pragma once

#include <cstdint>

namespace flatmem::blocks {

// A state of `rows` = batch * tokens token rows of `width` floats, and the
// block's sizes.
struct BlockShape {
  std::int64_t batch = 1, tokens = 1, rows = 1, width = 1;
  std::int64_t heads = 1, head_dim = 1;  // attention
  std::int64_t hidden = 0;               // MLP
  float eps = 1e-6f;
};

// Parameters and their gradients in the header's order (gradients NULL in a
// forward), on the block's device.
struct BlockParameters {
  const float *value[6] = {};
  float *grad[6] = {};
};

}  // namespace flatmem::blocks
