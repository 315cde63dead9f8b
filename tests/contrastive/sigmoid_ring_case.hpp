// One ring scenario of the sigmoid loss for the tests: a global batch (one
// SigmoidCase of B rows and C columns) cut into per-rank slices, each rank's
// three calls over a flatmem_comm_t (value_and_grad with every output,
// forward, backward(g)), and the comparison of a rank's results with its
// slice of the float64 reference of the CONCATENATED batch.
//
// Tolerances: sigmoid_tolerance of the global problem. Its derivation
// (sigmoid_reference.hpp) covers the ring unchanged: the logits and the
// element-wise terms are computed alike, dq_i is still an fp32 sum over the C
// columns (accumulated block after block), dk_j an fp32 sum over the B rows
// (partials added rank after rank), and the loss, ds, dt are double sums;
// only the order of the sums differs from one process, which the gamma_n
// bounds allow for.
#pragma once

#include <flatmem/flatmem.h>

#include <cstdint>
#include <string>
#include <vector>

#include "contrastive/sigmoid_case.hpp"

namespace sigmoid_ring {

struct SigmoidRingCase {
  std::vector<std::int64_t> rows;  // b_r per rank
  std::vector<std::int64_t> cols;  // c_r per rank (empty: = rows)
  // d, labels (global, random in [0, C)), s, t, dtypes, seed; b and c are
  // set from rows / cols
  flatmem_test::SigmoidShape shape;
  double dloss = 0.75;  // g of the backward call
  int tile = 0;         // tile_rows = tile_cols (0 = default)
  int threads = 1;
  bool want_dk = true;  // false: value_and_grad without dk, no backward

  int ranks() const { return int(rows.size()); }
  std::int64_t columns(int r) const { return cols.empty() ? rows[std::size_t(r)] : cols[std::size_t(r)]; }
  std::int64_t row_offset(int r) const;
  std::int64_t col_offset(int r) const;
  // The concatenated batch, deterministic in shape.seed.
  flatmem_test::SigmoidCase global_batch() const;
  // Rank r's slice of it: its rows of q (and labels), its columns of k.
  flatmem_test::SigmoidCase slice(const flatmem_test::SigmoidCase &global, int rank) const;
};

// A rank's outputs (status != SUCCESS: error holds flatmem_last_error()).
struct RankRun {
  flatmem_status status = FLATMEM_STATUS_SUCCESS;
  std::string error;
  flatmem_test::SigmoidOutputs value_and_grad, forward, backward;
};

// Rank r's calls on its slice through `comm` (collective; comm NULL: one
// process without a communicator).
RankRun run_rank(flatmem_comm_t *comm, const SigmoidRingCase &rc,
                 const flatmem_test::SigmoidCase &global, int rank);

// "" when rank r's results are within tolerance of the reference, else what
// differs first (usable in rank processes: no doctest).
std::string check_rank(const SigmoidRingCase &rc, const flatmem_test::SigmoidCase &global,
                       const RankRun &run, int rank);

// Whether two runs gave the same bits in every output.
bool same_bits(const RankRun &a, const RankRun &b);

}  // namespace sigmoid_ring
