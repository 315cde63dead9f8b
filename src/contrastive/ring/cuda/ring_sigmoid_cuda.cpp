// Sigmoid ring on kDLCUDA tensors: the schedule of ring_sigmoid.cpp with the
// CUDA sigmoid passes. Per step, on the caller's stream, for (q_r, block o):
// the row pass adds s g / B G k_o into this rank's fp32 dq accumulator and
// forms the row tiles' loss, ds and dt partials (or, when only dk is wanted,
// the column pass forms them); the column pass writes block o's partial dk
// (the relayed item). Per step the partials' ordered sums are added to three
// device totals; after the ring one synchronisation, the sums over the ranks
// on the host, then the outputs.
#include "contrastive/cuda/dispatch.hpp"
#include "contrastive/cuda/kernels.hpp"
#include "contrastive/handle.hpp"
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

struct SigmoidDeviceBuffers {
  void *blocks[2] = {};
  float *dq = nullptr;             // (b, d) fp32 accumulator
  float *dk_fresh = nullptr;
  float *dk_partial[2] = {};
  float *slots = nullptr;
  double *partials[3] = {};        // loss, ds, dt per row tile of the current pass
  double *totals = nullptr;        // loss, ds, dt over the steps
};

SigmoidDeviceBuffers carve(WorkspaceCarver &carver, const Layout &l, const Inputs &in,
                           const SigmoidArgs &args, int multiprocessors) {
  SigmoidDeviceBuffers f;
  const std::int64_t d = in.d(), dk_floats = l.max_cols * d;
  for (int i = 0; i < 2; ++i) {
    if (l.ranks > 1) f.blocks[i] = carver.take<char>(std::int64_t(block_bytes(l.max_cols, in.k)));
    if (args.dk.data) f.dk_partial[i] = carver.take<float>(dk_floats);
  }
  if (args.dq.data) f.dq = carver.take<float>(in.b() * d);
  if (args.dk.data) f.dk_fresh = carver.take<float>(dk_floats);
  const int grid = std::max(kc::pass_grid(in.b(), multiprocessors), kc::pass_grid(l.max_cols, multiprocessors));
  f.slots = carver.take<float>(std::int64_t(grid) * kc::tile_rows * kc::slot_pitch(d));
  const std::int64_t tiles = std::max(kc::ceil_div(in.b(), kc::tile_rows), kc::ceil_div(l.max_cols, kc::tile_rows));
  for (double *&p : f.partials) p = carver.take<double>(tiles);
  f.totals = carver.take<double>(3);
  return f;
}

}  // namespace

void run_sigmoid_cuda(flatmem_contrastive_s &h, comm::Communicator &comm, const Layout &l,
                      const Inputs &in, const SigmoidArgs &args, const char *phase,
                      void *stream_handle, Stats &stats) {
  const bool want_dq = args.dq.data != nullptr, want_dk = args.dk.data != nullptr;
  cuda_ring::Call call(h, comm, in, stream_handle, phase, stats);
  const int multiprocessors = call.multiprocessors;
  const SigmoidDeviceBuffers buf =
      call.carve([&](WorkspaceCarver &c) { return carve(c, l, in, args, multiprocessors); });
  const cudaStream_t stream = call.stream;
  const kc::Operand op = call.op;
  const std::int64_t b = in.b(), d = in.d();

  if (want_dq)
    check_launch(cudaMemsetAsync(buf.dq, 0, std::size_t(b * d) * sizeof(float), stream), "zeroing dq");
  check_launch(cudaMemsetAsync(buf.totals, 0, 3 * sizeof(double), stream), "zeroing the sums");
  const MatrixView own = call.own_block(in.k, l.ranks, buf.blocks[0]);
  Schedule schedule(call.transport, l,
                    {Carried{Message::column_block, own.data, {buf.blocks[0], buf.blocks[1]},
                             block_bytes(1, in.k)}},
                    cuda_ring::relayed_dk(buf.dk_fresh, buf.dk_partial, d, stream));

  kc::SigmoidPassParams common;
  common.scale = in.scale_data;
  common.bias = args.bias_data;
  common.dloss = args.dloss_data;
  common.inv_n = 1.0 / double(l.global_rows);
  common.labels = in.labels;
  common.pairs.label_bound = l.global_cols;
  common.slots = buf.slots;
  common.slot_pitch = kc::slot_pitch(d);
  const bool wanted[3] = {args.loss != nullptr, args.dscale != nullptr, args.dbias != nullptr};
  // the sums of the first pass that runs (row tiles of its output side), added to the totals
  const auto with_sums = [&](kc::SigmoidPassParams &p) {
    p.loss_partial = wanted[0] ? buf.partials[0] : nullptr;
    p.ds_partial = wanted[1] ? buf.partials[1] : nullptr;
    p.dt_partial = wanted[2] ? buf.partials[2] : nullptr;
  };
  const auto add_sums = [&](std::int64_t rows) {
    for (int i = 0; i < 3; ++i)
      if (wanted[i])
        check_launch(kc::launch_partial_sum(buf.partials[i], int(kc::ceil_div(rows, kc::tile_rows)),
                                            buf.totals + i, true, stream),
                     "launching the sigmoid sums");
  };
  const bool row_pass = want_dq || !want_dk;
  schedule.run([&](const Step &step) {
    const MatrixView block =
        step.t == 0 ? own : block_view(const_cast<void *>(step.carried[0]), step.cols, in.k);
    if (row_pass) {
      kc::SigmoidPassParams p = common;
      cuda_ring::row_side(p, in, block, step.col_offset);
      if (want_dq) cuda_ring::output_to(p, buf.dq, d, true);
      with_sums(p);
      check_launch(kc::launch_sigmoid_for(op, p, kc::pass_grid(b, multiprocessors), stream),
                   "launching the sigmoid row pass");
      add_sums(b);
    }
    if (want_dk) {
      kc::SigmoidPassParams p = common;
      cuda_ring::column_side(p, in, block, step.col_offset);
      cuda_ring::output_to(p, buf.dk_fresh, d, false);
      if (!row_pass) with_sums(p);
      check_launch(kc::launch_sigmoid_for(op, p, kc::pass_grid(step.cols, multiprocessors), stream),
                   "launching the sigmoid column pass");
      if (!row_pass) add_sums(step.cols);
    }
  });

  double mine[3] = {0.0, 0.0, 0.0}, everyone[3] = {0.0, 0.0, 0.0};
  call.finish_and_read(buf.totals, mine, 3);
  comm.all_reduce_sum(mine, everyone, 3, comm::SumType::f64, comm.default_timeout(),
                      std::string(phase) + ": summing the loss, dL/ds and dL/dt over the ranks");

  // every message has arrived: the outputs
  if (want_dq)
    check_launch(kc::launch_store_accumulator(buf.dq, b, d, args.dq.data, args.dq.row_stride,
                                              kc::out_type_for(args.dq.dtype), stream),
                 "storing dq");
  if (want_dk)
    check_launch(kc::launch_store_accumulator(static_cast<const float *>(schedule.relayed_result()), in.c(), d,
                                              args.dk.data, args.dk.row_stride, kc::out_type_for(args.dk.dtype),
                                              stream),
                 "storing dk");
  const double g = double(args.dloss);
  if (args.loss)
    check_launch(kc::launch_store_scalar(args.loss, float(everyone[0] * common.inv_n), stream), "storing the loss");
  if (args.dscale)
    check_launch(kc::launch_store_scalar(args.dscale, float(g * common.inv_n * everyone[1]), stream),
                 "storing dlogit_scale");
  if (args.dbias)
    check_launch(kc::launch_store_scalar(args.dbias, float(g * common.inv_n * everyone[2]), stream),
                 "storing dlogit_bias");
}

}  // namespace flatmem::contrastive::ring
