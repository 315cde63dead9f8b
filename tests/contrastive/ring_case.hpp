// One ring-loss scenario for the tests: a global batch (q: B x d, k: C x d,
// optional global labels) cut into per-rank slices, the per-rank run of the
// C API (forward + backward over a flatmem_comm_t), and the comparison of a
// rank's results with the materialised double reference of the CONCATENATED
// batch (support/reference.hpp).
//
// Tolerances: those of support/tolerance.hpp for the global problem (B rows,
// C columns). Their derivation (fp32 sums bounded by gamma_n sum |a_i| in any
// order or blocking) covers the ring unchanged: a row's (max, sum) state is
// folded block by block and merged in double; a column's state is merged
// across ranks in double; dq_i is still an fp32 sum over C columns, dk_j an
// fp32 sum over B rows (partials added rank after rank), and the loss and ds
// are sums in double. Only the order of those sums differs from one process.
#pragma once

#include <flatmem/flatmem.h>

#include <cstdint>
#include <string>
#include <vector>

#include "support/reference.hpp"
#include "support/tensor.hpp"

namespace ring_test {

using flatmem_test::Dtype;
using flatmem_test::HostTensor;

struct RingCase {
  flatmem_contrastive_loss loss = FLATMEM_CONTRASTIVE_SYMMETRIC;
  Dtype dtype = Dtype::f32;
  std::vector<std::int64_t> rows;  // b_r per rank
  std::vector<std::int64_t> cols;  // c_r per rank (empty: = rows)
  std::int64_t d = 16;
  double scale = 10.0;
  bool labels = false;   // InfoNCE: global labels, a random column anywhere
  int tile = 0;          // tile_rows = tile_cols (0 = default)
  double dloss = 1.0;
  Dtype grad_out = Dtype::f32;  // dq / dk dtype
  bool want_dk = true;
  int threads = 1;
  std::uint64_t seed = 1;
  // >= 0: saturated pairs (support/saturation.hpp): k's rows pairwise at about this
  // cosine, q_i = k_{y_i}; check_rank then also holds every output to the saturation bound.
  double saturated = -1.0;

  int ranks() const { return int(rows.size()); }
  std::int64_t columns(int r) const { return cols.empty() ? rows[std::size_t(r)] : cols[std::size_t(r)]; }
  bool symmetric() const { return loss != FLATMEM_CONTRASTIVE_INFONCE; }
};

// The concatenated batch, deterministic in the case's seed.
struct GlobalBatch {
  HostTensor q, k, labels, scale;
  std::vector<std::int64_t> row_offset, col_offset;  // per rank
  std::int64_t global_rows = 0, global_cols = 0;
};
GlobalBatch make_batch(const RingCase &rc);

// Rank r's slice of the batch: its rows of q (and labels), its columns of k.
struct RankInputs {
  HostTensor q, k, labels;
  bool has_labels = false;
  const DLTensor *labels_dl() const { return has_labels ? labels.dl() : nullptr; }
};
RankInputs slice(const RingCase &rc, const GlobalBatch &batch, int rank);

// A rank's outputs (status != SUCCESS: error holds flatmem_last_error()).
struct RankResult {
  flatmem_status status = FLATMEM_STATUS_SUCCESS;
  std::string error;
  HostTensor loss, row_lse, col_lse, dq, dk, ds;
};

// Rank r's forward + backward on its slice through `comm` (collective).
RankResult run_rank(flatmem_comm_t *comm, const RingCase &rc, const GlobalBatch &batch, int rank);

// The double reference of the whole batch.
flatmem_test::ReferenceResult reference_of(const RingCase &rc, const GlobalBatch &batch);

// "" when rank r's results are within tolerance of the reference, else what
// differs first.
std::string check_rank(const RingCase &rc, const GlobalBatch &batch,
                       const flatmem_test::ReferenceResult &ref, const RankResult &result, int rank);

// Rows first .. first + count - 1 of m, as a compact matrix.
HostTensor rows_of(const HostTensor &m, std::int64_t first, std::int64_t count);

// Compares got[i] with want[offset + i] (tolerance tol[offset + i]); "" when
// all pass, else the first failure. Usable in rank processes (no doctest).
// FLATMEM_TEST_VERBOSE=1 prints the largest error / tolerance of each output.
std::string compare(const char *what, const HostTensor &got, const std::vector<double> &want,
                    const std::vector<double> &tol, std::int64_t offset);

// Whether two runs gave the same bits in every output.
bool same_bits(const RankResult &a, const RankResult &b);

}  // namespace ring_test
