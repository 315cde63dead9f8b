#include "contrastive/ring/agreement.hpp"

#include <algorithm>
#include <cstring>
#include <exception>
#include <new>
#include <optional>
#include <sstream>

#include "core/error.hpp"

namespace flatmem::contrastive::ring {
namespace {

float as_float(std::uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

const char *loss_text(std::int32_t loss) {
  static const char *names[] = {"SYMMETRIC", "INFONCE", "SIGMOID"};
  return loss >= 0 && loss < 3 ? names[loss] : "?";
}
const char *given(std::int32_t wanted) { return wanted ? "a tensor" : "NULL"; }
const char *dtype_text(std::int32_t dtype) {
  static const char *names[] = {"float32", "bfloat16", "float16"};
  return dtype >= 0 && dtype < 3 ? names[dtype] : "?";
}
const char *policy_text(std::int32_t p) { return p == FLATMEM_NONFINITE_ERROR ? "ERROR" : "PROPAGATE"; }
const char *precision_text(std::int32_t p) {  // contrastive::Fp32Precision
  static const char *names[] = {"DEFAULT", "TF32", "FULL"};
  return p >= 0 && p < 3 ? names[p] : "?";
}

// Fails on every rank alike when `field` differs from rank 0's somewhere.
template <typename Field, typename Show>
void require_same(const std::vector<RankEntry> &all, const char *name, Field field, Show show) {
  for (std::size_t r = 1; r < all.size(); ++r)
    if (field(all[r]) != field(all[0]))
      invalid(name, ": rank 0 has ", show(all[0]), ", rank ", r, " has ", show(all[r]),
              "; every rank of the ring must pass the same");
}

void check_agreement(const std::vector<RankEntry> &all) {
  require_same(all, "options.loss", [](const RankEntry &e) { return e.loss; },
               [](const RankEntry &e) { return loss_text(e.loss); });
  require_same(all, "options.nonfinite", [](const RankEntry &e) { return e.nonfinite; },
               [](const RankEntry &e) { return policy_text(e.nonfinite); });
  require_same(all, "options.fp32_precision", [](const RankEntry &e) { return e.precision; },
               [](const RankEntry &e) { return precision_text(e.precision); });
  require_same(all, "q, k: dtype", [](const RankEntry &e) { return e.dtype; },
               [](const RankEntry &e) { return dtype_text(e.dtype); });
  require_same(all, "q, k: feature dimension d", [](const RankEntry &e) { return e.d; },
               [](const RankEntry &e) { return e.d; });
  require_same(all, "logit_scale", [](const RankEntry &e) { return e.scale_bits; },
               [](const RankEntry &e) { return as_float(e.scale_bits); });
  require_same(all, "dloss", [](const RankEntry &e) { return e.dloss_bits; },
               [](const RankEntry &e) { return as_float(e.dloss_bits); });
  require_same(all, "logit_bias", [](const RankEntry &e) { return e.bias_bits; },
               [](const RankEntry &e) { return as_float(e.bias_bits); });
  require_same(all, "dk", [](const RankEntry &e) { return e.wants_dk; },
               [](const RankEntry &e) { return e.wants_dk ? "a dk tensor" : "NULL"; });
  require_same(all, "loss", [](const RankEntry &e) { return e.wants_loss; },
               [](const RankEntry &e) { return given(e.wants_loss); });
  require_same(all, "dlogit_scale", [](const RankEntry &e) { return e.wants_dscale; },
               [](const RankEntry &e) { return given(e.wants_dscale); });
  require_same(all, "dlogit_bias", [](const RankEntry &e) { return e.wants_dbias; },
               [](const RankEntry &e) { return given(e.wants_dbias); });
}

Layout layout_of(const std::vector<RankEntry> &all, int rank) {
  Layout l;
  l.ranks = int(all.size());
  l.rank = rank;
  for (const RankEntry &e : all) {
    l.row_offset.push_back(l.global_rows);
    l.col_offset.push_back(l.global_cols);
    l.rows.push_back(e.rows);
    l.cols.push_back(e.cols);
    l.global_rows += e.rows;
    l.global_cols += e.cols;
    l.max_cols = std::max(l.max_cols, e.cols);
  }
  return l;
}

// Labels are global column indices in [0, C); without labels row g's
// positive is column g, which must exist.
void check_positives(const std::vector<RankEntry> &all, const Layout &l) {
  for (std::size_t r = 0; r < all.size(); ++r) {
    const RankEntry &e = all[r];
    if (e.has_labels && (e.label_min < 0 || e.label_max >= l.global_cols))
      invalid("labels: rank ", r, " has a label ", e.label_min < 0 ? e.label_min : e.label_max,
              " outside [0, C = ", l.global_cols, "); labels are global column indices (column j of "
              "rank s is C_s + j, C_s = columns of the ranks before s)");
    if (!e.has_labels && l.row_offset[r] + e.rows > l.global_cols)
      invalid("labels: rank ", r, " passes none, so its rows' positives are the global columns ",
              l.row_offset[r], " .. ", l.row_offset[r] + e.rows - 1, ", but the ranks hold only C = ",
              l.global_cols, " columns");
  }
}

}  // namespace

Layout agree(comm::Communicator &comm, const char *call,
             const std::function<RankEntry()> &local_check) {
  comm.check_healthy();
  RankEntry mine;
  std::exception_ptr local_error;
  try {
    mine = local_check();
  } catch (const Error &e) {
    local_error = std::current_exception();
    mine = RankEntry{};
    mine.status = e.status();
  } catch (const std::bad_alloc &) {
    local_error = std::current_exception();
    mine = RankEntry{};
    mine.status = FLATMEM_STATUS_OUT_OF_MEMORY;
  }
  std::vector<RankEntry> all(std::size_t(comm.size()));
  comm.all_gather(&mine, all.data(), sizeof mine, comm.default_timeout(),
                  std::string(call) + ": sharing every rank's arguments");
  if (local_error) std::rethrow_exception(local_error);
  for (std::size_t r = 0; r < all.size(); ++r) {
    const auto status = flatmem_status(all[r].status);
    if (status == FLATMEM_STATUS_NON_FINITE)
      fail(status, call, ": rank ", r, " found a non-finite input (its flatmem_last_error names it); "
           "every rank fails under FLATMEM_NONFINITE_ERROR");
    if (status != FLATMEM_STATUS_SUCCESS)
      fail(status, call, ": rank ", r, " refused its arguments (", flatmem_status_string(status),
           "; its flatmem_last_error names the argument)");
  }
  check_agreement(all);
  const Layout layout = layout_of(all, comm.rank());
  check_positives(all, layout);
  return layout;
}

}  // namespace flatmem::contrastive::ring
