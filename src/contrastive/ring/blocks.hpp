// Column blocks as the ring handles them: the plan of this rank's rows
// against each rank's block, compact views of blocks in transit, and the
// packed (sum, max) column state the forward passes along.
#pragma once

#include <vector>

#include "contrastive/cpu/blocks.hpp"
#include "contrastive/plan.hpp"
#include "contrastive/ring/agreement.hpp"

namespace flatmem::contrastive::ring {

// plans[o]: this rank's rows x the columns of rank o (the tiling a single
// process would use for that pair, so one rank reproduces it exactly).
std::vector<Plan> block_plans(const Layout &layout, std::int64_t d, const Options &options);
// The plan with the widest column tiles (thread scratch is carved for it).
const Plan &widest(const std::vector<Plan> &plans);
std::int64_t most_groups(const std::vector<Plan> &plans);

// A compact rows x like.cols matrix of like's dtype at data.
MatrixView block_view(void *data, std::int64_t rows, const MatrixView &like);
std::size_t block_bytes(std::int64_t rows, const MatrixView &like);
// This rank's own block for sending: k itself when compact, else a compact
// copy in `scratch` (block_bytes(k.rows, k) bytes).
MatrixView compact_block(const MatrixView &k, void *scratch);

// The column (max, sum) states of one block as a message: c doubles (sums)
// then c floats (maxima).
struct PackedStates {
  char *data = nullptr;
  std::int64_t cols = 0;
  static std::size_t bytes(std::int64_t cols) { return std::size_t(cols) * 12; }
  cpu::LseStates states() const {
    return {reinterpret_cast<float *>(data + 8 * cols), reinterpret_cast<double *>(data)};
  }
};

}  // namespace flatmem::contrastive::ring
