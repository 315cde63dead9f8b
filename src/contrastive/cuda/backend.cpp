// Host side of the CUDA backend: workspace layout (carved by one function per
// call, so that the size query and the call agree by construction), pointer
// checks, and the kernel sequence of each call, all on the caller's stream.
//
// forward:  forward_tiles -> forward_finish -> loss_sum
// backward: [dq pass] -> [dk pass] -> [ds_sum]
// sigmoid:  [row pass] -> [column pass] -> [loss_sum] [ds_sum] [ds_sum for dt]
#include "contrastive/cuda/backend.hpp"

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <utility>

#include "contrastive/cuda/dispatch.hpp"
#include "contrastive/cuda/kernels.hpp"
#include "contrastive/panels/cuda/engine.hpp"
#include "contrastive/panels/plan.hpp"
#include "core/cuda/device.hpp"
#include "core/error.hpp"
#include "core/workspace.hpp"

namespace flatmem::contrastive::cuda {

using flatmem::cuda::check_device_pointer;
using flatmem::cuda::check_launch;
using flatmem::cuda::DeviceGuard;
using flatmem::cuda::multiprocessor_count;

namespace {

struct Named {
  const void *pointer;  // nullptr: not given (optional), nothing to check
  const char *name;
};

// The inputs every call reads (q, k, labels, s) and the call's own tensors:
// each given one must be memory of `device` (INVALID_ARGUMENT naming it).
void check_device_pointers(const Inputs &in, std::initializer_list<Named> own, int device) {
  check_device_pointer(in.q.data, "q", device);
  check_device_pointer(in.k.data, "k", device);
  if (in.labels) check_device_pointer(in.labels, "labels", device);
  check_device_pointer(in.scale_data, "logit_scale", device);
  for (const Named &n : own)
    if (n.pointer) check_device_pointer(n.pointer, n.name, device);
}

cudaStream_t stream_of(void *stream) { return static_cast<cudaStream_t>(stream); }

// --- forward -------------------------------------------------------------------

struct ForwardSpace {
  MaxSum *row_partial = nullptr, *col_partial = nullptr;
  double *loss_partial = nullptr;
};

ForwardSpace carve_forward(WorkspaceCarver &carver, std::int64_t b, std::int64_t c, Loss loss) {
  const ForwardGrid g = forward_grid(b, c);
  ForwardSpace s;
  s.row_partial = carver.take<MaxSum>(std::int64_t(g.col_groups) * b);
  if (loss == Loss::symmetric) s.col_partial = carver.take<MaxSum>(std::int64_t(g.row_groups) * c);
  s.loss_partial = carver.take<double>(g.finish_blocks);
  return s;
}

// --- backward ------------------------------------------------------------------

struct BackwardSpace {
  float *slots = nullptr;  // [grid][tile_rows][slot_pitch]
  double *ds_partial = nullptr;
};

BackwardSpace carve_backward(WorkspaceCarver &carver, const MatrixView &q, const MatrixView &k,
                             bool want_dq, bool want_dk, int multiprocessors) {
  BackwardSpace s;
  int grid = 0;
  if (want_dq) grid = std::max(grid, pass_grid(q.rows, multiprocessors));
  if (want_dk) grid = std::max(grid, pass_grid(k.rows, multiprocessors));
  if (grid > 0) s.slots = carver.take<float>(std::int64_t(grid) * tile_rows * slot_pitch(q.cols));
  s.ds_partial = carver.take<double>(std::max(ceil_div(q.rows, tile_rows), ceil_div(k.rows, tile_rows)));
  return s;
}

void check_workspace(void *workspace, std::size_t given, std::size_t needed, int device) {
  if (workspace == nullptr)
    invalid("workspace: NULL with kDLCUDA tensors; the CUDA backend never allocates: pass a device "
            "buffer of the *_workspace_size bytes (",
            needed, " here)");
  if (given < needed)
    fail(FLATMEM_STATUS_WORKSPACE_TOO_SMALL, "workspace: ", given, " bytes given; ", needed,
         " bytes needed (ask the *_workspace_size function)");
  check_device_pointer(workspace, "workspace", device);
}

// --- sigmoid -------------------------------------------------------------------

// The row pass (rows = q) runs for dq, and for the scalars when dk is not
// wanted; the column pass (rows = k) for dk. The sums come from the first.
struct SigmoidPasses {
  bool row = false, col = false;
};
SigmoidPasses sigmoid_passes(bool want_dq, bool want_dk) { return {want_dq || !want_dk, want_dk}; }

struct SigmoidSpace {
  BackwardSpace grad;  // slots, ds_partial
  double *loss_partial = nullptr, *dt_partial = nullptr;
};

SigmoidSpace carve_sigmoid(WorkspaceCarver &carver, const MatrixView &q, const MatrixView &k,
                           bool want_dq, bool want_dk, int multiprocessors) {
  SigmoidSpace s;
  s.grad = carve_backward(carver, q, k, want_dq, want_dk, multiprocessors);
  const std::int64_t partials = std::max(ceil_div(q.rows, tile_rows), ceil_div(k.rows, tile_rows));
  s.loss_partial = carver.take<double>(partials);
  s.dt_partial = carver.take<double>(partials);
  return s;
}

}  // namespace

namespace {

// The panel engine's plans for a call (panels::use_panels decided it runs).
panels::PanelPlan forward_plan(const Options &options, const MatrixView &q, const MatrixView &k) {
  return panels::plan_forward(q.rows, k.rows, q.cols, options.loss, options.panel_budget,
                              {options.panel_rows, options.panel_cols});
}
panels::PanelPlan backward_plan(const Options &options, const MatrixView &q, const MatrixView &k, bool want_dq,
                                bool want_dk) {
  // ds is always planned for: the size query does not know whether it is wanted.
  return panels::plan_backward(q.rows, k.rows, q.cols, options.loss, want_dq, want_dk, true, options.panel_budget,
                               {options.panel_rows, options.panel_cols});
}
bool panels_run(const Options &options, const MatrixView &q, const MatrixView &k) {
  const bool bf16 = q.dtype == Dtype::bf16;
  // The device is asked only when its answer matters.
  const bool ask = options.cuda_engine == CudaEngine::automatic && options.loss != Loss::sigmoid && bf16 &&
                   q.rows >= panels::auto_min_extent && k.rows >= panels::auto_min_extent;
  const int sm_major = ask ? flatmem::cuda::compute_capability_major(q.device.device_id) : 0;
  return panels::use_panels(options.cuda_engine, options.loss, bf16, q.rows, k.rows, sm_major);
}

}  // namespace

std::size_t forward_workspace_bytes(const Options &options, const MatrixView &q, const MatrixView &k) {
  if (panels_run(options, q, k)) return forward_plan(options, q, k).bytes;
  const Loss loss = options.loss;
  WorkspaceCarver measure;
  carve_forward(measure, q.rows, k.rows, loss);
  return measure.bytes();
}

std::size_t backward_workspace_bytes(const Options &options, const MatrixView &q, const MatrixView &k,
                                     bool want_dq, bool want_dk) {
  if (panels_run(options, q, k)) return backward_plan(options, q, k, want_dq, want_dk).bytes;
  const int device = q.device.device_id;
  WorkspaceCarver measure;
  carve_backward(measure, q, k, want_dq, want_dk, multiprocessor_count(device));
  return measure.bytes();
}

void forward(const Options &options, const Inputs &in, const ForwardOutputs &out, void *workspace,
             std::size_t workspace_bytes, void *stream) {
  const int device = in.q.device.device_id;
  DeviceGuard guard(device);
  check_device_pointers(in, {{out.loss, "loss"}, {out.row_lse, "row_lse"}, {out.col_lse, "col_lse"}},
                        device);
  if (panels_run(options, in.q, in.k)) {
    const panels::PanelPlan plan = forward_plan(options, in.q, in.k);
    check_workspace(workspace, workspace_bytes, plan.bytes, device);
    panels::cuda::forward(plan, options, in, out, workspace, stream);
    return;
  }
  check_workspace(workspace, workspace_bytes, forward_workspace_bytes(options, in.q, in.k), device);

  WorkspaceCarver carver(workspace);
  const ForwardSpace space = carve_forward(carver, in.b(), in.c(), in.loss);
  const ForwardGrid grid = forward_grid(in.b(), in.c());
  const Operand op = operand_for(in.q.dtype, options.fp32_precision);
  const bool symmetric = in.loss == Loss::symmetric;
  cudaStream_t s = stream_of(stream);

  ForwardTileParams tiles;
  tiles.q = device_matrix(in.q);
  tiles.k = device_matrix(in.k);
  tiles.scale = in.scale_data;
  tiles.symmetric = symmetric;
  tiles.row_groups = grid.row_groups;
  tiles.col_groups = grid.col_groups;
  tiles.row_partial = space.row_partial;
  tiles.col_partial = space.col_partial;
  check_launch(launch_tiles_for(op, tiles, s), "launching the forward tile kernel");

  ForwardFinishParams finish;
  finish.q = tiles.q;
  finish.k = tiles.k;
  finish.scale = in.scale_data;
  finish.labels = in.labels;
  finish.symmetric = symmetric;
  finish.tf32_positive = op == Operand::tf32;
  finish.row_groups = grid.row_groups;
  finish.col_groups = grid.col_groups;
  finish.row_partial = space.row_partial;
  finish.col_partial = space.col_partial;
  finish.row_lse = out.row_lse;
  finish.col_lse = out.col_lse;
  finish.loss_partial = space.loss_partial;
  check_launch(launch_forward_finish(finish, op, grid.finish_blocks, s),
               "launching the forward finish kernel");

  LossSumParams sum;
  sum.partial = space.loss_partial;
  sum.count = grid.finish_blocks;
  sum.inv_count = 1.0 / (symmetric ? 2.0 * double(in.b()) : double(in.b()));
  sum.loss = out.loss;
  check_launch(launch_loss_sum(sum, s), "launching the loss sum kernel");
}

void backward(const Options &options, const Inputs &in, const BackwardArgs &args, void *workspace,
              std::size_t workspace_bytes, void *stream) {
  const int device = in.q.device.device_id;
  DeviceGuard guard(device);
  const bool want_dq = args.dq.data != nullptr, want_dk = args.dk.data != nullptr;
  check_device_pointers(in, {{args.row_lse, "row_lse"}, {args.col_lse, "col_lse"},
                            {args.dloss_data, "dloss"}, {args.dq.data, "dq"}, {args.dk.data, "dk"},
                            {args.dscale, "dlogit_scale"}},
                        device);
  if (panels_run(options, in.q, in.k)) {
    const panels::PanelPlan plan = backward_plan(options, in.q, in.k, want_dq, want_dk);
    check_workspace(workspace, workspace_bytes, plan.bytes, device);
    panels::cuda::backward(plan, options, in, args, workspace, stream);
    return;
  }
  const int multiprocessors = multiprocessor_count(device);
  WorkspaceCarver measure;
  carve_backward(measure, in.q, in.k, want_dq, want_dk, multiprocessors);
  check_workspace(workspace, workspace_bytes, measure.bytes(), device);

  WorkspaceCarver carver(workspace);
  const BackwardSpace space = carve_backward(carver, in.q, in.k, want_dq, want_dk, multiprocessors);
  const Operand op = operand_for(in.q.dtype, options.fp32_precision);
  const bool symmetric = in.loss == Loss::symmetric;
  cudaStream_t s = stream_of(stream);

  PassParams common;
  common.scale = in.scale_data;
  common.dloss = args.dloss_data;
  common.inv_n = 1.0 / (symmetric ? 2.0 * double(in.b()) : double(in.b()));
  common.labels = in.labels;
  common.pairs.label_bound = in.c();
  common.positive_weight = symmetric ? 2.0f : 1.0f;
  common.slots = space.slots;
  common.slot_pitch = slot_pitch(in.d());

  // ds comes from the first pass that runs (a pass without output when only ds is wanted).
  const bool dq_pass = want_dq || !want_dk;
  if (dq_pass) {
    PassParams p = common;
    p.rows = device_matrix(in.q);
    p.cols = device_matrix(in.k);
    p.lse_rows = args.row_lse;
    p.lse_cols = symmetric ? args.col_lse : nullptr;
    p.label_side = in.labels ? LabelSide::of_row : LabelSide::identity;
    if (want_dq) {
      p.out = args.dq.data;
      p.out_ld = args.dq.row_stride;
      p.out_type = out_type_for(args.dq.dtype);
    }
    p.ds_partial = args.dscale ? space.ds_partial : nullptr;
    check_launch(launch_pass_for(op, p, pass_grid(in.b(), multiprocessors), s),
                 "launching the dq pass");
  }
  if (want_dk) {
    PassParams p = common;
    p.rows = device_matrix(in.k);
    p.cols = device_matrix(in.q);
    p.lse_rows = symmetric ? args.col_lse : nullptr;
    p.lse_cols = args.row_lse;
    p.label_side = in.labels ? LabelSide::of_col : LabelSide::identity;
    p.out = args.dk.data;
    p.out_ld = args.dk.row_stride;
    p.out_type = out_type_for(args.dk.dtype);
    p.ds_partial = args.dscale && !dq_pass ? space.ds_partial : nullptr;
    check_launch(launch_pass_for(op, p, pass_grid(in.c(), multiprocessors), s),
                 "launching the dk pass");
  }
  if (args.dscale) {
    DsSumParams sum;
    sum.partial = space.ds_partial;
    sum.count = int(ceil_div(dq_pass ? in.b() : in.c(), tile_rows));
    sum.inv_n = common.inv_n;
    sum.dloss = args.dloss_data;
    sum.dscale = args.dscale;
    check_launch(launch_ds_sum(sum, s), "launching the ds sum kernel");
  }
}

std::size_t sigmoid_workspace_bytes(const Options &options, const MatrixView &q, const MatrixView &k,
                                    bool want_dq, bool want_dk) {
  if (panels_run(options, q, k)) return backward_plan(options, q, k, want_dq, want_dk).bytes;
  WorkspaceCarver measure;
  carve_sigmoid(measure, q, k, want_dq, want_dk, multiprocessor_count(q.device.device_id));
  return measure.bytes();
}

void sigmoid(const Options &options, const Inputs &in, const SigmoidArgs &args,
             void *workspace, std::size_t workspace_bytes, void *stream) {
  const int device = in.q.device.device_id;
  DeviceGuard guard(device);
  const bool want_dq = args.dq.data != nullptr, want_dk = args.dk.data != nullptr;
  check_device_pointers(in, {{args.bias_data, "logit_bias"}, {args.dloss_data, "dloss"},
                            {args.loss, "loss"}, {args.dq.data, "dq"}, {args.dk.data, "dk"},
                            {args.dscale, "dlogit_scale"}, {args.dbias, "dlogit_bias"}},
                        device);
  if (panels_run(options, in.q, in.k)) {
    const panels::PanelPlan plan = backward_plan(options, in.q, in.k, want_dq, want_dk);
    check_workspace(workspace, workspace_bytes, plan.bytes, device);
    panels::cuda::sigmoid(plan, options, in, args, workspace, stream);
    return;
  }
  const int multiprocessors = multiprocessor_count(device);
  WorkspaceCarver measure;
  carve_sigmoid(measure, in.q, in.k, want_dq, want_dk, multiprocessors);
  check_workspace(workspace, workspace_bytes, measure.bytes(), device);

  WorkspaceCarver carver(workspace);
  const SigmoidSpace space = carve_sigmoid(carver, in.q, in.k, want_dq, want_dk, multiprocessors);
  const Operand op = operand_for(in.q.dtype, options.fp32_precision);
  const SigmoidPasses passes = sigmoid_passes(want_dq, want_dk);
  cudaStream_t s = stream_of(stream);

  SigmoidPassParams common;
  common.scale = in.scale_data;
  common.bias = args.bias_data;
  common.dloss = args.dloss_data;
  common.inv_n = 1.0 / double(in.b());
  common.labels = in.labels;
  common.pairs.label_bound = in.c();
  common.slots = space.grad.slots;
  common.slot_pitch = slot_pitch(in.d());
  // The sums of the first pass that runs (row tiles of its output side).
  const auto with_sums = [&](SigmoidPassParams &p) {
    if (args.loss) p.loss_partial = space.loss_partial;
    if (args.dscale) p.ds_partial = space.grad.ds_partial;
    if (args.dbias) p.dt_partial = space.dt_partial;
  };
  const auto with_output = [](SigmoidPassParams &p, const MatrixView &out) {
    p.out = out.data;
    p.out_ld = out.row_stride;
    p.out_type = out_type_for(out.dtype);
  };

  if (passes.row) {
    SigmoidPassParams p = common;
    p.rows = device_matrix(in.q);
    p.cols = device_matrix(in.k);
    p.label_side = in.labels ? LabelSide::of_row : LabelSide::identity;
    if (want_dq) with_output(p, args.dq);
    with_sums(p);
    check_launch(launch_sigmoid_for(op, p, pass_grid(in.b(), multiprocessors), s),
                 "launching the sigmoid row pass");
  }
  if (passes.col) {
    SigmoidPassParams p = common;
    p.rows = device_matrix(in.k);
    p.cols = device_matrix(in.q);
    p.label_side = in.labels ? LabelSide::of_col : LabelSide::identity;
    with_output(p, args.dk);
    if (!passes.row) with_sums(p);
    check_launch(launch_sigmoid_for(op, p, pass_grid(in.c(), multiprocessors), s),
                 "launching the sigmoid column pass");
  }
  const int partials = int(ceil_div(passes.row ? in.b() : in.c(), tile_rows));
  if (args.loss) {
    LossSumParams sum;
    sum.partial = space.loss_partial;
    sum.count = partials;
    sum.inv_count = common.inv_n;
    sum.loss = args.loss;
    check_launch(launch_loss_sum(sum, s), "launching the sigmoid loss sum kernel");
  }
  // ds and dt: the same sum g / b * (sum of partials), over different partials.
  const std::pair<double *, float *> scalars[] = {{space.grad.ds_partial, args.dscale},
                                                  {space.dt_partial, args.dbias}};
  for (const auto &[partial, result] : scalars) {
    if (!result) continue;
    DsSumParams sum;
    sum.partial = partial;
    sum.count = partials;
    sum.inv_n = common.inv_n;
    sum.dloss = args.dloss_data;
    sum.dscale = result;
    check_launch(launch_ds_sum(sum, s), "launching the sigmoid ds / dt sum kernel");
  }
}

}  // namespace flatmem::contrastive::cuda
