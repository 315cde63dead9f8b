// The resolved options of a built-in block and the shapes of its parameters
// (reversible.h, "Built-in blocks").
#pragma once

#include <flatmem/flatmem.h>

#include <array>
#include <cstdint>

namespace flatmem::blocks {

enum class Kind { attention = FLATMEM_BLOCK_ATTENTION, mlp = FLATMEM_BLOCK_MLP };

struct BlockOptions {
  Kind kind = Kind::attention;
  std::int64_t width = 0;
  std::int64_t heads = 1;   // attention only
  std::int64_t hidden = 0;  // MLP only
  float eps = 1e-6f;
  bool tf32 = false;  // FLATMEM_BLOCK_MATH_TF32 (CUDA products only)
};

// Defaults applied, every field checked; messages name "options.<field>".
BlockOptions resolve_block_options(const flatmem_block_options *options);

constexpr int num_parameters = FLATMEM_BLOCK_NUM_PARAMETERS;

// One parameter tensor: a (rows, cols) matrix, or a (rows,) vector when cols == 0.
struct ParameterShape {
  const char *name;
  std::int64_t rows, cols;
  std::int64_t elements() const { return cols == 0 ? rows : rows * cols; }
};

// The six parameters in the header's order.
std::array<ParameterShape, num_parameters> parameter_shapes(const BlockOptions &options);

}  // namespace flatmem::blocks
