// Forward ring. At step t = 0 .. n-1 rank r holds the column block of rank
// o = (r - t) mod n. Before computing it posts the receive of the next block
// from r - 1 and the send of the current one to r + 1, so the transfer runs
// while this rank folds (its rows) x (block o) into:
//  - its running row states (max, sum), over all blocks;
//  - a fresh column state for block o, merged into the state that arrived for
//    block o from r - 1 (ranks o .. r - 1 folded in already, always in that
//    order: deterministic), and sent on to r + 1. At t = n - 1 rank r = o - 1
//    completes block o's state and sends it to its owner o = r + 1.
// Positive logits are taken from the tile of whichever block holds them. The
// loss is one all_reduce_sum of the ranks' partial sums of their row (and own
// column) terms (double), identical on all ranks.
#include <algorithm>
#include <cstring>

#include "contrastive/cpu/tile_math.hpp"
#include "contrastive/handle.hpp"
#include "contrastive/ring/blocks.hpp"
#include "contrastive/ring/link.hpp"
#include "contrastive/ring/ring.hpp"

namespace flatmem::contrastive::ring {
namespace {

struct ForwardRingBuffers {
  void *blocks[2] = {};         // column blocks in transit
  char *states[2] = {};         // column states in transit (PackedStates)
  char *fresh = nullptr;        // this rank's fold of the current block (PackedStates)
  cpu::LseStates rows;          // (b,) running over all blocks
  float *row_lse = nullptr, *col_lse = nullptr;  // results before they are written out
  float *positive_logit = nullptr;  // (b,) x_{i, y_i}, from the block that holds it
  std::vector<cpu::ThreadScratch> threads;
};

ForwardRingBuffers carve(WorkspaceCarver &carver, const Layout &l, const Inputs &in,
                         const std::vector<Plan> &plans, int threads) {
  ForwardRingBuffers f;
  const bool symmetric = in.loss == Loss::symmetric;
  const std::int64_t b = l.rows[std::size_t(l.rank)], c = l.cols[std::size_t(l.rank)];
  for (int i = 0; i < 2 && l.ranks > 1; ++i) {
    f.blocks[i] = carver.take<char>(std::int64_t(block_bytes(l.max_cols, in.k)));
    if (symmetric) f.states[i] = carver.take<char>(std::int64_t(PackedStates::bytes(l.max_cols)));
  }
  if (symmetric) f.fresh = carver.take<char>(std::int64_t(PackedStates::bytes(l.max_cols)));
  f.rows = {carver.take<float>(b), carver.take<double>(b)};
  f.row_lse = carver.take<float>(b);
  if (symmetric) f.col_lse = carver.take<float>(c);
  f.positive_logit = carver.take<float>(b);
  f.threads = cpu::carve_thread_scratch(carver, widest(plans), in.q.dtype, threads);
  return f;
}

}  // namespace

void run_forward(flatmem_contrastive_s &h, comm::Communicator &comm, const Layout &l,
                 const Inputs &in, const ForwardOutputs &out, Stats &stats) {
  const bool symmetric = in.loss == Loss::symmetric;
  const int n = l.ranks;
  const std::vector<Plan> plans = block_plans(l, in.d(), h.options);
  WorkspaceCarver measure;
  carve(measure, l, in, plans, h.pool.size());
  WorkspaceCarver carver(h.workspace.resolve(nullptr, 0, measure.bytes()));
  const ForwardRingBuffers buf = carve(carver, l, in, plans, h.pool.size());
  RingLink link(comm, "contrastive forward ring", stats);

  buf.rows.reset(in.b());
  MatrixView current = n > 1 ? compact_block(in.k, buf.blocks[0]) : in.k;
  RingLink::Pending state_in;  // the state of the next step's block, from r - 1
  for (int t = 0; t < n; ++t) {
    const int owner = l.block_owner(t), next_owner = l.block_owner(t + 1);
    const std::int64_t cols = l.cols[std::size_t(owner)];
    RingLink::Pending block_in, block_out, state_out;
    if (t + 1 < n) {
      block_in = link.receive(Message::column_block, t + 1, buf.blocks[(t + 1) % 2],
                              block_bytes(l.cols[std::size_t(next_owner)], in.k));
      block_out = link.send(Message::column_block, t + 1, current.data, block_bytes(cols, in.k));
    }
    RingLink::Pending state_now = std::move(state_in);
    if (symmetric && n > 1)
      state_in = link.receive(Message::column_state, t + 1, buf.states[(t + 1) % 2],
                              PackedStates::bytes(l.cols[std::size_t(next_owner)]));

    Inputs block = in;
    block.k = current;
    block.col_offset = l.col_offset[std::size_t(owner)];
    const Plan &plan = plans[std::size_t(owner)];
    const PackedStates fresh{buf.fresh, cols};
    if (symmetric) fresh.states().reset(cols);
    cpu::fold_block(h.pool, plan, block, buf.rows, symmetric ? fresh.states() : cpu::LseStates{},
                    buf.positive_logit, buf.threads);

    if (symmetric && n > 1) {
      PackedStates merged = fresh;
      if (t > 0) {  // ranks o .. r - 1 first, then this rank
        link.wait({&state_now});
        merged = PackedStates{buf.states[t % 2], cols};
        const cpu::LseStates into = merged.states(), mine = fresh.states();
        cpu::merge_states(into.max, into.sum, mine.max, mine.sum, cols);
      }
      state_out = link.send(Message::column_state, t + 1, merged.data, PackedStates::bytes(cols));
    }
    link.wait({&block_out, &state_out, &block_in});
    if (t + 1 < n) current = block_view(buf.blocks[(t + 1) % 2], l.cols[std::size_t(next_owner)], in.k);
  }

  // This rank's columns: complete after the last step (from r - 1), or, alone, its own fold.
  const std::int64_t own_cols = l.cols[std::size_t(l.rank)];
  PackedStates own_columns{buf.fresh, own_cols};
  if (symmetric && n > 1) {
    link.wait({&state_in});
    own_columns = PackedStates{buf.states[n % 2], own_cols};
  }
  double mine = cpu::finish_terms(buf.rows, buf.positive_logit, in.b(), buf.row_lse);
  // symmetric: b_r = c_r and global row g pairs with global column g, so own
  // column j's positive is own row j's
  if (symmetric) mine += cpu::finish_terms(own_columns.states(), buf.positive_logit, own_cols, buf.col_lse);
  double everyone = 0.0;
  comm.all_reduce_sum(&mine, &everyone, 1, comm::SumType::f64, comm.default_timeout(),
                      "contrastive forward ring: summing the loss over the ranks");

  std::copy(buf.row_lse, buf.row_lse + in.b(), out.row_lse);
  if (symmetric) std::copy(buf.col_lse, buf.col_lse + own_cols, out.col_lse);
  *out.loss = cpu::mean_loss(in.loss, everyone, l.global_rows);
}

}  // namespace flatmem::contrastive::ring
