#include "contrastive/sigmoid_ring_case.hpp"

#include <functional>
#include <utility>

#include "contrastive/ring_case.hpp"
#include "support/contrastive.hpp"

namespace sigmoid_ring {
namespace {

using namespace flatmem_test;

std::int64_t sum_before(int r, const std::function<std::int64_t(int)> &count) {
  std::int64_t total = 0;
  for (int s = 0; s < r; ++s) total += count(s);
  return total;
}

// Fails the run with flatmem's message unless s is SUCCESS.
bool succeeded(flatmem_status s, const char *call, RankRun &run) {
  if (s == FLATMEM_STATUS_SUCCESS) return true;
  run.status = s;
  run.error = std::string(call) + ": " + flatmem_last_error();
  return false;
}

// Compares the outputs flagged in `which` with the reference of the whole
// batch at dloss, at this rank's rows and columns.
std::string compare_outputs(const char *call, const SigmoidRingCase &rc, const SigmoidCase &global,
                            const SigmoidOutputs &out, double dloss, SigmoidChecks which, int rank) {
  const SigmoidProblem p = global.problem(dloss);
  const SigmoidResult ref = sigmoid_reference(p);
  const SigmoidTolerance tol = sigmoid_tolerance(p, ref, out.dq.dtype(), out.dk.dtype(), global.q.dtype());
  const std::int64_t d = rc.shape.d;
  std::string report;
  auto check = [&](bool wanted, const char *what, const HostTensor &got, const std::vector<double> &want,
                   const std::vector<double> &bound, std::int64_t offset) {
    if (wanted && report.empty()) report = ring_test::compare(what, got, want, bound, offset);
  };
  check(which.loss, "loss", out.loss, {ref.loss}, {tol.loss}, 0);
  check(which.dq, "dq", out.dq, ref.dq, tol.dq, rc.row_offset(rank) * d);
  check(which.dk, "dk", out.dk, ref.dk, tol.dk, rc.col_offset(rank) * d);
  check(which.ds, "dlogit_scale", out.ds, {ref.ds}, {tol.ds}, 0);
  check(which.dt, "dlogit_bias", out.dt, {ref.dt}, {tol.dt}, 0);
  return report.empty() ? "" : std::string(call) + ": " + report;
}

}  // namespace

std::int64_t SigmoidRingCase::row_offset(int r) const {
  return sum_before(r, [&](int s) { return rows[std::size_t(s)]; });
}

std::int64_t SigmoidRingCase::col_offset(int r) const {
  return sum_before(r, [&](int s) { return columns(s); });
}

SigmoidCase SigmoidRingCase::global_batch() const {
  SigmoidShape whole = shape;
  whole.b = row_offset(ranks());
  whole.c = col_offset(ranks());
  return SigmoidCase(whole);
}

SigmoidCase SigmoidRingCase::slice(const SigmoidCase &global, int rank) const {
  SigmoidShape mine = shape;
  mine.b = rows[std::size_t(rank)];
  mine.c = columns(rank);
  const std::int64_t row0 = row_offset(rank);
  HostTensor labels;
  if (shape.labels) {
    labels = HostTensor::vector(Dtype::i64, mine.b);
    for (std::int64_t i = 0; i < mine.b; ++i) labels.set(i, global.labels.get(row0 + i));
  }
  return SigmoidCase(mine, ring_test::rows_of(global.q, row0, mine.b),
                     ring_test::rows_of(global.k, col_offset(rank), mine.c), std::move(labels));
}

namespace {

// The three calls of one rank on its own inputs.
RankRun run_calls(flatmem_comm_t *comm, const SigmoidRingCase &rc, const SigmoidCase &mine) {
  flatmem_contrastive_options o =
      make_options(FLATMEM_CONTRASTIVE_SIGMOID, rc.threads, rc.tile, rc.tile);
  o.comm = comm;
  Handle h = create_handle(o);
  RankRun run;
  run.value_and_grad = mine.outputs();
  run.forward = mine.outputs();
  run.backward = mine.outputs();
  if (!succeeded(mine.value_and_grad(h.get(), run.value_and_grad, true, true, rc.want_dk),
                 "value_and_grad", run))
    return run;
  if (!succeeded(mine.forward(h.get(), run.forward), "forward", run)) return run;
  if (rc.want_dk) succeeded(mine.backward(h.get(), rc.dloss, run.backward), "backward", run);
  return run;
}

}  // namespace

RankRun run_rank(flatmem_comm_t *comm, const SigmoidRingCase &rc, const SigmoidCase &global,
                 int rank) {
  if (comm == nullptr) return run_calls(nullptr, rc, global);
  return run_calls(comm, rc, rc.slice(global, rank));
}

std::string check_rank(const SigmoidRingCase &rc, const SigmoidCase &global, const RankRun &run,
                       int rank) {
  if (run.status != FLATMEM_STATUS_SUCCESS)
    return "rank " + std::to_string(rank) + ": " + flatmem_status_string(run.status) + ": " + run.error;
  SigmoidChecks all;
  all.dk = rc.want_dk;
  std::string report = compare_outputs("value_and_grad", rc, global, run.value_and_grad, 1.0, all, rank);
  SigmoidChecks loss_only{true, false, false, false, false};
  if (report.empty())
    report = compare_outputs("forward", rc, global, run.forward, 1.0, loss_only, rank);
  SigmoidChecks gradients{false, true, true, true, true};
  if (report.empty() && rc.want_dk)
    report = compare_outputs("backward", rc, global, run.backward, rc.dloss, gradients, rank);
  return report.empty() ? "" : "rank " + std::to_string(rank) + ": " + report;
}

bool same_bits(const RankRun &a, const RankRun &b) {
  auto same = [](const SigmoidOutputs &x, const SigmoidOutputs &y) {
    return x.loss.same_bits(y.loss) && x.dq.same_bits(y.dq) && x.dk.same_bits(y.dk) &&
           x.ds.same_bits(y.ds) && x.dt.same_bits(y.dt);
  };
  return same(a.value_and_grad, b.value_and_grad) && same(a.forward, b.forward) &&
         same(a.backward, b.backward);
}

}  // namespace sigmoid_ring
