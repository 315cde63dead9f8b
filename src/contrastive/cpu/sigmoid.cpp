// The sigmoid loss on the CPU: per tile one logit product, the element-wise
// kernel (sigmoid_math.hpp), and, when gradients are requested, the two
// gradient products of the softmax backward (dq_I += (sG) K_J, dk_J +=
// (sG)^T Q_I). Loss, ds and dt are summed per row group in walk order and the
// groups in index order: the same bits for any thread count.
#include "contrastive/cpu/sigmoid.hpp"

#include <algorithm>

#include "contrastive/cpu/sigmoid_math.hpp"
#include "contrastive/cpu/tile_walk.hpp"

namespace flatmem::contrastive::cpu {
namespace {

struct SigmoidBuffers {
  BackwardBuffers grad;         // group_ds, 16-bit accumulators, thread scratch
  double *group_loss = nullptr; // (G,)
  double *group_dt = nullptr;   // (G,)
};

SigmoidBuffers carve_sigmoid(WorkspaceCarver &carver, const Plan &plan, Dtype input,
                             const Dtype *dq_dtype, const Dtype *dk_dtype, int threads) {
  SigmoidBuffers buf;
  buf.grad = carve_backward(carver, plan, input, dq_dtype, dk_dtype, threads);
  buf.group_loss = carver.take<double>(plan.groups);
  buf.group_dt = carver.take<double>(plan.groups);
  return buf;
}

}  // namespace

void sigmoid_block(ThreadPool &pool, const Plan &plan, const Inputs &in, const SigmoidTerms &terms,
                   const Accumulator &dq, const Accumulator &dk,
                   const std::vector<ThreadScratch> &scratch, const SigmoidGroupSums &sums) {
  SigmoidTile tile;
  tile.scale = in.scale;
  tile.bias = terms.bias;
  tile.coef = terms.coef;
  walk_tiles(pool, plan, in, scratch,
             [&](std::int64_t row_group, Range rows, Range cols, const TileRows &q,
                 const TileRows &k, const ThreadScratch &s, const TileProducts &engine) {
               tile_logits(engine, q, k, rows.size(), cols.size(), plan.d, s.tile, s.pack);
               tile_positives(in, rows, cols, s.positives);
               SigmoidTile t = tile;
               t.positive_col = s.positives;
               const SigmoidSums tile_sums = sigmoid_tile(
                   s.tile, terms.gradient ? s.tile : nullptr, rows.size(), cols.size(), t, terms.loss);
               sums.loss[row_group] += tile_sums.loss;
               sums.ds[row_group] += tile_sums.ds;
               sums.dt[row_group] += tile_sums.dt;
               if (dq.data)
                 accumulate_rows_times(engine, s.tile, k, rows.size(), cols.size(), plan.d,
                                       dq.row(rows.begin), dq.ld, s.pack);
               if (dk.data)
                 accumulate_cols_times(engine, s.tile, q, rows.size(), cols.size(), plan.d,
                                       dk.row(cols.begin), dk.ld, s.pack);
             });
}

std::size_t sigmoid_workspace_bytes(const Plan &plan, Dtype input, const Dtype *dq_dtype,
                                    const Dtype *dk_dtype, int threads) {
  WorkspaceCarver measure;
  carve_sigmoid(measure, plan, input, dq_dtype, dk_dtype, threads);
  return measure.bytes();
}

void sigmoid(ThreadPool &pool, const Plan &plan, const Inputs &in, const SigmoidArgs &args,
             void *workspace) {
  WorkspaceCarver carver(workspace);
  const SigmoidBuffers buf = carve_sigmoid(carver, plan, in.q.dtype, dtype_if_requested(args.dq),
                                           dtype_if_requested(args.dk), pool.size());
  const Accumulator dq = accumulator_for(args.dq, buf.grad.dq_acc);
  const Accumulator dk = accumulator_for(args.dk, buf.grad.dk_acc);
  if (dq.data) dq.zero(plan.b, plan.d);
  if (dk.data) dk.zero(plan.c, plan.d);
  const SigmoidGroupSums sums{buf.group_loss, buf.grad.group_ds, buf.group_dt};
  for (double *group : {sums.loss, sums.ds, sums.dt}) std::fill(group, group + plan.groups, 0.0);

  SigmoidTerms terms;
  terms.bias = args.bias;
  terms.coef = float(double(args.dloss) / double(plan.b));
  terms.loss = args.loss != nullptr;
  terms.gradient = args.wants_gradient();
  sigmoid_block(pool, plan, in, terms, dq, dk, buf.grad.threads, sums);

  store_gradient(dq, args.dq);
  store_gradient(dk, args.dk);
  if (args.loss) *args.loss = float(sum_in_order(sums.loss, plan.groups) / double(plan.b));
  if (args.dscale) *args.dscale = float(sum_in_order(sums.ds, plan.groups));
  if (args.dbias) *args.dbias = float(sum_in_order(sums.dt, plan.groups));
}

}  // namespace flatmem::contrastive::cpu
