#include "contrastive/sigmoid_reference.hpp"

#include <algorithm>
#include <cmath>

#include "support/tolerance.hpp"

namespace flatmem_test {
namespace {

double softplus(double v) { return std::max(v, 0.0) + std::log1p(std::exp(-std::fabs(v))); }
double sigmoid(double v) {
  const double e = std::exp(-std::fabs(v));
  return v >= 0.0 ? 1.0 / (1.0 + e) : e / (1.0 + e);
}

}  // namespace

SigmoidResult sigmoid_reference(const SigmoidProblem &p) {
  const std::int64_t b = p.b, c = p.c, d = p.d;
  SigmoidResult r;
  r.dq.assign(std::size_t(b * d), 0.0);
  r.dq_abs = r.dq_count = r.dq;
  r.dk.assign(std::size_t(c * d), 0.0);
  r.dk_abs = r.dk_count = r.dk;
  double loss = 0.0;
  for (std::int64_t i = 0; i < b; ++i) {
    const std::int64_t y = p.labels.empty() ? i : p.labels[std::size_t(i)];
    for (std::int64_t j = 0; j < c; ++j) {
      const double *qi = &p.q[std::size_t(i * d)], *kj = &p.k[std::size_t(j * d)];
      double dot = 0.0, mag = 0.0;
      for (std::int64_t t = 0; t < d; ++t) {
        dot += qi[t] * kj[t];
        mag += std::fabs(qi[t] * kj[t]);
      }
      const double z = j == y ? 1.0 : -1.0;
      const double v = -z * (p.scale * dot + p.bias);
      loss += softplus(v);
      const double g = p.dloss * -z * sigmoid(v) / double(b);
      r.ds += g * dot;
      r.dt += g;
      r.max_abs_dot = std::max(r.max_abs_dot, mag);
      r.sum_abs_g += std::fabs(g);
      r.sum_abs_g_r += std::fabs(g) * mag;
      for (std::int64_t t = 0; t < d; ++t) {
        const std::size_t iq = std::size_t(i * d + t), ik = std::size_t(j * d + t);
        r.dq[iq] += p.scale * g * kj[t];
        r.dk[ik] += p.scale * g * qi[t];
        r.dq_abs[iq] += std::fabs(g * kj[t]);
        r.dk_abs[ik] += std::fabs(g * qi[t]);
        r.dq_count[iq] += std::fabs(kj[t]);
        r.dk_count[ik] += std::fabs(qi[t]);
      }
    }
  }
  r.loss = loss / double(b);
  return r;
}

SigmoidTolerance sigmoid_tolerance(const SigmoidProblem &p, const SigmoidResult &r, Dtype dq_out,
                                   Dtype dk_out, Dtype input) {
  SigmoidTolerance t;
  const double dx = p.scale * gamma_n(double(p.d + 2)) * r.max_abs_dot + u32 * std::fabs(p.bias);
  // sum |G| with g = 1 (r holds |g| times it)
  const double g = std::fabs(p.dloss);
  const double sum_abs_g1 = g > 0.0 ? r.sum_abs_g / g : double(p.c);
  t.loss = slack * (dx * sum_abs_g1 + 4.0 * u32 * double(p.c) + 2.0 * u32 * std::fabs(r.loss));
  const double eps_g = dx + 10.0 * u32;
  const double underflow = g / double(p.b) * 0x1p-125;
  const auto matrix_tol = [&](const std::vector<double> &abs, const std::vector<double> &count,
                              const std::vector<double> &value, double terms, Dtype out) {
    std::vector<double> tol(value.size());
    for (std::size_t n = 0; n < value.size(); ++n) {
      const double fp32 =
          slack * p.scale * ((eps_g + gamma_n(terms) + gradient_entry_error(input, terms)) * abs[n] +
                             underflow * count[n]);
      tol[n] = fp32 * (1.0 + output_rounding(out)) + output_rounding(out) * std::fabs(value[n]) +
               output_floor(out);
    }
    return tol;
  };
  t.dq = matrix_tol(r.dq_abs, r.dq_count, r.dq, double(p.c), dq_out);
  t.dk = matrix_tol(r.dk_abs, r.dk_count, r.dk, double(p.b), dk_out);
  const double cells = double(p.b) * double(p.c);
  t.ds = slack * ((eps_g + gamma_n(double(p.d))) * r.sum_abs_g_r + underflow * cells * r.max_abs_dot) +
         2.0 * u32 * std::fabs(r.ds);
  t.dt = slack * (eps_g * r.sum_abs_g + underflow * cells) + 2.0 * u32 * std::fabs(r.dt);
  return t;
}

}  // namespace flatmem_test
