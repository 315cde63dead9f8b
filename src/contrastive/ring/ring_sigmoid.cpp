// Sigmoid ring on the CPU, on the shared schedule (schedule.hpp): the loss has
// no row or column normaliser, so value and gradients come from ONE pass round
// the ring (the forward alone is the same pass without gradients). For (its
// rows) x (block o) the rank computes the logit tiles and the element-wise
// terms with the 1/B of the global mean, then
//  - adds its loss, ds and dt terms to its partial sums (double);
//  - adds s G k_o into its dq (fp32, over all blocks);
//  - computes block o's partial dk = (s G)^T q_r, the schedule's relayed item
//    (relayed_dk.hpp), summed on its way to the block's owner.
// One all_reduce_sum of the three partial sums gives the same loss, ds and dt
// on every rank.
#include <algorithm>

#include "contrastive/cpu/sigmoid.hpp"
#include "contrastive/handle.hpp"
#include "contrastive/ring/blocks.hpp"
#include "contrastive/ring/relayed_dk.hpp"
#include "contrastive/ring/ring.hpp"

namespace flatmem::contrastive::ring {
namespace {

struct SigmoidRingBuffers {
  void *blocks[2] = {};          // column blocks in transit
  cpu::Accumulator dq;           // (b, d)
  float *dk_fresh = nullptr;     // this rank's share of the current block's dk
  float *dk_partial[2] = {};     // partial dk in transit
  cpu::SigmoidGroupSums sums;    // per row group of the current block
  std::vector<cpu::ThreadScratch> threads;
};

SigmoidRingBuffers carve(WorkspaceCarver &carver, const Layout &l, const Inputs &in,
                         const SigmoidArgs &args, const std::vector<Plan> &plans, int threads) {
  SigmoidRingBuffers f;
  const std::int64_t d = in.d(), dk_floats = l.max_cols * d;
  for (int i = 0; i < 2; ++i) {
    if (l.ranks > 1) f.blocks[i] = carver.take<char>(std::int64_t(block_bytes(l.max_cols, in.k)));
    if (args.dk.data) f.dk_partial[i] = carver.take<float>(dk_floats);
  }
  if (args.dq.data) f.dq = {carver.take<float>(in.b() * d), d};
  if (args.dk.data) f.dk_fresh = carver.take<float>(dk_floats);
  const std::int64_t groups = most_groups(plans);
  f.sums = {carver.take<double>(groups), carver.take<double>(groups), carver.take<double>(groups)};
  f.threads = cpu::carve_thread_scratch(carver, widest(plans), in.q.dtype, threads);
  return f;
}

}  // namespace

void run_sigmoid(flatmem_contrastive_s &h, comm::Communicator &comm, const Layout &l,
                 const Inputs &in, const SigmoidArgs &args, const char *phase, Stats &stats) {
  const bool wants_dk = args.dk.data != nullptr;
  const std::int64_t d = in.d();
  const std::vector<Plan> plans = block_plans(l, d, h.options);
  WorkspaceCarver measure;
  carve(measure, l, in, args, plans, h.pool.size());
  WorkspaceCarver carver(h.workspace.resolve(nullptr, 0, measure.bytes()));
  const SigmoidRingBuffers buf = carve(carver, l, in, args, plans, h.pool.size());
  HostTransport transport(comm, phase, stats);

  cpu::SigmoidTerms terms;
  terms.bias = args.bias;
  terms.coef = float(double(args.dloss) / double(l.global_rows));
  terms.loss = args.loss != nullptr;
  terms.gradient = args.wants_gradient();
  if (buf.dq.data) buf.dq.zero(in.b(), d);
  double mine[3] = {0.0, 0.0, 0.0};  // loss terms, ds, dt of this rank's rows
  const MatrixView own = l.ranks > 1 ? compact_block(in.k, buf.blocks[0]) : in.k;
  Schedule schedule(transport, l,
                    {Carried{Message::column_block, own.data, {buf.blocks[0], buf.blocks[1]},
                             block_bytes(1, in.k)}},
                    relayed_dk(buf.dk_fresh, buf.dk_partial, d));
  schedule.run([&](const Step &step) {
    Inputs block = in;
    block.k = step.t == 0 ? own : block_view(const_cast<void *>(step.carried[0]), step.cols, in.k);
    block.col_offset = step.col_offset;
    const Plan &plan = plans[std::size_t(step.owner)];
    const cpu::Accumulator dk_block{buf.dk_fresh, d};
    if (wants_dk) dk_block.zero(step.cols, d);
    for (double *group : {buf.sums.loss, buf.sums.ds, buf.sums.dt})
      std::fill(group, group + plan.groups, 0.0);
    cpu::sigmoid_block(h.pool, plan, block, terms, buf.dq, wants_dk ? dk_block : cpu::Accumulator{},
                       buf.threads, buf.sums);
    mine[0] += cpu::sum_in_order(buf.sums.loss, plan.groups);
    mine[1] += cpu::sum_in_order(buf.sums.ds, plan.groups);
    mine[2] += cpu::sum_in_order(buf.sums.dt, plan.groups);
  });

  double everyone[3] = {0.0, 0.0, 0.0};
  comm.all_reduce_sum(mine, everyone, 3, comm::SumType::f64, comm.default_timeout(),
                      std::string(phase) + ": summing the loss, dL/ds and dL/dt over the ranks");

  cpu::store_gradient(buf.dq, args.dq);
  if (wants_dk) cpu::store_gradient({static_cast<float *>(schedule.relayed_result()), d}, args.dk);
  if (args.loss) *args.loss = float(everyone[0] / double(l.global_rows));
  if (args.dscale) *args.dscale = float(everyone[1]);
  if (args.dbias) *args.dbias = float(everyone[2]);
}

}  // namespace flatmem::contrastive::ring
