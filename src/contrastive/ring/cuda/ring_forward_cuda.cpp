// Forward ring on kDLCUDA tensors: the schedule of ring_forward.cpp with the
// CUDA kernels. Per step, on the caller's stream: forward_tiles over (q_r,
// block o) -> this block's row partials folded into the running row states,
// its column partials merged into the fresh column state (the relayed item),
// the positives whose column the block holds. With the panel engine forced
// (FLATMEM_CUDA_ENGINE=panels; not yet run on a GPU) the block is a panel walk
// (panels/cuda/engine.hpp, fold_block) that merges straight into the running
// row states and the fresh column states. After the ring: forward_finish
// over the running row states and this rank's complete column states, the
// loss terms summed (device), one synchronisation, the sum over the ranks on
// the host, then the outputs.
#include <algorithm>
#include <optional>

#include "contrastive/cuda/dispatch.hpp"
#include "contrastive/cuda/kernels.hpp"
#include "contrastive/handle.hpp"
#include "contrastive/panels/cuda/engine.hpp"
#include "contrastive/panels/cuda/kernels.hpp"
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
using kc::MaxSum;

struct ForwardDeviceBuffers {
  void *blocks[2] = {};              // column blocks in transit
  void *states[2] = {};              // column states in transit (MaxSum)
  MaxSum *fresh = nullptr;           // this block's column states
  MaxSum *running = nullptr;         // (b,) row states over all blocks so far
  MaxSum *row_partial = nullptr, *col_partial = nullptr;  // one block's tile partials
  float *positive = nullptr;         // (b,)
  float *row_lse = nullptr, *col_lse = nullptr;
  double *loss_partial = nullptr, *loss_total = nullptr;
  void *panel_space = nullptr;       // the panel engine's workspace (panels forced)
};

ForwardDeviceBuffers carve(WorkspaceCarver &carver, const Layout &l, const Inputs &in,
                           const panels::PanelPlan *plan) {
  ForwardDeviceBuffers f;
  const bool symmetric = in.loss == Loss::symmetric;
  const std::int64_t b = in.b();
  int row_groups = 1, col_groups = 1;
  if (plan == nullptr)
    for (std::int64_t cols : l.cols) {
      const kc::ForwardGrid g = kc::forward_grid(b, cols);
      row_groups = std::max(row_groups, g.row_groups);
      col_groups = std::max(col_groups, g.col_groups);
    }
  for (int i = 0; i < 2; ++i) {
    if (l.ranks > 1) f.blocks[i] = carver.take<char>(std::int64_t(block_bytes(l.max_cols, in.k)));
    if (symmetric) f.states[i] = carver.take<MaxSum>(l.max_cols);
  }
  if (symmetric) {
    f.fresh = carver.take<MaxSum>(l.max_cols);
    if (plan == nullptr) f.col_partial = carver.take<MaxSum>(std::int64_t(row_groups) * l.max_cols);
    f.col_lse = carver.take<float>(b);
  }
  f.running = carver.take<MaxSum>(b);
  if (plan == nullptr) f.row_partial = carver.take<MaxSum>(std::int64_t(col_groups) * b);
  if (plan != nullptr) f.panel_space = carver.take<char>(std::int64_t(plan->bytes));
  f.positive = carver.take<float>(b);
  f.row_lse = carver.take<float>(b);
  f.loss_partial = carver.take<double>(kc::forward_grid(b, 1).finish_blocks);
  f.loss_total = carver.take<double>(1);
  return f;
}

// One step on the tile kernels: the block's tile partials, folded into the
// running row states and merged into the fresh column states.
void fold_block_on_tiles(kc::Operand op, const Inputs &in, const MatrixView &block, const Step &step,
                         const ForwardDeviceBuffers &buf, cudaStream_t stream) {
  const bool symmetric = in.loss == Loss::symmetric;
  const std::int64_t b = in.b();
  const kc::ForwardGrid grid = kc::forward_grid(b, step.cols);
    kc::ForwardTileParams tiles;
    tiles.q = kc::device_matrix(in.q);
    tiles.k = kc::device_matrix(block);
    tiles.scale = in.scale_data;
    tiles.symmetric = symmetric;
    tiles.row_groups = grid.row_groups;
    tiles.col_groups = grid.col_groups;
    tiles.row_partial = buf.row_partial;
    tiles.col_partial = buf.col_partial;
    check_launch(kc::launch_tiles_for(op, tiles, stream), "launching the forward tile kernel");
    check_launch(kc::launch_fold_row_partials(buf.running, buf.row_partial, grid.col_groups, b, stream),
                 "launching the row state fold");
    if (symmetric)
      check_launch(kc::launch_merge_col_partials(buf.fresh, buf.col_partial, grid.row_groups, step.cols,
                                                 stream),
                   "launching the column state merge");
}

// One step on the panel engine: the fresh column states reset, then the
// block's panels merged into them and into the running row states.
void fold_block_on_panels(const flatmem_contrastive_s &h, const panels::PanelPlan &plan, const Inputs &in,
                          const MatrixView &block, const Step &step, const ForwardDeviceBuffers &buf,
                          cudaStream_t stream) {
  static_assert(sizeof(panels::State) == sizeof(MaxSum), "a panel State is the tiles' MaxSum");
  const bool symmetric = in.loss == Loss::symmetric;
  auto *fresh = reinterpret_cast<panels::State *>(buf.fresh);
  if (symmetric)
    check_launch(panels::cuda::launch_reset(fresh, step.cols, stream), "resetting the block's column states");
  Inputs mine = in;
  mine.k = block;
  mine.col_offset = step.col_offset;
  panels::cuda::fold_block(panels::narrowed(plan, step.cols), h.options, mine,
                           reinterpret_cast<panels::State *>(buf.running), symmetric ? fresh : nullptr,
                           buf.panel_space, stream);
}

}  // namespace

void run_forward_cuda(flatmem_contrastive_s &h, comm::Communicator &comm, const Layout &l,
                      const Inputs &in, const ForwardOutputs &out, void *stream_handle, Stats &stats) {
  const bool symmetric = in.loss == Loss::symmetric;
  cuda_ring::Call call(h, comm, in, stream_handle, "contrastive forward ring", stats);
  // The panel engine only when forced: its ring blocks have not run on a GPU yet.
  std::optional<panels::PanelPlan> plan;
  if (h.options.cuda_engine == CudaEngine::panels)
    plan = panels::plan_forward(in.b(), l.max_cols, in.d(), in.loss, h.options.panel_budget,
                                {h.options.panel_rows, h.options.panel_cols});
  const ForwardDeviceBuffers buf =
      call.carve([&](WorkspaceCarver &c) { return carve(c, l, in, plan ? &*plan : nullptr); });
  const cudaStream_t stream = call.stream;
  const kc::Operand op = call.op;
  const std::int64_t b = in.b();

  check_launch(kc::launch_reset_states(buf.running, b, stream), "launching the row state reset");
  const MatrixView own = call.own_block(in.k, l.ranks, buf.blocks[0]);
  std::optional<Relayed> states;
  if (symmetric) states = cuda_ring::relayed_states(buf.fresh, buf.states, stream);
  Schedule schedule(call.transport, l,
                    {Carried{Message::column_block, own.data, {buf.blocks[0], buf.blocks[1]},
                             block_bytes(1, in.k)}},
                    states);
  schedule.run([&](const Step &step) {
    const MatrixView block =
        step.t == 0 ? own : block_view(const_cast<void *>(step.carried[0]), step.cols, in.k);
    if (plan) {
      fold_block_on_panels(h, *plan, in, block, step, buf, stream);
    } else {
      fold_block_on_tiles(op, in, block, step, buf, stream);
    }
    kc::BlockPositiveParams positives;
    positives.q = kc::device_matrix(in.q);
    positives.k = kc::device_matrix(block);
    positives.scale = in.scale_data;
    positives.labels = in.labels;
    positives.rows_offset = in.row_offset;
    positives.col_offset = step.col_offset;
    positives.op = op;
    positives.tf32_positive = op == kc::Operand::tf32;
    positives.positive = buf.positive;
    check_launch(kc::launch_block_positives(positives, stream), "launching the block positives");
  });

  kc::ForwardFinishParams finish;
  finish.q = kc::device_matrix(in.q);
  finish.k = finish.q;  // (b rows; the positives are given)
  finish.scale = in.scale_data;
  finish.symmetric = symmetric;
  finish.row_partial = buf.running;
  finish.col_partial = symmetric ? static_cast<const MaxSum *>(schedule.relayed_result()) : nullptr;
  finish.positive = buf.positive;
  finish.row_lse = buf.row_lse;
  finish.col_lse = buf.col_lse;
  finish.loss_partial = buf.loss_partial;
  const int blocks = kc::forward_grid(b, 1).finish_blocks;
  check_launch(kc::launch_forward_finish(finish, op, blocks, stream), "launching the forward finish kernel");
  check_launch(kc::launch_partial_sum(buf.loss_partial, blocks, buf.loss_total, false, stream),
               "launching the loss sum");
  double mine = 0.0, everyone = 0.0;
  call.finish_and_read(buf.loss_total, &mine, 1);
  comm.all_reduce_sum(&mine, &everyone, 1, comm::SumType::f64, comm.default_timeout(),
                      "contrastive forward ring: summing the loss over the ranks");

  // every message has arrived: the outputs
  cuda_ring::copy_on(stream, out.row_lse, buf.row_lse, std::size_t(b) * sizeof(float), "storing row_lse");
  if (symmetric)
    cuda_ring::copy_on(stream, out.col_lse, buf.col_lse, std::size_t(b) * sizeof(float), "storing col_lse");
  const double count = symmetric ? 2.0 * double(l.global_rows) : double(l.global_rows);
  check_launch(kc::launch_store_scalar(out.loss, float(everyone * (1.0 / count)), stream),
               "storing the loss");
}

}  // namespace flatmem::contrastive::ring
