// Backward ring on kDLCUDA tensors: the schedule of ring_backward.cpp with the
// CUDA gradient passes. Per step, on the caller's stream, for (q_r, block o)
// with the global row_lse and the block's col_lse (carried with it):
//  - the dq pass adds s g / N G k_o into this rank's fp32 dq accumulator
//    (out_accumulate), with ds's row-tile partials when dq is the first pass;
//  - the dk pass writes block o's partial dk (fp32) into the relayed item.
// Positives use global indices (PairIndex). ds: per step the ordered sum of
// the partials, added to a device total; after the ring one synchronisation,
// the sum over the ranks on the host, then dq, dk and ds are stored.
// With the panel engine forced (FLATMEM_CUDA_ENGINE=panels; not yet run on a
// GPU) a step is one panel walk (panels/cuda/engine.hpp, gradient_block): Gt
// once per panel, then Gt K into the unscaled dq accumulator and Gt^T Q into
// the block's unscaled partial dk, and each row's ds sum; dq and dk are
// scaled by s g / N when stored.
#include <optional>

#include "contrastive/cuda/dispatch.hpp"
#include "contrastive/cuda/kernels.hpp"
#include "contrastive/handle.hpp"
#include "contrastive/panels/cuda/engine.hpp"
#include "contrastive/ring/blocks.hpp"
#include "contrastive/ring/cuda/nccl_transport.hpp"
#include "contrastive/ring/cuda/ring_cuda.hpp"
#include "contrastive/ring/cuda/support.hpp"
#include "core/cuda/device.hpp"
#include "core/workspace.hpp"

namespace flatmem::contrastive::ring {
namespace {

namespace kc = contrastive::cuda;
using flatmem::cuda::check_launch;

struct BackwardDeviceBuffers {
  void *blocks[2] = {};
  float *column_lse[2] = {};
  float *dq = nullptr;             // (b, d) fp32 accumulator
  float *dk_fresh = nullptr;       // this rank's share of the block's dk
  float *dk_partial[2] = {};
  float *slots = nullptr;          // the passes' per-CTA accumulators
  double *ds_partial = nullptr, *ds_total = nullptr;
  double *ds_rows = nullptr;       // panels: each row's sum of Gt raw over the blocks
  void *panel_space = nullptr;     // panels: the engine's workspace
};

BackwardDeviceBuffers carve(WorkspaceCarver &carver, const Layout &l, const Inputs &in,
                            const BackwardArgs &args, int multiprocessors, const panels::PanelPlan *plan) {
  BackwardDeviceBuffers f;
  const bool symmetric = in.loss == Loss::symmetric;
  const std::int64_t d = in.d(), dk_floats = l.max_cols * d;
  for (int i = 0; i < 2; ++i) {
    if (l.ranks > 1) {
      f.blocks[i] = carver.take<char>(std::int64_t(block_bytes(l.max_cols, in.k)));
      if (symmetric) f.column_lse[i] = carver.take<float>(l.max_cols);
    }
    if (args.dk.data) f.dk_partial[i] = carver.take<float>(dk_floats);
  }
  if (args.dq.data) f.dq = carver.take<float>(in.b() * d);
  if (args.dk.data) f.dk_fresh = carver.take<float>(dk_floats);
  if (plan != nullptr) {
    f.ds_rows = carver.take<double>(in.b());
    f.panel_space = carver.take<char>(std::int64_t(plan->bytes));
  } else {
    const int grid =
        std::max(kc::pass_grid(in.b(), multiprocessors), kc::pass_grid(l.max_cols, multiprocessors));
    f.slots = carver.take<float>(std::int64_t(grid) * kc::tile_rows * kc::slot_pitch(d));
    f.ds_partial = carver.take<double>(std::max(kc::ceil_div(in.b(), kc::tile_rows),
                                                kc::ceil_div(l.max_cols, kc::tile_rows)));
  }
  f.ds_total = carver.take<double>(1);
  return f;
}

}  // namespace

void run_backward_cuda(flatmem_contrastive_s &h, comm::Communicator &comm, const Layout &l,
                       const Inputs &in, const BackwardArgs &args, void *stream_handle, Stats &stats) {
  const bool symmetric = in.loss == Loss::symmetric;
  const bool want_dq = args.dq.data != nullptr, want_dk = args.dk.data != nullptr;
  cuda_ring::Call call(h, comm, in, stream_handle, "contrastive backward ring", stats);
  const int multiprocessors = call.multiprocessors;
  // The panel engine only when forced: its ring blocks have not run on a GPU yet. Its plan lends
  // the panel and cuBLASLt's workspace; the accumulators are the ring's.
  std::optional<panels::PanelPlan> plan;
  if (h.options.cuda_engine == CudaEngine::panels)
    plan = panels::plan_backward(in.b(), l.max_cols, in.d(), in.loss, false, false, false, h.options.panel_budget,
                                 {h.options.panel_rows, h.options.panel_cols});
  const BackwardDeviceBuffers buf = call.carve(
      [&](WorkspaceCarver &c) { return carve(c, l, in, args, multiprocessors, plan ? &*plan : nullptr); });
  const cudaStream_t stream = call.stream;
  const kc::Operand op = call.op;
  const std::int64_t b = in.b(), d = in.d();

  if (want_dq)
    check_launch(cudaMemsetAsync(buf.dq, 0, std::size_t(b * d) * sizeof(float), stream), "zeroing dq");
  if (plan && args.dscale)
    check_launch(cudaMemsetAsync(buf.ds_rows, 0, std::size_t(b) * sizeof(double), stream), "zeroing the ds rows");
  const MatrixView own = call.own_block(in.k, l.ranks, buf.blocks[0]);
  std::vector<Carried> carried{
      Carried{Message::column_block, own.data, {buf.blocks[0], buf.blocks[1]}, block_bytes(1, in.k)}};
  if (symmetric)  // args.col_lse is contiguous (c,)
    carried.push_back(Carried{Message::column_lse, args.col_lse, {buf.column_lse[0], buf.column_lse[1]},
                              sizeof(float)});
  Schedule schedule(call.transport, l, std::move(carried),
                    cuda_ring::relayed_dk(buf.dk_fresh, buf.dk_partial, d, stream));

  kc::PassParams common;
  common.scale = in.scale_data;
  common.dloss = args.dloss_data;
  common.inv_n = 1.0 / (symmetric ? 2.0 * double(l.global_rows) : double(l.global_rows));
  common.labels = in.labels;
  common.pairs.label_bound = l.global_cols;
  common.positive_weight = symmetric ? 2.0f : 1.0f;
  common.slots = buf.slots;
  common.slot_pitch = kc::slot_pitch(d);
  // ds comes from the first pass that runs (one without output when only ds is wanted)
  const bool dq_pass = want_dq || !want_dk;
  schedule.run([&](const Step &step) {
    const MatrixView block =
        step.t == 0 ? own : block_view(const_cast<void *>(step.carried[0]), step.cols, in.k);
    const auto *block_lse = symmetric ? static_cast<const float *>(step.carried[1]) : nullptr;
    if (plan) {
      Inputs mine = in;
      mine.k = block;
      mine.col_offset = step.col_offset;
      panels::cuda::gradient_block(panels::narrowed(*plan, step.cols), h.options, mine, l.global_cols,
                                   args.row_lse, block_lse, want_dq ? buf.dq : nullptr,
                                   want_dk ? buf.dk_fresh : nullptr, args.dscale ? buf.ds_rows : nullptr,
                                   buf.panel_space, stream);
      return;
    }
    if (dq_pass) {
      kc::PassParams p = common;
      cuda_ring::row_side(p, in, block, step.col_offset);
      p.lse_rows = args.row_lse;
      p.lse_cols = block_lse;
      if (want_dq) cuda_ring::output_to(p, buf.dq, d, true);
      p.ds_partial = args.dscale ? buf.ds_partial : nullptr;
      check_launch(kc::launch_pass_for(op, p, kc::pass_grid(b, multiprocessors), stream),
                   "launching the dq pass");
      if (args.dscale)
        check_launch(kc::launch_partial_sum(buf.ds_partial, int(kc::ceil_div(b, kc::tile_rows)), buf.ds_total,
                                            step.t > 0, stream),
                     "launching the ds sum");
    }
    if (want_dk) {
      kc::PassParams p = common;
      cuda_ring::column_side(p, in, block, step.col_offset);
      p.lse_rows = block_lse;
      p.lse_cols = args.row_lse;
      cuda_ring::output_to(p, buf.dk_fresh, d, false);
      p.ds_partial = args.dscale && !dq_pass ? buf.ds_partial : nullptr;
      check_launch(kc::launch_pass_for(op, p, kc::pass_grid(step.cols, multiprocessors), stream),
                   "launching the dk pass");
      if (args.dscale && !dq_pass)
        check_launch(kc::launch_partial_sum(buf.ds_partial, int(kc::ceil_div(step.cols, kc::tile_rows)),
                                            buf.ds_total, step.t > 0, stream),
                     "launching the ds sum");
    }
  });

  if (plan && args.dscale)
    check_launch(kc::launch_partial_sum(buf.ds_rows, int(b), buf.ds_total, false, stream), "launching the ds sum");
  double mine = 0.0, everyone = 0.0;
  call.finish_and_read(buf.ds_total, &mine, args.dscale ? 1 : 0);
  comm.all_reduce_sum(&mine, &everyone, 1, comm::SumType::f64, comm.default_timeout(),
                      "contrastive backward ring: summing dL/ds over the ranks");

  // every message has arrived: the outputs
  if (plan) {
    if (want_dq) panels::cuda::store_gradient(buf.dq, b, args.dq, in.scale_data, args.dloss_data, common.inv_n, stream);
    if (want_dk)
      panels::cuda::store_gradient(static_cast<const float *>(schedule.relayed_result()), in.c(), args.dk,
                                   in.scale_data, args.dloss_data, common.inv_n, stream);
  } else if (want_dq)
    check_launch(kc::launch_store_accumulator(buf.dq, b, d, args.dq.data, args.dq.row_stride,
                                              kc::out_type_for(args.dq.dtype), stream),
                 "storing dq");
  if (want_dk && !plan)
    check_launch(kc::launch_store_accumulator(static_cast<const float *>(schedule.relayed_result()), in.c(), d,
                                              args.dk.data, args.dk.row_stride, kc::out_type_for(args.dk.dtype),
                                              stream),
                 "storing dk");
  if (args.dscale)
    check_launch(kc::launch_store_scalar(args.dscale, float(double(args.dloss) * common.inv_n * everyone), stream),
                 "storing dlogit_scale");
}

}  // namespace flatmem::contrastive::ring
