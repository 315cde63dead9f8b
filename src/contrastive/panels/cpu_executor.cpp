// The CUDA engine's launch sequence (panels/cuda/engine.cpp), step for step,
// with sgemm in place of cuBLASLt and loops in place of the kernels.
#include "contrastive/panels/cpu_executor.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "contrastive/panels/passes.hpp"
#include "core/cpu_isa.hpp"
#include "core/dtype.hpp"
#include "core/error.hpp"
#include "core/gemm/sgemm.hpp"

namespace flatmem::contrastive::panels {
namespace {

using gemm::Op;

template <class T>
T *region(void *base, const Region &r) {
  return r.bytes == 0 ? nullptr : reinterpret_cast<T *>(static_cast<char *>(base) + r.offset);
}

void *aligned_base(void *workspace) {
  const auto address = reinterpret_cast<std::uintptr_t>(workspace);
  return static_cast<char *>(workspace) + (lt_alignment - address % lt_alignment) % lt_alignment;
}

// A single device's whole batch as the one block of its walk (offsets 0).
CpuBlock whole_batch(const PanelPlan &p, const CpuProblem &pr) {
  CpuBlock bl;
  bl.q = pr.q, bl.k = pr.k;
  bl.rows = p.b, bl.cols = p.c, bl.d = p.d;
  bl.global_c = p.c;
  bl.labels = pr.labels;
  bl.scale = pr.scale, bl.g_bits = pr.g_bits, bl.isa = pr.isa;
  return bl;
}

// A ring block's plan must be made for the block's extents.
void check_block(const PanelPlan &p, const CpuBlock &bl, Call call, const char *who) {
  if (p.call != call || p.loss == Loss::sigmoid)
    invalid(who, ": not a softmax ", call == Call::forward ? "forward" : "backward", " plan");
  if (p.b != bl.rows || p.c != bl.cols || p.d != bl.d)
    invalid(who, ": the plan is for ", p.b, " x ", p.c, " x ", p.d, ", the block is ", bl.rows, " x ", bl.cols,
            " x ", bl.d);
  if (bl.q == nullptr || bl.k == nullptr || bl.row_offset < 0 || bl.col_offset < 0 ||
      bl.col_offset + bl.cols > bl.global_c)
    invalid(who, ": block features missing or offsets outside the global batch");
}

// P (R_I x C_J, pitch plan.cols) = Q_I K_J^T, raw <q, k>.
void logits(const PanelPlan &p, const CpuBlock &bl, std::int64_t i, std::int64_t j, float *panel) {
  gemm::sgemm(bl.isa, Op::none, Op::transpose, p.row_count(i), p.col_count(j), p.d, 1.0f,
              bl.q + p.row_begin(i) * p.d, p.d, bl.k + p.col_begin(j) * p.d, p.d, 0.0f, panel, p.cols);
}

// forward: the fold kernel over every fold tile of panel (i, j), then the merge kernel.
void fold_and_merge(const PanelPlan &p, float s, std::int64_t i, std::int64_t j, const float *panel,
                    State *row_parts, State *col_parts, State *row_state, State *col_state) {
  const std::int64_t rows = p.row_count(i), cols = p.col_count(j);
  const std::int64_t row_tiles = (rows + fold_rows - 1) / fold_rows, col_tiles = (cols + fold_cols - 1) / fold_cols;
  std::vector<float> staged(std::size_t(fold_rows * fold_cols));
  for (std::int64_t fi = 0; fi < row_tiles; ++fi)
    for (std::int64_t fj = 0; fj < col_tiles; ++fj) {
      const float *tile = panel + fi * fold_rows * p.cols + fj * fold_cols;
      const int tr = int(std::min(fold_rows, rows - fi * fold_rows));
      const int tc = int(std::min(fold_cols, cols - fj * fold_cols));
      // Staged as the fold kernel stages it in shared memory (missing entries 0, never read).
      for (int r = 0; r < int(fold_rows); ++r)
        for (int c = 0; c < int(fold_cols); ++c) staged[fold_slot(r, c)] = r < tr && c < tc ? tile[r * p.cols + c] : 0.0f;
      const StagedTile view{staged.data()};
      for (int r = 0; r < tr; ++r) {
        State a = fold_row_quarter(view, r, 0, tc, s), b = fold_row_quarter(view, r, 2, tc, s);
        merge(a, fold_row_quarter(view, r, 1, tc, s));
        merge(b, fold_row_quarter(view, r, 3, tc, s));
        merge(a, b);
        row_parts[(fi * fold_rows + r) * p.col_folds + fj] = a;
      }
      if (col_parts)
        for (int c = 0; c < tc; ++c) {
          State a = fold_col_half(view, c, 0, tr, s);
          merge(a, fold_col_half(view, c, 1, tr, s));
          col_parts[(fj * fold_cols + c) * p.row_folds + fi] = a;
        }
    }
  for (std::int64_t r = 0; r < rows; ++r) {
    State st = row_parts[r * p.col_folds];
    for (std::int64_t f = 1; f < col_tiles; ++f) merge(st, row_parts[r * p.col_folds + f]);
    merge(row_state[p.row_begin(i) + r], st);
  }
  if (col_parts)
    for (std::int64_t c = 0; c < cols; ++c) {
      State st = col_parts[c * p.row_folds];
      for (std::int64_t f = 1; f < row_tiles; ++f) merge(st, col_parts[c * p.row_folds + f]);
      merge(col_state[p.col_begin(j) + c], st);
    }
}

// The forward walk (row panels outer): P, fold and merge into the running
// states (col_parts == nullptr: no column states, InfoNCE).
void fold_walk(const PanelPlan &p, const CpuBlock &bl, float *panel, State *row_parts, State *col_parts,
               State *row_state, State *col_state) {
  const float s = checked_scale(bl.scale);
  for (std::int64_t i = 0; i < p.row_panels; ++i)
    for (std::int64_t j = 0; j < p.col_panels; ++j) {
      logits(p, bl, i, j, panel);
      fold_and_merge(p, s, i, j, panel, row_parts, col_parts, row_state, col_state);
    }
}

double lse_of(State st) { return double(st.max) + std::log(double(st.sum)); }

// The lanes' fp32 sums of one row added in the pass's tree order (passes.hpp).
double lane_tree(const float (&lane)[pass_lanes]) {
  double lanes[pass_lanes];
  for (int l = 0; l < pass_lanes; ++l) lanes[l] = lane[l];
  for (int half = pass_lanes / 2; half > 0; half /= 2)
    for (int l = 0; l < half; ++l) lanes[l] += lanes[l + half];
  return lanes[0];
}

// Per-row sums a pass adds to (nullptr: not wanted): softmax ds; sigmoid loss, ds, dt.
struct RowSums {
  double *loss = nullptr, *ds = nullptr, *dt = nullptr;
};

// The gradient pass over panel (i, j): Gt in place (rounded as the operand
// type), and each row's sums added to `sums`. Softmax: Gt from the LSE
// vectors (indexed by the block's own rows and columns); sigmoid (row_lse ==
// nullptr): Gt = -z sigmoid(v), x = s raw + bias. Positives on global indices.
void gradient_pass(const PanelPlan &p, const CpuBlock &bl, float s, float bias, const float *row_lse,
                   const float *col_lse, std::int64_t i, std::int64_t j, float *panel, RowSums sums) {
  const std::int64_t rows = p.row_count(i), cols = p.col_count(j);
  const bool sigmoid = p.loss == Loss::sigmoid;
  EntryTerms t;
  t.symmetric = p.loss == Loss::symmetric;
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t row = p.row_begin(i) + r;
    if (!sigmoid) t.row_lse = row_lse[row];
    float lane_loss[pass_lanes] = {}, lane_ds[pass_lanes] = {}, lane_dt[pass_lanes] = {};
    float *line = panel + r * p.cols;
    for (std::int64_t c = 0; c < cols; ++c) {
      const std::int64_t col = p.col_begin(j) + c;
      if (t.symmetric) t.col_lse = col_lse[col];
      t.positive = positive_of(bl.labels, row, col, bl.row_offset, bl.col_offset, bl.global_c, &t.bad);
      const float raw = line[c];
      const int lane = int((c % pass_chunk) / pass_vector);
      float gt;
      if (sigmoid) {
        const SigmoidEntry e = sigmoid_entry(s * raw + bias, t.positive, t.bad);
        gt = e.gt;
        lane_loss[lane] += e.loss;
        lane_dt[lane] += gt;
      } else {
        gt = gradient_entry(s * raw, t);
      }
      lane_ds[lane] += gt * raw;
      line[c] = bl.g_bits == 16 ? bf16_to_f32(f32_to_bf16(gt)) : gt;
    }
    if (sums.ds) sums.ds[row] += lane_tree(lane_ds);
    if (sums.loss) sums.loss[row] += lane_tree(lane_loss);
    if (sums.dt) sums.dt[row] += lane_tree(lane_dt);
  }
}

void store(const float *acc, std::int64_t rows, std::int64_t d, float mult, float *out) {
  for (std::int64_t e = 0; e < rows * d; ++e) out[e] = mult * acc[e];
}

// Where a rows-order walk's GEMMs put Gt K_J and Gt^T Q_I (nullptr: not wanted).
struct RowsWalkTargets {
  // dq_panel: the plan's row_acc (R x d), overwritten by each row panel's
  // first column panel and emptied by the walk's row_panel_done; dq_rows: a
  // caller's accumulator of all the rows (b x d), added to at every panel.
  float *dq_panel = nullptr, *dq_rows = nullptr;
  float *dk = nullptr;  // c x d: overwritten by the first row panel, then added to
};

// The walk with row panels outer: per panel P, the gradient pass (row sums
// into `sums`), then the GEMMs into `to`; row_panel_done(i) after row panel i.
template <class RowPanelDone>
void rows_walk(const PanelPlan &p, const CpuBlock &bl, float bias, const float *row_lse, const float *col_lse,
               float *panel, RowSums sums, RowsWalkTargets to, RowPanelDone &&row_panel_done) {
  const float s = checked_scale(bl.scale);
  for (std::int64_t i = 0; i < p.row_panels; ++i) {
    for (std::int64_t j = 0; j < p.col_panels; ++j) {
      logits(p, bl, i, j, panel);
      gradient_pass(p, bl, s, bias, row_lse, col_lse, i, j, panel, sums);
      if (to.dq_panel)
        gemm::sgemm(bl.isa, Op::none, Op::none, p.row_count(i), p.d, p.col_count(j), 1.0f, panel, p.cols,
                    bl.k + p.col_begin(j) * p.d, p.d, j == 0 ? 0.0f : 1.0f, to.dq_panel, p.d);
      if (to.dq_rows)
        gemm::sgemm(bl.isa, Op::none, Op::none, p.row_count(i), p.d, p.col_count(j), 1.0f, panel, p.cols,
                    bl.k + p.col_begin(j) * p.d, p.d, 1.0f, to.dq_rows + p.row_begin(i) * p.d, p.d);
      if (to.dk)
        gemm::sgemm(bl.isa, Op::transpose, Op::none, p.col_count(j), p.d, p.row_count(i), 1.0f, panel, p.cols,
                    bl.q + p.row_begin(i) * p.d, p.d, i == 0 ? 0.0f : 1.0f, to.dk + p.col_begin(j) * p.d, p.d);
    }
    row_panel_done(i);
  }
}

}  // namespace

void cpu_forward(const PanelPlan &p, const CpuProblem &pr, void *workspace, float *loss, float *row_lse,
                 float *col_lse) {
  if (p.call != Call::forward) invalid("cpu_forward: a backward plan");
  void *base = aligned_base(workspace);
  float *panel = region<float>(base, p.panel);
  State *row_parts = region<State>(base, p.row_parts), *col_parts = region<State>(base, p.col_parts);
  State *row_state = region<State>(base, p.row_state), *col_state = region<State>(base, p.col_state);
  const bool symmetric = p.loss == Loss::symmetric;
  std::fill(row_state, row_state + p.b, empty_state());
  if (symmetric) std::fill(col_state, col_state + p.c, empty_state());
  const float s = checked_scale(pr.scale);
  fold_walk(p, whole_batch(p, pr), panel, row_parts, symmetric ? col_parts : nullptr, row_state, col_state);
  double total = 0.0;
  for (std::int64_t r = 0; r < p.b; ++r) {
    bool bad = false;
    const std::int64_t y = pr.labels ? pr.labels[r] : r;
    bad = y < 0 || y >= p.c;
    double positive = NAN;
    if (!bad) {
      double dot = 0.0;
      for (std::int64_t e = 0; e < p.d; ++e) dot += double(pr.q[r * p.d + e]) * double(pr.k[y * p.d + e]);
      positive = double(s * float(dot));
    }
    const double rl = lse_of(row_state[r]);
    row_lse[r] = float(rl);
    total += rl - positive;
    if (symmetric) {
      const double cl = lse_of(col_state[r]);
      col_lse[r] = float(cl);
      total += cl - positive;
    }
  }
  *loss = float(total / (symmetric ? 2.0 * double(p.b) : double(p.b)));
}

namespace {

// The backward walk (softmax) or value_and_grad (sigmoid): both sweeps; the
// row sums land in the plan's ds_rows region (sigmoid: loss, ds, dt rows).
void walk_gradients(const PanelPlan &p, const CpuProblem &pr, const float *row_lse, const float *col_lse,
                    float dloss, void *workspace, float *dq, float *dk, double *const (&totals)[3]) {
  void *base = aligned_base(workspace);
  float *panel = region<float>(base, p.panel);
  float *row_acc = region<float>(base, p.row_acc), *col_acc = region<float>(base, p.col_acc);
  double *rows_region = region<double>(base, p.ds_rows);
  const int sum_kinds = p.loss == Loss::sigmoid ? 3 : 1;
  if (rows_region) std::fill(rows_region, rows_region + sum_kinds * p.b, 0.0);
  RowSums sums;
  if (rows_region) {
    sums.ds = rows_region;
    if (sum_kinds == 3) sums.loss = rows_region + p.b, sums.dt = rows_region + 2 * p.b;
  }
  const CpuBlock bl = whole_batch(p, pr);
  const float s = checked_scale(pr.scale);
  const double inv_n = 1.0 / (p.loss == Loss::symmetric ? 2.0 * double(p.b) : double(p.b));
  const float mult = float(double(s) * double(dloss) * inv_n);

  if (p.rows_sweep) {
    RowsWalkTargets to;
    if (p.want_dq) to.dq_panel = row_acc;
    if (p.dk_resident) to.dk = col_acc;
    rows_walk(p, bl, pr.bias, row_lse, col_lse, panel, sums, to, [&](std::int64_t i) {
      if (p.want_dq) store(row_acc, p.row_count(i), p.d, mult, dq + p.row_begin(i) * p.d);
    });
    if (p.dk_resident) store(col_acc, p.c, p.d, mult, dk);
  }
  if (p.cols_sweep) {
    const RowSums cols_sums = p.rows_sweep ? RowSums{} : sums;
    for (std::int64_t j = 0; j < p.col_panels; ++j) {
      for (std::int64_t i = 0; i < p.row_panels; ++i) {
        logits(p, bl, i, j, panel);
        gradient_pass(p, bl, s, pr.bias, row_lse, col_lse, i, j, panel, cols_sums);
        gemm::sgemm(bl.isa, Op::transpose, Op::none, p.col_count(j), p.d, p.row_count(i), 1.0f, panel, p.cols,
                    bl.q + p.row_begin(i) * p.d, p.d, i == 0 ? 0.0f : 1.0f, col_acc, p.d);
      }
      store(col_acc, p.col_count(j), p.d, mult, dk + p.col_begin(j) * p.d);
    }
  }
  // Ordered sums of the rows: totals[0] ds, [1] loss, [2] dt (nullptr: not wanted).
  const double *const rows_of[3] = {sums.ds, sums.loss, sums.dt};
  for (int kind = 0; kind < 3; ++kind) {
    if (!totals[kind] || !rows_of[kind]) continue;
    double total = 0.0;
    for (std::int64_t r = 0; r < p.b; ++r) total += rows_of[kind][r];
    *totals[kind] = total;
  }
}

}  // namespace

void cpu_backward(const PanelPlan &p, const CpuProblem &pr, const float *row_lse, const float *col_lse, float dloss,
                  void *workspace, float *dq, float *dk, float *dscale) {
  if (p.call != Call::backward || p.loss == Loss::sigmoid) invalid("cpu_backward: not a softmax backward plan");
  double ds_total = 0.0;
  double *const totals[3] = {dscale ? &ds_total : nullptr, nullptr, nullptr};
  walk_gradients(p, pr, row_lse, col_lse, dloss, workspace, dq, dk, totals);
  const double inv_n = 1.0 / (p.loss == Loss::symmetric ? 2.0 * double(p.b) : double(p.b));
  if (dscale) *dscale = float(double(dloss) * inv_n * ds_total);
}

void cpu_sigmoid(const PanelPlan &p, const CpuProblem &pr, float dloss, void *workspace, float *loss, float *dq,
                 float *dk, float *dscale, float *dbias) {
  if (p.call != Call::backward || p.loss != Loss::sigmoid) invalid("cpu_sigmoid: not a sigmoid plan");
  double ds_total = 0.0, loss_total = 0.0, dt_total = 0.0;
  double *const totals[3] = {&ds_total, &loss_total, &dt_total};
  walk_gradients(p, pr, nullptr, nullptr, dloss, workspace, dq, dk, totals);
  const double inv_b = 1.0 / double(p.b);
  if (loss) *loss = float(loss_total * inv_b);
  if (dscale) *dscale = float(double(dloss) * inv_b * ds_total);
  if (dbias) *dbias = float(double(dloss) * inv_b * dt_total);
}

void cpu_fold_block(const PanelPlan &p, const CpuBlock &bl, void *workspace, State *row_state, State *col_state) {
  check_block(p, bl, Call::forward, "cpu_fold_block");
  const bool symmetric = p.loss == Loss::symmetric;
  if (row_state == nullptr || symmetric != (col_state != nullptr))
    invalid("cpu_fold_block: row states, and column states exactly when the loss is symmetric");
  void *base = aligned_base(workspace);
  fold_walk(p, bl, region<float>(base, p.panel), region<State>(base, p.row_parts),
            symmetric ? region<State>(base, p.col_parts) : nullptr, row_state, col_state);
}

void cpu_gradient_block(const PanelPlan &p, const CpuBlock &bl, const float *row_lse, const float *col_lse,
                        void *workspace, float *dq_acc, float *dk_acc, double *ds_rows) {
  check_block(p, bl, Call::backward, "cpu_gradient_block");
  if (row_lse == nullptr || (p.loss == Loss::symmetric && col_lse == nullptr))
    invalid("cpu_gradient_block: row_lse, and col_lse when the loss is symmetric");
  RowsWalkTargets to;
  to.dq_rows = dq_acc, to.dk = dk_acc;
  RowSums sums;
  sums.ds = ds_rows;
  rows_walk(p, bl, 0.0f, row_lse, col_lse, region<float>(aligned_base(workspace), p.panel), sums, to,
            [](std::int64_t) {});
}

}  // namespace flatmem::contrastive::panels
