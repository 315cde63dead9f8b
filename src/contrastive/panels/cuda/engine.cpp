#include "contrastive/panels/cuda/engine.hpp"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <utility>

#include "contrastive/cuda/dispatch.hpp"
#include "contrastive/cuda/kernels.hpp"
#include "contrastive/panels/cuda/kernels.hpp"
#include "core/cuda/device.hpp"
#include "core/cuda/lt_matmul.hpp"
#include "core/error.hpp"

namespace flatmem::contrastive::panels::cuda {
namespace {

namespace lt = flatmem::cuda::lt;
namespace tiles = flatmem::contrastive::cuda;
using flatmem::cuda::check_launch;

template <class T>
T *region(char *base, const Region &r) {
  return r.bytes == 0 ? nullptr : reinterpret_cast<T *>(base + r.offset);
}

char *aligned_base(void *workspace) {
  const auto address = reinterpret_cast<std::uintptr_t>(workspace);
  return static_cast<char *>(workspace) + (lt_alignment - address % lt_alignment) % lt_alignment;
}

lt::Type lt_type(Dtype t) { return t == Dtype::bf16 ? lt::Type::bf16 : t == Dtype::f16 ? lt::Type::f16 : lt::Type::f32; }
GType g_type(Dtype t) { return t == Dtype::bf16 ? GType::bf16 : t == Dtype::f16 ? GType::f16 : GType::f32; }

// Rows [first, first + count) of a feature matrix as a GEMM operand.
lt::MatrixArg rows_of(const MatrixView &m, std::int64_t first, bool transposed) {
  lt::MatrixArg a;
  a.data = m.data + first * m.row_stride * std::int64_t(dtype_bytes(m.dtype));
  a.type = lt_type(m.dtype);
  a.ld = m.row_stride;
  a.transposed = transposed;
  return a;
}

struct Walk {
  const PanelPlan &plan;
  const Inputs &in;
  lt::Context lt;
  cudaStream_t stream;
  float *panel;

  // panel = Q_I K_J^T (raw <q, k>, fp32, pitch plan.cols).
  void logits(std::int64_t i, std::int64_t j) const {
    lt::Gemm g;
    g.m = plan.row_count(i), g.n = plan.col_count(j), g.k = plan.d;
    g.a = rows_of(in.q, plan.row_begin(i), false);
    g.b = rows_of(in.k, plan.col_begin(j), true);
    g.c = panel, g.ldc = plan.cols;
    lt::matmul(lt, g);
  }

  // Gt as a GEMM operand: rows x cols at the pitch of its element type.
  lt::MatrixArg gradient_operand(bool transposed) const {
    lt::MatrixArg a;
    a.data = panel;
    a.type = lt_type(in.q.dtype);
    a.ld = a.type == lt::Type::f32 ? plan.cols : 2 * plan.cols;
    a.transposed = transposed;
    return a;
  }

  // acc (rows x d, dense fp32) (+)= Gt K_J  (rows = R_I)
  void times_k(std::int64_t i, std::int64_t j, float *acc, bool first) const {
    lt::Gemm g;
    g.m = plan.row_count(i), g.n = plan.d, g.k = plan.col_count(j);
    g.a = gradient_operand(false);
    g.b = rows_of(in.k, plan.col_begin(j), false);
    g.c = acc, g.ldc = plan.d, g.beta = first ? 0.0f : 1.0f;
    lt::matmul(lt, g);
  }

  // acc (cols x d, dense fp32) (+)= Gt^T Q_I  (cols = C_J)
  void times_q(std::int64_t i, std::int64_t j, float *acc, bool first) const {
    lt::Gemm g;
    g.m = plan.col_count(j), g.n = plan.d, g.k = plan.row_count(i);
    g.a = gradient_operand(true);
    g.b = rows_of(in.q, plan.row_begin(i), false);
    g.c = acc, g.ldc = plan.d, g.beta = first ? 0.0f : 1.0f;
    lt::matmul(lt, g);
  }
};

Walk make_walk(const PanelPlan &plan, const Options &options, const Inputs &in, char *base, void *stream) {
  lt::Context c;
  c.device = in.q.device.device_id;
  c.tf32 = options.fp32_precision != Fp32Precision::full;
  c.fixed_order = true;
  c.stream = static_cast<cudaStream_t>(stream);
  c.workspace = region<char>(base, plan.lt);
  c.workspace_bytes = plan.lt.bytes;
  return Walk{plan, in, c, c.stream, region<float>(base, plan.panel)};
}

}  // namespace

namespace {

// Every panel of the forward walk: P, its fold, the merge of its parts into
// row_state / col_state (col_state nullptr: InfoNCE), in walk order.
void fold_panels(const PanelPlan &plan, const Walk &w, const Inputs &in, char *base, State *row_state,
                 State *col_state) {
  const bool symmetric = plan.loss == Loss::symmetric;
  State *row_parts = region<State>(base, plan.row_parts), *col_parts = region<State>(base, plan.col_parts);
  for (std::int64_t i = 0; i < plan.row_panels; ++i)
    for (std::int64_t j = 0; j < plan.col_panels; ++j) {
      w.logits(i, j);
      FoldParams f;
      f.panel = w.panel, f.pitch = plan.cols, f.rows = plan.row_count(i), f.cols = plan.col_count(j);
      f.scale = in.scale_data;
      f.row_parts = row_parts, f.col_parts = symmetric ? col_parts : nullptr;
      f.row_folds = plan.row_folds, f.col_folds = plan.col_folds;
      check_launch(launch_fold(f, w.stream), "panels: launching the fold kernel");
      MergeParams m;
      m.row_parts = row_parts, m.col_parts = f.col_parts;
      m.rows = f.rows, m.cols = f.cols, m.row_folds = plan.row_folds, m.col_folds = plan.col_folds;
      m.row_state = row_state, m.col_state = col_state;
      m.row0 = plan.row_begin(i), m.col0 = plan.col_begin(j);
      check_launch(launch_merge(m, w.stream), "panels: launching the merge kernel");
    }
}

}  // namespace

void forward(const PanelPlan &plan, const Options &options, const Inputs &in, const ForwardOutputs &out,
             void *workspace, void *stream) {
  char *base = aligned_base(workspace);
  const Walk w = make_walk(plan, options, in, base, stream);
  const bool symmetric = plan.loss == Loss::symmetric;
  State *row_state = region<State>(base, plan.row_state), *col_state = region<State>(base, plan.col_state);
  check_launch(launch_reset(row_state, plan.b, w.stream), "panels: resetting the row states");
  if (symmetric) check_launch(launch_reset(col_state, plan.c, w.stream), "panels: resetting the column states");
  fold_panels(plan, w, in, base, row_state, symmetric ? col_state : nullptr);
  // The running states are the tile engine's partial states with one group each.
  const tiles::Operand op = tiles::operand_for(in.q.dtype, options.fp32_precision);
  tiles::ForwardFinishParams finish;
  finish.q = tiles::device_matrix(in.q);
  finish.k = tiles::device_matrix(in.k);
  finish.scale = in.scale_data;
  finish.labels = in.labels;
  finish.symmetric = symmetric;
  finish.tf32_positive = op == tiles::Operand::tf32;
  finish.row_groups = finish.col_groups = 1;
  static_assert(sizeof(State) == sizeof(tiles::MaxSum), "a State is the tiles' MaxSum");
  finish.row_partial = reinterpret_cast<const tiles::MaxSum *>(row_state);
  finish.col_partial = reinterpret_cast<const tiles::MaxSum *>(col_state);
  finish.row_lse = out.row_lse;
  finish.col_lse = out.col_lse;
  finish.loss_partial = region<double>(base, plan.loss_parts);
  const int blocks = int(finish_blocks(plan.b));
  check_launch(tiles::launch_forward_finish(finish, op, blocks, w.stream), "panels: launching the finish kernel");
  tiles::LossSumParams sum;
  sum.partial = finish.loss_partial;
  sum.count = blocks;
  sum.inv_count = 1.0 / (symmetric ? 2.0 * double(plan.b) : double(plan.b));
  sum.loss = out.loss;
  check_launch(tiles::launch_loss_sum(sum, w.stream), "panels: launching the loss sum kernel");
}

namespace {

// What a gradient walk reads and writes beyond the inputs: softmax (row_lse
// set) or sigmoid (bias set); each result nullptr when not wanted.
struct GradientJob {
  const float *row_lse = nullptr, *col_lse = nullptr;  // softmax
  const float *bias = nullptr;                         // sigmoid: device scalar t
  const float *dloss = nullptr;                        // nullptr: g = 1
  MatrixView dq, dk;                                   // data == nullptr: not wanted
  float *dscale = nullptr, *loss = nullptr, *dbias = nullptr;
};

void walk_gradients(const PanelPlan &plan, const Options &options, const Inputs &in, const GradientJob &job,
                    void *workspace, void *stream) {
  char *base = aligned_base(workspace);
  const Walk w = make_walk(plan, options, in, base, stream);
  const bool symmetric = plan.loss == Loss::symmetric, sigmoid = plan.loss == Loss::sigmoid;
  float *row_acc = region<float>(base, plan.row_acc), *col_acc = region<float>(base, plan.col_acc);
  const bool want_sums = job.dscale || job.loss || job.dbias;
  double *rows = want_sums ? region<double>(base, plan.ds_rows) : nullptr;
  if (want_sums && !rows) fail(FLATMEM_STATUS_INTERNAL, "panels: a plan without row sums for a call that wants them");
  const int kinds = sigmoid ? 3 : 1;
  if (rows)
    check_launch(cudaMemsetAsync(rows, 0, std::size_t(plan.b) * kinds * sizeof(double), w.stream),
                 "panels: clearing the row sums");
  const double inv_n = 1.0 / (symmetric ? 2.0 * double(plan.b) : double(plan.b));

  GradientParams gp;
  gp.panel = w.panel, gp.pitch = plan.cols, gp.c = plan.c, gp.symmetric = symmetric;
  gp.scale = in.scale_data, gp.row_lse = job.row_lse, gp.col_lse = symmetric ? job.col_lse : nullptr;
  gp.labels = in.labels, gp.g_type = g_type(in.q.dtype);
  gp.sigmoid = sigmoid, gp.bias = job.bias;
  const auto gradient = [&](std::int64_t i, std::int64_t j, bool sums) {
    GradientParams p = gp;
    p.rows = plan.row_count(i), p.cols = plan.col_count(j);
    p.row0 = plan.row_begin(i), p.col0 = plan.col_begin(j);
    if (sums && rows) {
      p.ds_rows = rows;
      if (sigmoid) p.loss_rows = rows + plan.b, p.dt_rows = rows + 2 * plan.b;
    }
    check_launch(launch_gradient(p, w.stream), "panels: launching the gradient pass");
  };
  const auto store = [&](const float *acc, std::int64_t count, const MatrixView &out, std::int64_t first) {
    StoreParams s;
    s.acc = acc, s.rows = count, s.d = plan.d;
    s.out = out.data + first * out.row_stride * std::int64_t(dtype_bytes(out.dtype));
    s.out_ld = out.row_stride, s.out_type = g_type(out.dtype);
    s.scale = in.scale_data, s.dloss = job.dloss, s.inv_n = inv_n;
    check_launch(launch_store(s, w.stream), "panels: launching the store kernel");
  };

  if (plan.rows_sweep) {
    for (std::int64_t i = 0; i < plan.row_panels; ++i) {
      for (std::int64_t j = 0; j < plan.col_panels; ++j) {
        w.logits(i, j);
        gradient(i, j, true);
        if (job.dq.data) w.times_k(i, j, row_acc, j == 0);
        if (plan.dk_resident && job.dk.data) w.times_q(i, j, col_acc + plan.col_begin(j) * plan.d, i == 0);
      }
      if (job.dq.data) store(row_acc, plan.row_count(i), job.dq, plan.row_begin(i));
    }
    if (plan.dk_resident && job.dk.data) store(col_acc, plan.c, job.dk, 0);
  }
  if (plan.cols_sweep && job.dk.data) {
    for (std::int64_t j = 0; j < plan.col_panels; ++j) {
      for (std::int64_t i = 0; i < plan.row_panels; ++i) {
        w.logits(i, j);
        gradient(i, j, !plan.rows_sweep);
        w.times_q(i, j, col_acc, i == 0);
      }
      store(col_acc, plan.col_count(j), job.dk, plan.col_begin(j));
    }
  }
  // The row sums in a fixed order: ds (and dt) as g / N * sum, the loss as sum / b.
  const std::pair<const double *, float *> scaled[] = {{rows, job.dscale},
                                                       {sigmoid && rows ? rows + 2 * plan.b : nullptr, job.dbias}};
  for (const auto &[partial, result] : scaled) {
    if (!result) continue;
    tiles::DsSumParams sum;
    sum.partial = partial;
    sum.count = int(plan.b);
    sum.inv_n = inv_n;
    sum.dloss = job.dloss;
    sum.dscale = result;
    check_launch(tiles::launch_ds_sum(sum, w.stream), "panels: launching the ds / dt sum kernel");
  }
  if (job.loss) {
    tiles::LossSumParams sum;
    sum.partial = rows + plan.b;
    sum.count = int(plan.b);
    sum.inv_count = inv_n;
    sum.loss = job.loss;
    check_launch(tiles::launch_loss_sum(sum, w.stream), "panels: launching the loss sum kernel");
  }
}

}  // namespace

void backward(const PanelPlan &plan, const Options &options, const Inputs &in, const BackwardArgs &args,
              void *workspace, void *stream) {
  GradientJob job;
  job.row_lse = args.row_lse, job.col_lse = args.col_lse, job.dloss = args.dloss_data;
  job.dq = args.dq, job.dk = args.dk, job.dscale = args.dscale;
  walk_gradients(plan, options, in, job, workspace, stream);
}

void sigmoid(const PanelPlan &plan, const Options &options, const Inputs &in, const SigmoidArgs &args,
             void *workspace, void *stream) {
  GradientJob job;
  job.bias = args.bias_data, job.dloss = args.dloss_data;
  job.dq = args.dq, job.dk = args.dk;
  job.dscale = args.dscale, job.loss = args.loss, job.dbias = args.dbias;
  walk_gradients(plan, options, in, job, workspace, stream);
}

void fold_block(const PanelPlan &plan, const Options &options, const Inputs &in, State *row_state,
                State *col_state, void *workspace, void *stream) {
  if (plan.call != Call::forward || plan.b != in.b() || plan.c != in.c())
    fail(FLATMEM_STATUS_INTERNAL, "panels: fold_block with a plan for another block");
  char *base = aligned_base(workspace);
  fold_panels(plan, make_walk(plan, options, in, base, stream), in, base, row_state,
              plan.loss == Loss::symmetric ? col_state : nullptr);
}

void gradient_block(const PanelPlan &plan, const Options &options, const Inputs &in, std::int64_t global_c,
                    const float *row_lse, const float *col_lse, float *dq_acc, float *dk_acc, double *ds_rows,
                    void *workspace, void *stream) {
  if (plan.call != Call::backward || plan.loss == Loss::sigmoid || plan.b != in.b() || plan.c != in.c())
    fail(FLATMEM_STATUS_INTERNAL, "panels: gradient_block with a plan for another block");
  char *base = aligned_base(workspace);
  const Walk w = make_walk(plan, options, in, base, stream);
  const bool symmetric = plan.loss == Loss::symmetric;
  GradientParams gp;
  gp.panel = w.panel, gp.pitch = plan.cols, gp.c = global_c, gp.symmetric = symmetric;
  gp.scale = in.scale_data, gp.row_lse = row_lse, gp.col_lse = symmetric ? col_lse : nullptr;
  gp.labels = in.labels, gp.g_type = g_type(in.q.dtype);
  gp.row_offset = in.row_offset, gp.col_offset = in.col_offset;
  gp.ds_rows = ds_rows;
  for (std::int64_t i = 0; i < plan.row_panels; ++i)
    for (std::int64_t j = 0; j < plan.col_panels; ++j) {
      w.logits(i, j);
      GradientParams p = gp;
      p.rows = plan.row_count(i), p.cols = plan.col_count(j);
      p.row0 = plan.row_begin(i), p.col0 = plan.col_begin(j);
      check_launch(launch_gradient(p, w.stream), "panels: launching the gradient pass");
      if (dq_acc) w.times_k(i, j, dq_acc + plan.row_begin(i) * plan.d, false);
      if (dk_acc) w.times_q(i, j, dk_acc + plan.col_begin(j) * plan.d, i == 0);
    }
}

void store_gradient(const float *acc, std::int64_t rows, const MatrixView &out, const float *scale,
                    const float *dloss, double inv_n, void *stream) {
  StoreParams s;
  s.acc = acc, s.rows = rows, s.d = out.cols;
  s.out = out.data, s.out_ld = out.row_stride, s.out_type = g_type(out.dtype);
  s.scale = scale, s.dloss = dloss, s.inv_n = inv_n;
  check_launch(launch_store(s, static_cast<cudaStream_t>(stream)), "panels: launching the store kernel");
}

}  // namespace flatmem::contrastive::panels::cuda
