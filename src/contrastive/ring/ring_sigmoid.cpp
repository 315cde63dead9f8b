// Sigmoid ring: the loss has no row or column normaliser, so value and
// gradients come from ONE pass round the ring (the forward alone is the same
// pass without gradients). At step t rank r holds the column block of
// o = (r - t) mod n, which travels on to r + 1 during the step. For (its rows)
// x (block o) the rank computes the logit tiles and the element-wise terms
// with the 1/B of the global mean, then
//  - adds its loss, ds and dt terms to its partial sums (double);
//  - adds s G k_o into its dq (fp32, over all blocks);
//  - computes block o's partial dk = (s G)^T q_r, which travels on behind the
//    block to its owner (dk_relay.hpp).
// One all_reduce_sum of the three partial sums gives the same loss, ds and dt
// on every rank.
#include <algorithm>

#include "contrastive/cpu/sigmoid.hpp"
#include "contrastive/handle.hpp"
#include "contrastive/ring/blocks.hpp"
#include "contrastive/ring/dk_relay.hpp"
#include "contrastive/ring/link.hpp"
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
                         const cpu::SigmoidArgs &args, const std::vector<Plan> &plans, int threads) {
  SigmoidRingBuffers f;
  const std::int64_t d = in.d(), dk_floats = l.max_cols * d;
  for (int i = 0; i < 2 && l.ranks > 1; ++i) {
    f.blocks[i] = carver.take<char>(std::int64_t(block_bytes(l.max_cols, in.k)));
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
                 const Inputs &in, const cpu::SigmoidArgs &args, const char *phase, Stats &stats) {
  const bool wants_dk = args.dk.data != nullptr;
  const int n = l.ranks;
  const std::int64_t d = in.d();
  const std::vector<Plan> plans = block_plans(l, d, h.options);
  WorkspaceCarver measure;
  carve(measure, l, in, args, plans, h.pool.size());
  WorkspaceCarver carver(h.workspace.resolve(nullptr, 0, measure.bytes()));
  const SigmoidRingBuffers buf = carve(carver, l, in, args, plans, h.pool.size());
  RingLink link(comm, phase, stats);

  cpu::SigmoidTerms terms;
  terms.bias = args.bias;
  terms.coef = float(double(args.dloss) / double(l.global_rows));
  terms.loss = args.loss != nullptr;
  terms.gradient = args.wants_gradient();
  if (buf.dq.data) buf.dq.zero(in.b(), d);
  double mine[3] = {0.0, 0.0, 0.0};  // loss terms, ds, dt of this rank's rows
  MatrixView current = n > 1 ? compact_block(in.k, buf.blocks[0]) : in.k;
  DkRelay dk(link, l, d, buf.dk_fresh, buf.dk_partial, wants_dk);
  for (int t = 0; t < n; ++t) {
    const int owner = l.block_owner(t), next_owner = l.block_owner(t + 1);
    const std::int64_t cols = l.cols[std::size_t(owner)], next_cols = l.cols[std::size_t(next_owner)];
    RingLink::Pending block_in, block_out;
    if (t + 1 < n) {
      block_in = link.receive(Message::column_block, t + 1, buf.blocks[(t + 1) % 2],
                              block_bytes(next_cols, in.k));
      block_out = link.send(Message::column_block, t + 1, current.data, block_bytes(cols, in.k));
    }
    dk.begin_step(t);

    Inputs block = in;
    block.k = current;
    block.col_offset = l.col_offset[std::size_t(owner)];
    const Plan &plan = plans[std::size_t(owner)];
    const cpu::Accumulator dk_block{dk.fresh(), d};
    if (wants_dk) dk_block.zero(cols, d);
    for (double *group : {buf.sums.loss, buf.sums.ds, buf.sums.dt})
      std::fill(group, group + plan.groups, 0.0);
    cpu::sigmoid_block(h.pool, plan, block, terms, buf.dq, wants_dk ? dk_block : cpu::Accumulator{},
                       buf.threads, buf.sums);
    mine[0] += cpu::sum_in_order(buf.sums.loss, plan.groups);
    mine[1] += cpu::sum_in_order(buf.sums.ds, plan.groups);
    mine[2] += cpu::sum_in_order(buf.sums.dt, plan.groups);

    dk.pass_on(t);
    link.wait({&block_out, &dk.pending_send(), &block_in});
    if (t + 1 < n) current = block_view(buf.blocks[(t + 1) % 2], next_cols, in.k);
  }

  const float *own_dk = dk.finish();  // complete after the last step
  double everyone[3] = {0.0, 0.0, 0.0};
  comm.all_reduce_sum(mine, everyone, 3, comm::SumType::f64, comm.default_timeout(),
                      std::string(phase) + ": summing the loss, dL/ds and dL/dt over the ranks");

  cpu::store_gradient(buf.dq, args.dq);
  if (wants_dk) cpu::store_gradient({const_cast<float *>(own_dk), d}, args.dk);
  if (args.loss) *args.loss = float(everyone[0] / double(l.global_rows));
  if (args.dscale) *args.dscale = float(everyone[1]);
  if (args.dbias) *args.dbias = float(everyone[2]);
}

}  // namespace flatmem::contrastive::ring
