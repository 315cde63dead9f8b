// Backward ring on the CPU, on the shared schedule (schedule.hpp): the column
// block travels with its global col_lse (symmetric loss). For (its rows) x
// (block o) the rank recomputes the logit tiles and forms s*G with the global
// row_lse and col_lse and the 1/B coefficients of the global mean, then
//  - adds s G k_o into its dq (fp32, over all blocks);
//  - computes block o's partial dk = (s G)^T q_r, the schedule's relayed item
//    (relayed_dk.hpp), summed on its way to the block's owner;
//  - adds its share of dL/ds; one all_reduce_sum gives the same ds on every
//    rank.
#include <algorithm>

#include "contrastive/handle.hpp"
#include "contrastive/ring/blocks.hpp"
#include "contrastive/ring/relayed_dk.hpp"
#include "contrastive/ring/ring.hpp"

namespace flatmem::contrastive::ring {
namespace {

struct BackwardRingBuffers {
  void *blocks[2] = {};           // column blocks in transit
  float *column_lse[2] = {};      // their col_lse (symmetric)
  cpu::Accumulator dq;            // (b, d)
  float *dk_fresh = nullptr;      // this rank's share of the current block's dk
  float *dk_partial[2] = {};      // partial dk in transit
  double *group_ds = nullptr;
  std::vector<cpu::ThreadScratch> threads;
};

BackwardRingBuffers carve(WorkspaceCarver &carver, const Layout &l, const Inputs &in,
                          const BackwardArgs &args, const std::vector<Plan> &plans, int threads) {
  BackwardRingBuffers f;
  const bool symmetric = in.loss == Loss::symmetric;
  const std::int64_t d = in.d(), dk_floats = l.max_cols * d;
  for (int i = 0; i < 2; ++i) {
    if (l.ranks > 1) {
      f.blocks[i] = carver.take<char>(std::int64_t(block_bytes(l.max_cols, in.k)));
      if (symmetric) f.column_lse[i] = carver.take<float>(l.max_cols);
    }
    if (args.dk.data) f.dk_partial[i] = carver.take<float>(dk_floats);
  }
  if (args.dq.data) f.dq = {carver.take<float>(in.b() * d), d};
  if (args.dk.data) f.dk_fresh = carver.take<float>(dk_floats);
  f.group_ds = carver.take<double>(most_groups(plans));
  f.threads = cpu::carve_thread_scratch(carver, widest(plans), in.q.dtype, threads);
  return f;
}

}  // namespace

void run_backward(flatmem_contrastive_s &h, comm::Communicator &comm, const Layout &l,
                  const Inputs &in, const BackwardArgs &args, Stats &stats) {
  const bool symmetric = in.loss == Loss::symmetric, wants_dk = args.dk.data != nullptr;
  const std::int64_t d = in.d();
  const std::vector<Plan> plans = block_plans(l, d, h.options);
  WorkspaceCarver measure;
  carve(measure, l, in, args, plans, h.pool.size());
  WorkspaceCarver carver(h.workspace.resolve(nullptr, 0, measure.bytes()));
  const BackwardRingBuffers buf = carve(carver, l, in, args, plans, h.pool.size());
  HostTransport transport(comm, "contrastive backward ring", stats);

  const cpu::GradientCoefficients coef = cpu::gradient_coefficients(in.loss, args.dloss, l.global_rows);
  if (buf.dq.data) buf.dq.zero(in.b(), d);
  double ds = 0.0;
  const MatrixView own = l.ranks > 1 ? compact_block(in.k, buf.blocks[0]) : in.k;
  std::vector<Carried> carried{
      Carried{Message::column_block, own.data, {buf.blocks[0], buf.blocks[1]}, block_bytes(1, in.k)}};
  if (symmetric)  // args.col_lse is contiguous (c,)
    carried.push_back(Carried{Message::column_lse, args.col_lse,
                              {buf.column_lse[0], buf.column_lse[1]}, sizeof(float)});
  Schedule schedule(transport, l, std::move(carried), relayed_dk(buf.dk_fresh, buf.dk_partial, d));
  schedule.run([&](const Step &step) {
    Inputs block = in;
    block.k = step.t == 0 ? own : block_view(const_cast<void *>(step.carried[0]), step.cols, in.k);
    block.col_offset = step.col_offset;
    const Plan &plan = plans[std::size_t(step.owner)];
    const cpu::Accumulator dk_block{buf.dk_fresh, d};
    if (wants_dk) dk_block.zero(step.cols, d);
    std::fill(buf.group_ds, buf.group_ds + plan.groups, 0.0);
    cpu::gradient_block(h.pool, plan, block, args.row_lse,
                        symmetric ? static_cast<const float *>(step.carried[1]) : nullptr, coef,
                        buf.dq, wants_dk ? dk_block : cpu::Accumulator{}, buf.threads, buf.group_ds);
    ds += cpu::sum_in_order(buf.group_ds, plan.groups);
  });

  double everyone = 0.0;
  comm.all_reduce_sum(&ds, &everyone, 1, comm::SumType::f64, comm.default_timeout(),
                      "contrastive backward ring: summing dL/ds over the ranks");

  cpu::store_gradient(buf.dq, args.dq);
  if (wants_dk) cpu::store_gradient({static_cast<float *>(schedule.relayed_result()), d}, args.dk);
  if (args.dscale) *args.dscale = float(everyone);
}

}  // namespace flatmem::contrastive::ring
