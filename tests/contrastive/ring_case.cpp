#include "contrastive/ring_case.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "support/contrastive.hpp"
#include "support/random.hpp"
#include "support/saturation.hpp"
#include "support/tolerance.hpp"

namespace ring_test {
namespace {

using namespace flatmem_test;

HostTensor nan_vector(Dtype t, std::int64_t n) {
  HostTensor v = HostTensor::vector(t, n);
  for (std::int64_t i = 0; i < n; ++i) v.set(i, std::nan(""));
  return v;
}

HostTensor nan_matrix(Dtype t, std::int64_t rows, std::int64_t cols) {
  HostTensor m = HostTensor::matrix(t, rows, cols);
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < cols; ++j) m.set(i, j, std::nan(""));
  return m;
}

}  // namespace

HostTensor rows_of(const HostTensor &m, std::int64_t first, std::int64_t count) {
  HostTensor out = HostTensor::matrix(m.dtype(), count, m.cols());
  for (std::int64_t i = 0; i < count; ++i)
    for (std::int64_t t = 0; t < m.cols(); ++t) out.set(i, t, m.get(first + i, t));
  return out;
}

std::string compare(const char *what, const HostTensor &got, const std::vector<double> &want,
                    const std::vector<double> &tol, std::int64_t offset) {
  double worst = 0.0;
  for (std::int64_t n = 0; n < got.elements(); ++n) {
    const double g = got.get(n / got.cols(), n % got.cols());
    const std::size_t at = std::size_t(offset + n);
    worst = std::max(worst, std::fabs(g - want[at]) / tol[at]);
    if (!(std::fabs(g - want[at]) <= tol[at])) {
      std::ostringstream s;
      s.precision(9);
      s << what << "[" << n << "]: got " << g << ", reference " << want[at] << ", tolerance " << tol[at];
      return s.str();
    }
  }
  if (std::getenv("FLATMEM_TEST_VERBOSE")) std::printf("%s: largest error / tolerance %.3g\n", what, worst);
  return "";
}

GlobalBatch make_batch(const RingCase &rc) {
  GlobalBatch b;
  for (int r = 0; r < rc.ranks(); ++r) {
    b.row_offset.push_back(b.global_rows);
    b.col_offset.push_back(b.global_cols);
    b.global_rows += rc.rows[std::size_t(r)];
    b.global_cols += rc.columns(r);
  }
  Random rng(rc.seed);
  b.q = HostTensor::matrix(rc.dtype, b.global_rows, rc.d);
  b.k = HostTensor::matrix(rc.dtype, b.global_cols, rc.d);
  fill_features(b.q, rng, 1.0, true);
  fill_features(b.k, rng, 1.0, true);
  if (rc.labels) {
    b.labels = HostTensor::vector(Dtype::i64, b.global_rows);
    for (std::int64_t i = 0; i < b.global_rows; ++i) b.labels.set(i, double(rng.below(b.global_cols)));
  }
  if (rc.saturated >= 0.0) {
    fill_saturated(b.k, rng, rc.saturated);
    for (std::int64_t i = 0; i < b.global_rows; ++i) {
      const std::int64_t y = rc.labels ? std::int64_t(b.labels.get(i)) : i;
      for (std::int64_t t = 0; t < rc.d; ++t) b.q.set(i, t, b.k.get(y, t));
    }
  }
  b.scale = HostTensor::scalar(Dtype::f32, rc.scale);
  return b;
}

RankInputs slice(const RingCase &rc, const GlobalBatch &batch, int rank) {
  const std::int64_t b = rc.rows[std::size_t(rank)], row0 = batch.row_offset[std::size_t(rank)];
  RankInputs in;
  in.q = rows_of(batch.q, row0, b);
  in.k = rows_of(batch.k, batch.col_offset[std::size_t(rank)], rc.columns(rank));
  in.has_labels = rc.labels;
  if (rc.labels) {
    in.labels = HostTensor::vector(Dtype::i64, b);
    for (std::int64_t i = 0; i < b; ++i) in.labels.set(i, batch.labels.get(row0 + i));
  }
  return in;
}

RankResult run_rank(flatmem_comm_t *comm, const RingCase &rc, const GlobalBatch &batch, int rank) {
  const std::int64_t b = rc.rows[std::size_t(rank)], c = rc.columns(rank), d = rc.d;
  const RankInputs in = slice(rc, batch, rank);
  const HostTensor &q = in.q, &k = in.k;
  flatmem_contrastive_options o = make_options(rc.loss, rc.threads, rc.tile, rc.tile);
  o.comm = comm;
  Handle h = create_handle(o);
  RankResult res;
  res.loss = nan_vector(Dtype::f32, 1);
  res.row_lse = nan_vector(Dtype::f32, b);
  if (rc.symmetric()) res.col_lse = nan_vector(Dtype::f32, c);
  DLTensor *col_lse = rc.symmetric() ? res.col_lse.dl() : nullptr;
  const DLTensor *label_dl = in.labels_dl();
  res.status = flatmem_contrastive_forward(h.get(), q.dl(), k.dl(), label_dl, batch.scale.dl(),
                                           res.loss.dl(), res.row_lse.dl(), col_lse, nullptr, 0, nullptr);
  if (res.status != FLATMEM_STATUS_SUCCESS) {
    res.error = flatmem_last_error();
    return res;
  }
  const HostTensor dloss = HostTensor::scalar(Dtype::f32, rc.dloss);
  res.dq = nan_matrix(rc.grad_out, b, d);
  if (rc.want_dk) res.dk = nan_matrix(rc.grad_out, c, d);
  res.ds = nan_vector(Dtype::f32, 1);
  res.status = flatmem_contrastive_backward(h.get(), q.dl(), k.dl(), label_dl, batch.scale.dl(),
                                            res.row_lse.dl(), col_lse, dloss.dl(), res.dq.dl(),
                                            rc.want_dk ? res.dk.dl() : nullptr, res.ds.dl(), nullptr, 0,
                                            nullptr);
  if (res.status != FLATMEM_STATUS_SUCCESS) res.error = flatmem_last_error();
  return res;
}

ReferenceResult reference_of(const RingCase &rc, const GlobalBatch &batch) {
  const double g = HostTensor::scalar(Dtype::f32, rc.dloss).get(0);  // the fp32 value the library reads
  return reference_loss(reference_problem(rc.symmetric(), batch.q, batch.k,
                                          rc.labels ? &batch.labels : nullptr, batch.scale, g));
}

std::string check_rank(const RingCase &rc, const GlobalBatch &batch, const ReferenceResult &ref,
                       const RankResult &res, int rank) {
  if (res.status != FLATMEM_STATUS_SUCCESS)
    return std::string(flatmem_status_string(res.status)) + ": " + res.error;
  const double g = HostTensor::scalar(Dtype::f32, rc.dloss).get(0);
  const ReferenceProblem problem = reference_problem(rc.symmetric(), batch.q, batch.k,
                                                     rc.labels ? &batch.labels : nullptr, batch.scale, g);
  const ForwardTolerance ftol = forward_tolerance(problem, ref);
  const BackwardTolerance btol = backward_tolerance(problem, ref, ftol, rc.grad_out, rc.grad_out, rc.dtype);
  const std::int64_t row0 = batch.row_offset[std::size_t(rank)], col0 = batch.col_offset[std::size_t(rank)];
  std::string report = compare("loss", res.loss, {ref.loss}, {ftol.loss}, 0);
  if (report.empty()) report = compare("row_lse", res.row_lse, ref.row_lse, ftol.row_lse, row0);
  if (report.empty() && rc.symmetric()) report = compare("col_lse", res.col_lse, ref.col_lse, ftol.col_lse, col0);
  if (report.empty()) report = compare("dq", res.dq, ref.dq, btol.dq, row0 * rc.d);
  if (report.empty() && rc.want_dk) report = compare("dk", res.dk, ref.dk, btol.dk, col0 * rc.d);
  if (report.empty()) report = compare("dlogit_scale", res.ds, {ref.ds}, {btol.ds}, 0);
  if (rc.saturated >= 0.0) {  // as exact as a materialised fp32 loss
    if (report.empty()) report = compare("saturated loss", res.loss, {ref.loss}, saturation_tolerance({ref.loss}), 0);
    if (report.empty()) report = compare("saturated dq", res.dq, ref.dq, saturation_tolerance(ref.dq), row0 * rc.d);
    if (report.empty() && rc.want_dk)
      report = compare("saturated dk", res.dk, ref.dk, saturation_tolerance(ref.dk), col0 * rc.d);
    if (report.empty()) report = compare("saturated dlogit_scale", res.ds, {ref.ds}, saturation_tolerance({ref.ds}), 0);
  }
  return report.empty() ? "" : "rank " + std::to_string(rank) + ": " + report;
}

bool same_bits(const RankResult &a, const RankResult &b) {
  return a.loss.same_bits(b.loss) && a.row_lse.same_bits(b.row_lse) &&
         a.col_lse.same_bits(b.col_lse) && a.dq.same_bits(b.dq) && a.dk.same_bits(b.dk) &&
         a.ds.same_bits(b.ds);
}

}  // namespace ring_test
