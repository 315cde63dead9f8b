#include "contrastive/panels/plan.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <limits>
#include <string>

#include "core/error.hpp"

namespace flatmem::contrastive::panels {
namespace {

constexpr std::size_t pair_bytes = 8;  // a (max, sum) pair of floats

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// Lays regions out one after the other, each aligned to lt_alignment, with
// overflow checks (the sizes are products of caller-given extents).
class Layout {
 public:
  Region take(unsigned __int128 bytes) {
    offset_ = (offset_ + lt_alignment - 1) / lt_alignment * lt_alignment;
    if (bytes > limit - offset_) invalid("workspace: the panel engine's sizes overflow 64 bits");
    Region r{std::size_t(offset_), std::size_t(bytes)};
    offset_ += bytes;
    return r;
  }
  // The total a caller provides: everything, plus the slack to align its base.
  std::size_t total() const {
    if (offset_ + lt_alignment > limit) invalid("workspace: the panel engine's sizes overflow 64 bits");
    return std::size_t(offset_ + lt_alignment);
  }

 private:
  static constexpr unsigned __int128 limit = (unsigned __int128)(std::numeric_limits<std::int64_t>::max());
  unsigned __int128 offset_ = 0;
};

using u128 = unsigned __int128;

// The regions of `p` for its panel extents (p.rows, p.cols set).
void lay_out(PanelPlan &p) {
  const bool symmetric = p.loss == Loss::symmetric;
  p.row_panels = ceil_div(p.b, p.rows);
  p.col_panels = ceil_div(p.c, p.cols);
  p.row_folds = ceil_div(p.rows, fold_rows);
  p.col_folds = ceil_div(p.cols, fold_cols);
  Layout l;
  p.panel = l.take(u128(p.rows) * u128(p.cols) * 4);
  p.row_parts = p.col_parts = p.row_state = p.col_state = p.loss_parts = Region{};
  p.row_acc = p.col_acc = p.ds_rows = Region{};
  if (p.call == Call::forward) {
    p.row_parts = l.take(u128(p.rows) * u128(p.col_folds) * pair_bytes);
    if (symmetric) p.col_parts = l.take(u128(p.cols) * u128(p.row_folds) * pair_bytes);
    p.row_state = l.take(u128(p.b) * pair_bytes);
    if (symmetric) p.col_state = l.take(u128(p.c) * pair_bytes);
    p.loss_parts = l.take(u128(finish_blocks(p.b)) * 8);
  } else {
    if (p.rows_sweep && p.want_dq) p.row_acc = l.take(u128(p.rows) * u128(p.d) * 4);
    if (p.want_dk) p.col_acc = l.take(u128(p.dk_resident ? p.c : p.cols) * u128(p.d) * 4);
    // softmax: ds per row; sigmoid: loss, ds and dt per row.
    if (p.want_ds) p.ds_rows = l.take(u128(p.b) * 8 * (p.loss == Loss::sigmoid ? 3 : 1));
  }
  p.lt = l.take(lt_workspace_bytes);
  p.bytes = l.total();
}

// The panel extents tried, best first: tall panels (R = 2C) before square
// ones, larger before smaller; each clamped to the matrix. A smaller panel
// is only chosen when the larger does not fit the budget.
void choose_extents(PanelPlan &p, Shape forced) {
  if (forced.rows > 0 && forced.cols > 0) {
    p.rows = std::min(p.b, forced.rows), p.cols = std::min(p.c, forced.cols);
    lay_out(p);
    p.over_budget = p.bytes > p.budget;
    return;
  }
  const std::int64_t b_cap = std::min(p.b, max_extent), c_cap = std::min(p.c, max_extent);
  std::int64_t best_rows = std::min(b_cap, min_extent), best_cols = std::min(c_cap, min_extent);
  u128 best_area = 0;
  for (std::int64_t cols = min_extent; cols <= max_extent; cols *= 2)
    for (std::int64_t tall : {2, 1}) {
      const std::int64_t r = std::min(b_cap, cols * tall), c = std::min(c_cap, cols);
      const u128 area = u128(r) * u128(c);
      if (area <= best_area) continue;
      p.rows = r, p.cols = c;
      lay_out(p);
      if (p.bytes <= p.budget) best_rows = r, best_cols = c, best_area = area;
    }
  p.rows = best_rows, p.cols = best_cols;
  p.over_budget = best_area == 0;
  lay_out(p);
  if (best_area != 0 && p.bytes > p.budget) invalid("workspace: panel plan exceeds its own budget");
}

PanelPlan base_plan(Call call, std::int64_t b, std::int64_t c, std::int64_t d, Loss loss, std::size_t budget) {
  if (b < 1 || c < 1 || d < 1) invalid("panel plan: b, c and d must be positive (", b, ", ", c, ", ", d, ")");
  if (loss == Loss::sigmoid && call == Call::forward)
    fail(FLATMEM_STATUS_UNSUPPORTED, "panel plan: the sigmoid loss has no forward of its own (value_and_grad)");
  PanelPlan p;
  p.call = call;
  p.loss = loss;
  p.b = b, p.c = c, p.d = d;
  p.budget = budget == 0 ? default_budget : budget;
  return p;
}

}  // namespace

std::int64_t finish_blocks(std::int64_t b) { return std::min<std::int64_t>(1024, ceil_div(b, 8)); }

PanelPlan plan_forward(std::int64_t b, std::int64_t c, std::int64_t d, Loss loss, std::size_t budget,
                       Shape forced) {
  PanelPlan p = base_plan(Call::forward, b, c, d, loss, budget);
  choose_extents(p, forced);
  return p;
}

PanelPlan plan_backward(std::int64_t b, std::int64_t c, std::int64_t d, Loss loss, bool want_dq,
                        bool want_dk, bool want_ds, std::size_t budget, Shape forced) {
  PanelPlan p = base_plan(Call::backward, b, c, d, loss, budget);
  p.want_dq = want_dq, p.want_dk = want_dk, p.want_ds = want_ds;
  // dk resident (one sweep) when dq is wanted too and the budget holds c x d
  // fp32 beside the panel; otherwise dk gets a sweep of its own.
  const auto try_with = [&](bool resident) {
    PanelPlan t = p;
    t.dk_resident = resident;
    // ds comes from the rows sweep when it runs, else from the cols sweep.
    t.rows_sweep = want_dq || (want_dk && resident) || (!want_dk && want_ds);
    t.cols_sweep = want_dk && !resident;
    choose_extents(t, forced);
    return t;
  };
  if (want_dq && want_dk) {
    // Resident saves a fifth of the GEMMs and a gradient pass: taken whenever it
    // fits with a panel of preferred_area, or no smaller than the two sweeps'.
    PanelPlan resident = try_with(true);
    PanelPlan two = try_with(false);
    const u128 area = u128(resident.rows) * u128(resident.cols), two_area = u128(two.rows) * u128(two.cols);
    if (!resident.over_budget && (area >= u128(preferred_area) || area >= two_area)) return resident;
    return two;
  }
  return try_with(false);
}

PanelPlan narrowed(const PanelPlan &plan, std::int64_t c) {
  if (c < 1 || c > plan.c) invalid("panel plan: ", c, " columns of a plan for ", plan.c);
  PanelPlan p = plan;
  p.c = c;
  p.col_panels = ceil_div(c, p.cols);
  return p;
}

CudaEngine engine_from_environment() {
  const char *text = std::getenv("FLATMEM_CUDA_ENGINE");
  if (text == nullptr || text[0] == '\0' || std::string(text) == "auto") return CudaEngine::automatic;
  if (std::string(text) == "tiles") return CudaEngine::tiles;
  if (std::string(text) == "panels") return CudaEngine::panels;
  invalid("FLATMEM_CUDA_ENGINE: '", text, "' is not one of auto, tiles, panels");
}

bool use_panels(CudaEngine engine, Loss loss, bool bf16, std::int64_t b, std::int64_t c, int sm_major) {
  if (engine == CudaEngine::tiles) return false;
  if (engine == CudaEngine::panels) return true;
  // The sigmoid loss on panels has not run on a GPU yet: only when forced.
  return loss != Loss::sigmoid && bf16 && b >= auto_min_extent && c >= auto_min_extent && sm_major >= 9;
}

Shape shape_from_environment() {
  const char *text = std::getenv("FLATMEM_CUDA_PANEL_SHAPE");
  if (text == nullptr || text[0] == '\0') return {};
  char *end = nullptr;
  const long long rows = std::strtoll(text, &end, 10);
  long long cols = 0;
  bool ok = end != text && (*end == 'x' || *end == 'X');
  if (ok) {
    const char *second = end + 1;
    cols = std::strtoll(second, &end, 10);
    ok = end != second && *end == '\0';
  }
  if (!ok || rows < 1 || cols < 1 || rows > max_extent || cols > max_extent)
    invalid("FLATMEM_CUDA_PANEL_SHAPE: '", text, "' is not <rows>x<cols> with each 1 to ", max_extent);
  return Shape{rows, cols};
}

std::size_t budget_from_environment() {
  const char *text = std::getenv("FLATMEM_CUDA_PANEL_BYTES");
  if (text == nullptr || text[0] == '\0') return 0;
  char *end = nullptr;
  errno = 0;
  const unsigned long long value = std::strtoull(text, &end, 10);
  const bool overflow = errno == ERANGE;
  unsigned shift = 0;
  if (end != text) {
    switch (*end) {
      case 'K': case 'k': shift = 10, ++end; break;
      case 'M': case 'm': shift = 20, ++end; break;
      case 'G': case 'g': shift = 30, ++end; break;
      default: break;
    }
  }
  if (end == text || *end != '\0' || text[0] == '-' || overflow ||
      value > (std::numeric_limits<std::uint64_t>::max() >> shift))
    invalid("FLATMEM_CUDA_PANEL_BYTES: '", text, "' is not a byte count (digits, optionally K, M or G)");
  return std::size_t(value) << shift;
}

}  // namespace flatmem::contrastive::panels
