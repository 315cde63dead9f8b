// Backward ring. As in the forward, at step t rank r holds the column block
// of o = (r - t) mod n, which travels on to r + 1 during the step (with its
// global col_lse for the symmetric loss). For (its rows) x (block o) the rank
// recomputes the logit tiles and forms s*G with the global row_lse and
// col_lse and the 1/B coefficients of the global mean, then
//  - adds s G k_o into its dq (fp32, over all blocks);
//  - computes block o's partial dk = (s G)^T q_r, which travels on behind the
//    block to its owner (dk_relay.hpp);
//  - adds its share of dL/ds; one all_reduce_sum gives the same ds on every
//    rank.
#include <algorithm>

#include "contrastive/handle.hpp"
#include "contrastive/ring/blocks.hpp"
#include "contrastive/ring/dk_relay.hpp"
#include "contrastive/ring/link.hpp"
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
  for (int i = 0; i < 2 && l.ranks > 1; ++i) {
    f.blocks[i] = carver.take<char>(std::int64_t(block_bytes(l.max_cols, in.k)));
    if (symmetric) f.column_lse[i] = carver.take<float>(l.max_cols);
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
  const int n = l.ranks;
  const std::int64_t d = in.d();
  const std::vector<Plan> plans = block_plans(l, d, h.options);
  WorkspaceCarver measure;
  carve(measure, l, in, args, plans, h.pool.size());
  WorkspaceCarver carver(h.workspace.resolve(nullptr, 0, measure.bytes()));
  const BackwardRingBuffers buf = carve(carver, l, in, args, plans, h.pool.size());
  RingLink link(comm, "contrastive backward ring", stats);

  const cpu::GradientCoefficients coef = cpu::gradient_coefficients(in.loss, args.dloss, l.global_rows);
  if (buf.dq.data) buf.dq.zero(in.b(), d);
  double ds = 0.0;
  MatrixView current = n > 1 ? compact_block(in.k, buf.blocks[0]) : in.k;
  const float *current_lse = args.col_lse;  // contiguous (c,)
  DkRelay dk(link, l, d, buf.dk_fresh, buf.dk_partial, wants_dk);
  for (int t = 0; t < n; ++t) {
    const int owner = l.block_owner(t), next_owner = l.block_owner(t + 1);
    const std::int64_t cols = l.cols[std::size_t(owner)], next_cols = l.cols[std::size_t(next_owner)];
    RingLink::Pending block_in, lse_in, block_out, lse_out;
    if (t + 1 < n) {
      block_in = link.receive(Message::column_block, t + 1, buf.blocks[(t + 1) % 2],
                              block_bytes(next_cols, in.k));
      block_out = link.send(Message::column_block, t + 1, current.data, block_bytes(cols, in.k));
      if (symmetric) {
        lse_in = link.receive(Message::column_lse, t + 1, buf.column_lse[(t + 1) % 2],
                              std::size_t(next_cols) * sizeof(float));
        lse_out = link.send(Message::column_lse, t + 1, current_lse, std::size_t(cols) * sizeof(float));
      }
    }
    dk.begin_step(t);

    Inputs block = in;
    block.k = current;
    block.col_offset = l.col_offset[std::size_t(owner)];
    const Plan &plan = plans[std::size_t(owner)];
    const cpu::Accumulator dk_block{dk.fresh(), d};
    if (wants_dk) dk_block.zero(cols, d);
    std::fill(buf.group_ds, buf.group_ds + plan.groups, 0.0);
    cpu::gradient_block(h.pool, plan, block, args.row_lse, symmetric ? current_lse : nullptr, coef,
                        buf.dq, wants_dk ? dk_block : cpu::Accumulator{}, buf.threads, buf.group_ds);
    ds += cpu::sum_in_order(buf.group_ds, plan.groups);

    dk.pass_on(t);
    link.wait({&block_out, &lse_out, &dk.pending_send(), &block_in, &lse_in});
    if (t + 1 < n) {
      current = block_view(buf.blocks[(t + 1) % 2], next_cols, in.k);
      current_lse = buf.column_lse[(t + 1) % 2];
    }
  }

  const float *own_dk = dk.finish();  // complete after the last step
  double everyone = 0.0;
  comm.all_reduce_sum(&ds, &everyone, 1, comm::SumType::f64, comm.default_timeout(),
                      "contrastive backward ring: summing dL/ds over the ranks");

  cpu::store_gradient(buf.dq, args.dq);
  if (wants_dk) cpu::store_gradient({const_cast<float *>(own_dk), d}, args.dk);
  if (args.dscale) *args.dscale = float(everyone);
}

}  // namespace flatmem::contrastive::ring
