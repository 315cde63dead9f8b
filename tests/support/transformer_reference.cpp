#include "support/transformer_reference.hpp"

#include <cmath>

namespace flatmem_test {
namespace {

// Row-major matrices as flat vectors. c (m x n) = a (m x k) b (k x n).
Values matmul(const Values &a, const Values &b, std::int64_t m, std::int64_t k, std::int64_t n) {
  Values c(std::size_t(m * n), 0.0);
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t t = 0; t < k; ++t)
      for (std::int64_t j = 0; j < n; ++j) c[i * n + j] += a[i * k + t] * b[t * n + j];
  return c;
}
// c (m x k) = a (m x n) b^T, b (k x n).
Values matmul_bt(const Values &a, const Values &b, std::int64_t m, std::int64_t n, std::int64_t k) {
  Values c(std::size_t(m * k), 0.0);
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < k; ++j)
      for (std::int64_t t = 0; t < n; ++t) c[i * k + j] += a[i * n + t] * b[j * n + t];
  return c;
}
// c (k x n) = a^T b, a (m x k), b (m x n).
Values matmul_at(const Values &a, const Values &b, std::int64_t m, std::int64_t k, std::int64_t n) {
  Values c(std::size_t(k * n), 0.0);
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t t = 0; t < k; ++t)
      for (std::int64_t j = 0; j < n; ++j) c[t * n + j] += a[i * k + t] * b[i * n + j];
  return c;
}
void add_bias(Values &y, const Values &bias, std::int64_t m, std::int64_t n) {
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) y[i * n + j] += bias[j];
}
Values column_sums(const Values &a, std::int64_t m, std::int64_t n) {
  Values s(std::size_t(n), 0.0);
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) s[j] += a[i * n + j];
  return s;
}

struct LayerNorm {
  Values xhat, rstd, y;
};

// xhat = (x - mean) / sqrt(var + eps) with the biased variance; y = xhat gamma + beta.
LayerNorm layer_norm(const Values &x, const Values &gamma, const Values &beta, std::int64_t m,
                     std::int64_t n, double eps) {
  LayerNorm ln{Values(x.size()), Values(std::size_t(m)), Values(x.size())};
  for (std::int64_t i = 0; i < m; ++i) {
    double mean = 0.0, var = 0.0;
    for (std::int64_t j = 0; j < n; ++j) mean += x[i * n + j];
    mean /= double(n);
    for (std::int64_t j = 0; j < n; ++j) var += (x[i * n + j] - mean) * (x[i * n + j] - mean);
    var /= double(n);
    ln.rstd[i] = 1.0 / std::sqrt(var + eps);
    for (std::int64_t j = 0; j < n; ++j) {
      ln.xhat[i * n + j] = (x[i * n + j] - mean) * ln.rstd[i];
      ln.y[i * n + j] = ln.xhat[i * n + j] * gamma[j] + beta[j];
    }
  }
  return ln;
}

// Given dy = dL/d(LN output): dgamma, dbeta and dx.
//   dx = rstd (g - mean(g) - xhat mean(g xhat)),  g = dy gamma
void layer_norm_backward(const LayerNorm &ln, const Values &gamma, const Values &dy, std::int64_t m,
                         std::int64_t n, Values &dx, Values &dgamma, Values &dbeta) {
  dx.assign(std::size_t(m * n), 0.0);
  dgamma.assign(std::size_t(n), 0.0);
  dbeta.assign(std::size_t(n), 0.0);
  for (std::int64_t i = 0; i < m; ++i) {
    double mean_g = 0.0, mean_gx = 0.0;
    for (std::int64_t j = 0; j < n; ++j) {
      const double g = dy[i * n + j] * gamma[j];
      mean_g += g;
      mean_gx += g * ln.xhat[i * n + j];
      dgamma[j] += dy[i * n + j] * ln.xhat[i * n + j];
      dbeta[j] += dy[i * n + j];
    }
    mean_g /= double(n);
    mean_gx /= double(n);
    for (std::int64_t j = 0; j < n; ++j)
      dx[i * n + j] =
          ln.rstd[i] * (dy[i * n + j] * gamma[j] - mean_g - ln.xhat[i * n + j] * mean_gx);
  }
}

double normal_cdf(double u) { return 0.5 * std::erfc(-u / std::sqrt(2.0)); }
double normal_pdf(double u) { return std::exp(-0.5 * u * u) / std::sqrt(2.0 * M_PI); }

// Attention: everything the backward needs.
struct AttentionPass {
  LayerNorm ln;
  Values qkv, probs, attn, y;  // probs: (batch, heads, tokens, tokens)
};

AttentionPass attention_forward(const BlockConfig &c, const BlockParameterValues &p, const Values &x) {
  const std::int64_t M = c.rows(), W = c.width, T = c.tokens, H = c.heads, d = W / H;
  AttentionPass a;
  a.ln = layer_norm(x, p[0], p[1], M, W, c.eps);
  a.qkv = matmul(a.ln.y, p[2], M, W, 3 * W);
  add_bias(a.qkv, p[3], M, 3 * W);
  a.probs.assign(std::size_t(c.batch * H * T * T), 0.0);
  a.attn.assign(std::size_t(M * W), 0.0);
  const double scale = 1.0 / std::sqrt(double(d));
  for (std::int64_t b = 0; b < c.batch; ++b)
    for (std::int64_t h = 0; h < H; ++h) {
      double *P = &a.probs[std::size_t((b * H + h) * T * T)];
      const auto q = [&](std::int64_t i, std::int64_t t) { return a.qkv[(b * T + i) * 3 * W + h * d + t]; };
      const auto k = [&](std::int64_t i, std::int64_t t) { return a.qkv[(b * T + i) * 3 * W + W + h * d + t]; };
      const auto v = [&](std::int64_t i, std::int64_t t) { return a.qkv[(b * T + i) * 3 * W + 2 * W + h * d + t]; };
      for (std::int64_t i = 0; i < T; ++i) {
        double m = -INFINITY;
        for (std::int64_t j = 0; j < T; ++j) {
          double s = 0.0;
          for (std::int64_t t = 0; t < d; ++t) s += q(i, t) * k(j, t);
          P[i * T + j] = s * scale;
          m = std::max(m, P[i * T + j]);
        }
        double sum = 0.0;
        for (std::int64_t j = 0; j < T; ++j) sum += (P[i * T + j] = std::exp(P[i * T + j] - m));
        for (std::int64_t j = 0; j < T; ++j) P[i * T + j] /= sum;
        for (std::int64_t t = 0; t < d; ++t) {
          double s = 0.0;
          for (std::int64_t j = 0; j < T; ++j) s += P[i * T + j] * v(j, t);
          a.attn[(b * T + i) * W + h * d + t] = s;
        }
      }
    }
  a.y = matmul(a.attn, p[4], M, W, W);
  add_bias(a.y, p[5], M, W);
  return a;
}

BlockGradients attention_vjp(const BlockConfig &c, const BlockParameterValues &p, const Values &x,
                             const Values &dy) {
  const std::int64_t M = c.rows(), W = c.width, T = c.tokens, H = c.heads, d = W / H;
  const AttentionPass a = attention_forward(c, p, x);
  BlockGradients g;
  g.dparams[4] = matmul_at(a.attn, dy, M, W, W);
  g.dparams[5] = column_sums(dy, M, W);
  const Values dattn = matmul_bt(dy, p[4], M, W, W);
  Values dqkv(std::size_t(M * 3 * W), 0.0);
  const double scale = 1.0 / std::sqrt(double(d));
  for (std::int64_t b = 0; b < c.batch; ++b)
    for (std::int64_t h = 0; h < H; ++h) {
      const double *P = &a.probs[std::size_t((b * H + h) * T * T)];
      const auto at = [&](std::int64_t i, std::int64_t part, std::int64_t t) {
        return std::size_t((b * T + i) * 3 * W + part * W + h * d + t);
      };
      const auto da = [&](std::int64_t i, std::int64_t t) { return dattn[(b * T + i) * W + h * d + t]; };
      Values ds(static_cast<std::size_t>(T * T), 0.0);
      for (std::int64_t i = 0; i < T; ++i) {
        // dP_ij = <da_i, v_j>;  dS_ij = P_ij (dP_ij - sum_k P_ik dP_ik)
        Values dp(static_cast<std::size_t>(T), 0.0);
        double dot = 0.0;
        for (std::int64_t j = 0; j < T; ++j) {
          for (std::int64_t t = 0; t < d; ++t) dp[j] += da(i, t) * a.qkv[at(j, 2, t)];
          dot += P[i * T + j] * dp[j];
        }
        for (std::int64_t j = 0; j < T; ++j) ds[i * T + j] = P[i * T + j] * (dp[j] - dot);
      }
      for (std::int64_t i = 0; i < T; ++i)
        for (std::int64_t j = 0; j < T; ++j)
          for (std::int64_t t = 0; t < d; ++t) {
            dqkv[at(j, 2, t)] += P[i * T + j] * da(i, t);                     // dV = P^T dA
            dqkv[at(i, 0, t)] += scale * ds[i * T + j] * a.qkv[at(j, 1, t)];  // dQ = dS K / sqrt d
            dqkv[at(j, 1, t)] += scale * ds[i * T + j] * a.qkv[at(i, 0, t)];  // dK = dS^T Q / sqrt d
          }
    }
  g.dparams[2] = matmul_at(a.ln.y, dqkv, M, W, 3 * W);
  g.dparams[3] = column_sums(dqkv, M, 3 * W);
  const Values dln = matmul_bt(dqkv, p[2], M, 3 * W, W);
  layer_norm_backward(a.ln, p[0], dln, M, W, g.dx, g.dparams[0], g.dparams[1]);
  return g;
}

struct MlpPass {
  LayerNorm ln;
  Values u, gelu, y;
};

MlpPass mlp_forward(const BlockConfig &c, const BlockParameterValues &p, const Values &x) {
  const std::int64_t M = c.rows(), W = c.width, Hd = c.hidden;
  MlpPass m;
  m.ln = layer_norm(x, p[0], p[1], M, W, c.eps);
  m.u = matmul(m.ln.y, p[2], M, W, Hd);
  add_bias(m.u, p[3], M, Hd);
  m.gelu.resize(m.u.size());
  for (std::size_t i = 0; i < m.u.size(); ++i) m.gelu[i] = m.u[i] * normal_cdf(m.u[i]);
  m.y = matmul(m.gelu, p[4], M, Hd, W);
  add_bias(m.y, p[5], M, W);
  return m;
}

BlockGradients mlp_vjp(const BlockConfig &c, const BlockParameterValues &p, const Values &x,
                       const Values &dy) {
  const std::int64_t M = c.rows(), W = c.width, Hd = c.hidden;
  const MlpPass m = mlp_forward(c, p, x);
  BlockGradients g;
  g.dparams[4] = matmul_at(m.gelu, dy, M, Hd, W);
  g.dparams[5] = column_sums(dy, M, W);
  Values du = matmul_bt(dy, p[4], M, W, Hd);
  // GELU'(u) = Phi(u) + u phi(u)
  for (std::size_t i = 0; i < du.size(); ++i) du[i] *= normal_cdf(m.u[i]) + m.u[i] * normal_pdf(m.u[i]);
  g.dparams[2] = matmul_at(m.ln.y, du, M, W, Hd);
  g.dparams[3] = column_sums(du, M, Hd);
  const Values dln = matmul_bt(du, p[2], M, Hd, W);
  layer_norm_backward(m.ln, p[0], dln, M, W, g.dx, g.dparams[0], g.dparams[1]);
  return g;
}

}  // namespace

std::array<std::int64_t, 6> block_parameter_sizes(const BlockConfig &c) {
  const std::int64_t W = c.width;
  if (c.kind == BlockKind::attention) return {W, W, W * 3 * W, 3 * W, W * W, W};
  return {W, W, W * c.hidden, c.hidden, c.hidden * W, W};
}

Values block_forward(const BlockConfig &c, const BlockParameterValues &p, const Values &x) {
  return c.kind == BlockKind::attention ? attention_forward(c, p, x).y : mlp_forward(c, p, x).y;
}

BlockGradients block_vjp(const BlockConfig &c, const BlockParameterValues &p, const Values &x,
                         const Values &dy) {
  return c.kind == BlockKind::attention ? attention_vjp(c, p, x, dy) : mlp_vjp(c, p, x, dy);
}

}  // namespace flatmem_test
