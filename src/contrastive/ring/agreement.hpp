// The start of every ring call: each rank checks its own arguments, then one
// all_gather tells every rank what the others have (their shapes, dtype, loss,
// logit scale, ... and whether their checks passed). Every rank then reaches
// the same verdict from the same table: either the call's global layout, or
// the same error on every rank (no rank is left waiting in the ring for one
// that gave up).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "comm/communicator.hpp"

namespace flatmem::contrastive::ring {

// One rank's entry of the table (plain bytes: every rank runs this build).
struct RankEntry {
  std::int32_t status = 0;  // flatmem_status of the local checks
  std::int32_t loss = 0, dtype = 0, nonfinite = 0;
  // options.fp32_precision (Fp32Precision); `unused` keeps the entry free of padding bytes
  std::int32_t precision = 0, unused = 0;
  std::int64_t rows = 0, cols = 0, d = 0;
  std::uint32_t scale_bits = 0, dloss_bits = 0;  // fp32 bit patterns (dloss: backward only)
  std::uint32_t bias_bits = 0;                   // sigmoid: the logit bias t
  std::int32_t has_labels = 0, wants_dk = 0;
  // sigmoid: the outputs summed over the ranks must be requested everywhere
  std::int32_t wants_loss = 0, wants_dscale = 0, wants_dbias = 0;
  std::int64_t label_min = 0, label_max = -1;    // over this rank's labels
};

// Where every rank's rows and columns sit in the global batch.
struct Layout {
  int ranks = 1, rank = 0;
  std::vector<std::int64_t> rows, cols, row_offset, col_offset;  // per rank
  std::int64_t global_rows = 0, global_cols = 0, max_cols = 0;
  // Owner of the column block this rank holds at ring step t (0 .. ranks).
  int block_owner(int step) const { return ((rank - step) % ranks + ranks) % ranks; }
};

// Runs local_check (throws flatmem::Error for a bad argument), shares its
// entry, and returns the layout, or throws on every rank alike: a rank whose
// check failed rethrows its own error, the others fail with its status and a
// message naming it; values that must agree and do not give
// INVALID_ARGUMENT naming the ranks and values.
Layout agree(comm::Communicator &comm, const char *call,
             const std::function<RankEntry()> &local_check);

}  // namespace flatmem::contrastive::ring
