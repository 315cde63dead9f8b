#include "support/reference.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace flatmem_test {
namespace {

// log sum_n exp(v[n * step]) for n < count, shifted by the maximum.
double log_sum_exp(const double *v, std::int64_t count, std::int64_t step) {
  double m = -std::numeric_limits<double>::infinity();
  for (std::int64_t n = 0; n < count; ++n) m = std::max(m, v[n * step]);
  double sum = 0.0;
  for (std::int64_t n = 0; n < count; ++n) sum += std::exp(v[n * step] - m);
  return m + std::log(sum);
}

}  // namespace

ReferenceResult reference_loss(const ReferenceProblem &p) {
  const std::int64_t b = p.b, c = p.c, d = p.d;
  if (p.q.size() != std::size_t(b * d) || p.k.size() != std::size_t(c * d))
    throw std::invalid_argument("reference_loss: q or k has the wrong size");
  if (p.symmetric && c != b) throw std::invalid_argument("reference_loss: symmetric needs c = b");
  if (!p.labels.empty() && p.labels.size() != std::size_t(b))
    throw std::invalid_argument("reference_loss: labels must have b entries");
  const auto positive = [&](std::int64_t i) { return p.labels.empty() ? i : p.labels[std::size_t(i)]; };
  const auto at = [](std::vector<double> &m, std::int64_t cols, std::int64_t r, std::int64_t col) -> double & {
    return m[std::size_t(r * cols + col)];
  };

  ReferenceResult r;
  // dot_ij = <q_i, k_j>, abs_dot_ij = R_ij, x_ij = s dot_ij.
  std::vector<double> dot(std::size_t(b * c)), abs_dot(std::size_t(b * c)), x(std::size_t(b * c));
  for (std::int64_t i = 0; i < b; ++i)
    for (std::int64_t j = 0; j < c; ++j) {
      double sum = 0.0, abs_sum = 0.0;
      for (std::int64_t t = 0; t < d; ++t) {
        const double prod = p.q[std::size_t(i * d + t)] * p.k[std::size_t(j * d + t)];
        sum += prod;
        abs_sum += std::fabs(prod);
      }
      at(dot, c, i, j) = sum;
      at(abs_dot, c, i, j) = abs_sum;
      at(x, c, i, j) = p.scale * sum;
      r.max_abs_dot = std::max(r.max_abs_dot, abs_sum);
    }

  for (std::int64_t i = 0; i < b; ++i) {
    const auto [lo, hi] = std::minmax_element(dot.begin() + i * c, dot.begin() + (i + 1) * c);
    r.max_spread = std::max(r.max_spread, *hi - *lo);
  }
  for (std::int64_t j = 0; j < c; ++j) {
    double lo = dot[std::size_t(j)], hi = lo;
    for (std::int64_t i = 0; i < b; ++i) lo = std::min(lo, at(dot, c, i, j)), hi = std::max(hi, at(dot, c, i, j));
    if (p.symmetric) r.max_spread = std::max(r.max_spread, hi - lo);
  }

  // Forward.
  r.row_lse.resize(std::size_t(b));
  for (std::int64_t i = 0; i < b; ++i) r.row_lse[std::size_t(i)] = log_sum_exp(&x[std::size_t(i * c)], c, 1);
  double positives = 0.0;
  for (std::int64_t i = 0; i < b; ++i) positives += at(x, c, i, positive(i));
  double lse_total = 0.0;
  for (double v : r.row_lse) lse_total += v;
  if (p.symmetric) {
    r.col_lse.resize(std::size_t(c));
    for (std::int64_t j = 0; j < c; ++j) r.col_lse[std::size_t(j)] = log_sum_exp(&x[std::size_t(j)], b, c);
    double col_total = 0.0;
    for (double v : r.col_lse) col_total += v;
    // Column j's positive is row j (c = b): sum_j x_jj = sum_i x_ii.
    r.loss = ((lse_total - positives) + (col_total - positives)) / (2.0 * double(b));
  } else {
    r.loss = (lse_total - positives) / double(b);
  }

  // Backward: G and the magnitudes.
  const double norm = p.symmetric ? 2.0 * double(b) : double(b);
  const double g = p.dloss;
  const double count_unit = std::fabs(g) / norm;
  r.dq.assign(std::size_t(b * d), 0.0);
  r.dk.assign(std::size_t(c * d), 0.0);
  r.dq_weighted.assign(std::size_t(b * d), 0.0);
  r.dq_count.assign(std::size_t(b * d), 0.0);
  r.dq_abs.assign(std::size_t(b * d), 0.0);
  r.dk_weighted.assign(std::size_t(c * d), 0.0);
  r.dk_count.assign(std::size_t(c * d), 0.0);
  r.dk_abs.assign(std::size_t(c * d), 0.0);
  for (std::int64_t i = 0; i < b; ++i) {
    const std::int64_t y = positive(i);
    const double *qi = &p.q[std::size_t(i * d)];
    for (std::int64_t j = 0; j < c; ++j) {
      const double xij = at(x, c, i, j);
      const double P = std::exp(xij - r.row_lse[std::size_t(i)]);
      const double Q = p.symmetric ? std::exp(xij - r.col_lse[std::size_t(j)]) : 0.0;
      const double hit = j == y ? 1.0 : 0.0;
      const double G = p.symmetric ? g * (P + Q - 2.0 * hit) / norm : g * (P - hit) / norm;
      const double W = count_unit * (P + Q + 2.0 * hit);
      const double absG = std::fabs(G);
      const double *kj = &p.k[std::size_t(j * d)];
      double *dqi = &r.dq[std::size_t(i * d)], *dkj = &r.dk[std::size_t(j * d)];
      double *dqw = &r.dq_weighted[std::size_t(i * d)], *dqn = &r.dq_count[std::size_t(i * d)],
             *dqa = &r.dq_abs[std::size_t(i * d)];
      double *dkw = &r.dk_weighted[std::size_t(j * d)], *dkn = &r.dk_count[std::size_t(j * d)],
             *dka = &r.dk_abs[std::size_t(j * d)];
      for (std::int64_t t = 0; t < d; ++t) {
        const double ak = std::fabs(kj[t]), aq = std::fabs(qi[t]);
        dqi[t] += G * kj[t];
        dkj[t] += G * qi[t];
        dqw[t] += W * ak;
        dqn[t] += count_unit * ak;
        dqa[t] += absG * ak;
        dkw[t] += W * aq;
        dkn[t] += count_unit * aq;
        dka[t] += absG * aq;
      }
      r.ds += G * at(dot, c, i, j);
      r.ds_weighted += W * at(abs_dot, c, i, j);
      r.ds_count += count_unit * at(abs_dot, c, i, j);
      r.ds_abs += absG * at(abs_dot, c, i, j);
    }
  }
  // dq = s G k, dk = s G^T q: the scale multiplies values and magnitudes alike.
  for (auto *v : {&r.dq, &r.dk, &r.dq_weighted, &r.dq_count, &r.dq_abs, &r.dk_weighted, &r.dk_count, &r.dk_abs})
    for (double &e : *v) e *= p.scale;
  return r;
}

}  // namespace flatmem_test
