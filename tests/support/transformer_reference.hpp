// An independent double-precision reference of the built-in reversible
// blocks (reversible.h, "Built-in blocks"): pre-LayerNorm multi-head
// self-attention and pre-LayerNorm MLP with exact GELU, forward and the
// hand-written backward (input gradient and the six parameter gradients).
// Plain loops over materialised matrices; written from the header's formulas,
// not from src/.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

namespace flatmem_test {

enum class BlockKind { attention = 1, mlp = 2 };

struct BlockConfig {
  BlockKind kind = BlockKind::attention;
  std::int64_t batch = 1, tokens = 1, width = 1;
  std::int64_t heads = 1;   // attention
  std::int64_t hidden = 0;  // MLP
  double eps = 1e-6;
  std::int64_t rows() const { return batch * tokens; }
};

using Values = std::vector<double>;
using BlockParameterValues = std::array<Values, 6>;

/** Element counts of the six parameters, in the header's order. */
std::array<std::int64_t, 6> block_parameter_sizes(const BlockConfig &c);

/** y = F(x) (attention) or G(x) (MLP); x and y are (rows, width) row-major. */
Values block_forward(const BlockConfig &c, const BlockParameterValues &p, const Values &x);

struct BlockGradients {
  Values dx;                     // J^T dy
  BlockParameterValues dparams;  // d<dy, F(x)>/dparameter
};

/** The vector-Jacobian product at x for the upstream gradient dy. */
BlockGradients block_vjp(const BlockConfig &c, const BlockParameterValues &p, const Values &x,
                         const Values &dy);

}  // namespace flatmem_test
