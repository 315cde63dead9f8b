// Forward ring on the CPU, on the shared schedule (schedule.hpp): the column
// block travels; this rank folds (its rows) x (block o) into
//  - its running row states (max, sum), over all blocks;
//  - a fresh column state for block o, the schedule's relayed item: merged
//    into the state that arrived for block o from r - 1 and sent on, so that
//    block o's owner ends with the state over all rows.
// Positive logits are taken from the tile of whichever block holds them. The
// loss is one all_reduce_sum of the ranks' partial sums of their row (and own
// column) terms (double), identical on all ranks.
#include <algorithm>
#include <cstring>

#include "contrastive/cpu/tile_math.hpp"
#include "contrastive/handle.hpp"
#include "contrastive/ring/blocks.hpp"
#include "contrastive/ring/ring.hpp"
#include "contrastive/ring/schedule.hpp"

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
  for (int i = 0; i < 2; ++i) {
    if (l.ranks > 1) f.blocks[i] = carver.take<char>(std::int64_t(block_bytes(l.max_cols, in.k)));
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

// The relayed column states: into = fresh, or into merged with fresh.
void fold_states(void *into, const void *fresh, std::int64_t cols, bool first) {
  if (first) {
    std::memcpy(into, fresh, PackedStates::bytes(cols));
    return;
  }
  const cpu::LseStates to = PackedStates{static_cast<char *>(into), cols}.states();
  const cpu::LseStates mine = PackedStates{static_cast<char *>(const_cast<void *>(fresh)), cols}.states();
  cpu::merge_states(to.max, to.sum, mine.max, mine.sum, cols);
}

}  // namespace

void run_forward(flatmem_contrastive_s &h, comm::Communicator &comm, const Layout &l,
                 const Inputs &in, const ForwardOutputs &out, Stats &stats) {
  const bool symmetric = in.loss == Loss::symmetric;
  const std::vector<Plan> plans = block_plans(l, in.d(), h.options);
  WorkspaceCarver measure;
  carve(measure, l, in, plans, h.pool.size());
  WorkspaceCarver carver(h.workspace.resolve(nullptr, 0, measure.bytes()));
  const ForwardRingBuffers buf = carve(carver, l, in, plans, h.pool.size());
  HostTransport transport(comm, "contrastive forward ring", stats);

  buf.rows.reset(in.b());
  const MatrixView own = l.ranks > 1 ? compact_block(in.k, buf.blocks[0]) : in.k;
  std::optional<Relayed> states;
  if (symmetric)
    states = Relayed{Message::column_state, buf.fresh, {buf.states[0], buf.states[1]},
                     PackedStates::bytes(1), fold_states};
  Schedule schedule(transport, l,
                    {Carried{Message::column_block, own.data, {buf.blocks[0], buf.blocks[1]},
                             block_bytes(1, in.k)}},
                    states);
  schedule.run([&](const Step &step) {
    Inputs block = in;
    block.k = step.t == 0 ? own : block_view(const_cast<void *>(step.carried[0]), step.cols, in.k);
    block.col_offset = step.col_offset;
    const PackedStates fresh{buf.fresh, step.cols};
    if (symmetric) fresh.states().reset(step.cols);
    cpu::fold_block(h.pool, plans[std::size_t(step.owner)], block, buf.rows,
                    symmetric ? fresh.states() : cpu::LseStates{}, buf.positive_logit, buf.threads);
  });

  // This rank's columns: complete after the last step.
  const std::int64_t own_cols = l.cols[std::size_t(l.rank)];
  double mine = cpu::finish_terms(buf.rows, buf.positive_logit, in.b(), buf.row_lse);
  // symmetric: b_r = c_r and global row g pairs with global column g, so own
  // column j's positive is own row j's
  if (symmetric) {
    const PackedStates own_columns{static_cast<char *>(schedule.relayed_result()),
                                   own_cols};
    mine += cpu::finish_terms(own_columns.states(), buf.positive_logit, own_cols, buf.col_lse);
  }
  double everyone = 0.0;
  comm.all_reduce_sum(&mine, &everyone, 1, comm::SumType::f64, comm.default_timeout(),
                      "contrastive forward ring: summing the loss over the ranks");

  std::copy(buf.row_lse, buf.row_lse + in.b(), out.row_lse);
  if (symmetric) std::copy(buf.col_lse, buf.col_lse + own_cols, out.col_lse);
  *out.loss = cpu::mean_loss(in.loss, everyone, l.global_rows);
}

}  // namespace flatmem::contrastive::ring
