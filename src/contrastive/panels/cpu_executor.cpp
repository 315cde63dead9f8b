// The CUDA engine's launch sequence (panels/cuda/engine.cpp), step for step,
// with sgemm in place of cuBLASLt and loops in place of the kernels.
#include "contrastive/panels/cpu_executor.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

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

// P (R_I x C_J, pitch plan.cols) = Q_I K_J^T, raw <q, k>.
void logits(const PanelPlan &p, const CpuProblem &pr, std::int64_t i, std::int64_t j, float *panel) {
  gemm::sgemm(pr.isa, Op::none, Op::transpose, p.row_count(i), p.col_count(j), p.d, 1.0f,
              pr.q + p.row_begin(i) * p.d, p.d, pr.k + p.col_begin(j) * p.d, p.d, 0.0f, panel, p.cols);
}

// forward: the fold kernel over every fold tile of panel (i, j), then the merge kernel.
void fold_and_merge(const PanelPlan &p, float s, std::int64_t i, std::int64_t j, const float *panel,
                    State *row_parts, State *col_parts, State *row_state, State *col_state) {
  const std::int64_t rows = p.row_count(i), cols = p.col_count(j);
  const std::int64_t row_tiles = (rows + fold_rows - 1) / fold_rows, col_tiles = (cols + fold_cols - 1) / fold_cols;
  for (std::int64_t fi = 0; fi < row_tiles; ++fi)
    for (std::int64_t fj = 0; fj < col_tiles; ++fj) {
      const float *tile = panel + fi * fold_rows * p.cols + fj * fold_cols;
      const int tr = int(std::min(fold_rows, rows - fi * fold_rows));
      const int tc = int(std::min(fold_cols, cols - fj * fold_cols));
      for (int r = 0; r < tr; ++r) {
        State a = fold_row_quarter(tile, p.cols, r, 0, tc, s), b = fold_row_quarter(tile, p.cols, r, 2, tc, s);
        merge(a, fold_row_quarter(tile, p.cols, r, 1, tc, s));
        merge(b, fold_row_quarter(tile, p.cols, r, 3, tc, s));
        merge(a, b);
        row_parts[(fi * fold_rows + r) * p.col_folds + fj] = a;
      }
      if (col_parts)
        for (int c = 0; c < tc; ++c) {
          State a = fold_col_half(tile, p.cols, c, 0, tr, s);
          merge(a, fold_col_half(tile, p.cols, c, 1, tr, s));
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

double lse_of(State st) { return double(st.max) + std::log(double(st.sum)); }

// The gradient pass over panel (i, j): Gt in place (rounded as the operand
// type), and each row's sum of Gt raw added to ds_rows (nullptr: not wanted).
void gradient_pass(const PanelPlan &p, const CpuProblem &pr, float s, const float *row_lse, const float *col_lse,
                   std::int64_t i, std::int64_t j, float *panel, double *ds_rows) {
  const std::int64_t rows = p.row_count(i), cols = p.col_count(j);
  EntryTerms t;
  t.symmetric = p.loss == Loss::symmetric;
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t row = p.row_begin(i) + r;
    t.row_lse = row_lse[row];
    float lane_ds[pass_lanes] = {};
    float *line = panel + r * p.cols;
    for (std::int64_t c = 0; c < cols; ++c) {
      const std::int64_t col = p.col_begin(j) + c;
      if (t.symmetric) t.col_lse = col_lse[col];
      t.positive = positive_of(pr.labels, row, col, p.c, &t.bad);
      const float raw = line[c];
      const float gt = gradient_entry(s * raw, t);
      lane_ds[(c % pass_chunk) / pass_vector] += gt * raw;
      line[c] = pr.g_bits == 16 ? bf16_to_f32(f32_to_bf16(gt)) : gt;
    }
    if (ds_rows) {
      double lanes[pass_lanes];
      for (int l = 0; l < pass_lanes; ++l) lanes[l] = lane_ds[l];
      for (int half = pass_lanes / 2; half > 0; half /= 2)
        for (int l = 0; l < half; ++l) lanes[l] += lanes[l + half];
      ds_rows[row] += lanes[0];
    }
  }
}

void store(const float *acc, std::int64_t rows, std::int64_t d, float mult, float *out) {
  for (std::int64_t e = 0; e < rows * d; ++e) out[e] = mult * acc[e];
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
  for (std::int64_t i = 0; i < p.row_panels; ++i)
    for (std::int64_t j = 0; j < p.col_panels; ++j) {
      logits(p, pr, i, j, panel);
      fold_and_merge(p, s, i, j, panel, row_parts, symmetric ? col_parts : nullptr, row_state, col_state);
    }
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

void cpu_backward(const PanelPlan &p, const CpuProblem &pr, const float *row_lse, const float *col_lse, float dloss,
                  void *workspace, float *dq, float *dk, float *dscale) {
  if (p.call != Call::backward) invalid("cpu_backward: a forward plan");
  void *base = aligned_base(workspace);
  float *panel = region<float>(base, p.panel);
  float *row_acc = region<float>(base, p.row_acc), *col_acc = region<float>(base, p.col_acc);
  double *ds_rows = region<double>(base, p.ds_rows);
  if (ds_rows) std::fill(ds_rows, ds_rows + p.b, 0.0);
  const float s = checked_scale(pr.scale);
  const double inv_n = 1.0 / (p.loss == Loss::symmetric ? 2.0 * double(p.b) : double(p.b));
  const float mult = float(double(s) * double(dloss) * inv_n);
  const cpu_isa::Isa isa = pr.isa;

  if (p.rows_sweep) {
    for (std::int64_t i = 0; i < p.row_panels; ++i) {
      for (std::int64_t j = 0; j < p.col_panels; ++j) {
        logits(p, pr, i, j, panel);
        gradient_pass(p, pr, s, row_lse, col_lse, i, j, panel, ds_rows);
        if (p.want_dq)
          gemm::sgemm(isa, Op::none, Op::none, p.row_count(i), p.d, p.col_count(j), 1.0f, panel, p.cols,
                      pr.k + p.col_begin(j) * p.d, p.d, j == 0 ? 0.0f : 1.0f, row_acc, p.d);
        if (p.dk_resident)
          gemm::sgemm(isa, Op::transpose, Op::none, p.col_count(j), p.d, p.row_count(i), 1.0f, panel, p.cols,
                      pr.q + p.row_begin(i) * p.d, p.d, i == 0 ? 0.0f : 1.0f, col_acc + p.col_begin(j) * p.d, p.d);
      }
      if (p.want_dq) store(row_acc, p.row_count(i), p.d, mult, dq + p.row_begin(i) * p.d);
    }
    if (p.dk_resident) store(col_acc, p.c, p.d, mult, dk);
  }
  if (p.cols_sweep) {
    double *ds = p.rows_sweep ? nullptr : ds_rows;
    for (std::int64_t j = 0; j < p.col_panels; ++j) {
      for (std::int64_t i = 0; i < p.row_panels; ++i) {
        logits(p, pr, i, j, panel);
        gradient_pass(p, pr, s, row_lse, col_lse, i, j, panel, ds);
        gemm::sgemm(isa, Op::transpose, Op::none, p.col_count(j), p.d, p.row_count(i), 1.0f, panel, p.cols,
                    pr.q + p.row_begin(i) * p.d, p.d, i == 0 ? 0.0f : 1.0f, col_acc, p.d);
      }
      store(col_acc, p.col_count(j), p.d, mult, dk + p.col_begin(j) * p.d);
    }
  }
  if (p.want_ds) {
    double total = 0.0;
    for (std::int64_t r = 0; r < p.b; ++r) total += ds_rows[r];
    *dscale = float(double(dloss) * inv_n * total);
  }
}

}  // namespace flatmem::contrastive::panels
