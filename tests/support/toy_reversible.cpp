#include "support/toy_reversible.hpp"

#include <cmath>
#include <string>

#include "support/random.hpp"

namespace flatmem_test {
namespace {

std::uint64_t splitmix(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// keep_ij of the dropout: u(seed, offset + index) >= p.
bool keep(double p, std::uint64_t seed, std::uint64_t offset, std::int64_t index) {
  if (p <= 0) return true;
  const std::uint64_t u = splitmix(seed ^ splitmix(offset + std::uint64_t(index) + 0x51ED2701ull));
  return double(u >> 11) * 0x1.0p-53 >= p;
}

struct Guard {  // counts concurrent entries into one ToyFunction
  explicit Guard(ToyFunction &f) : fn(f) {
    if (fn.running.fetch_add(1) != 0) fn.overlapped_itself = true;
  }
  ~Guard() { fn.running.fetch_sub(1); }
  ToyFunction &fn;
};

// Returns a failure status when this call is the injected one.
flatmem_status injected_failure(ToyFunction &fn) {
  const std::int64_t call = ++fn.calls;
  if (call != fn.fail_on_call) return FLATMEM_STATUS_SUCCESS;
  const std::string message = "toy failure injected at call " + std::to_string(call);
  flatmem_reversible_callback_error(message.c_str());
  return fn.fail_status;
}

bool check_x(const ToyFunction &fn, const DLTensor *x, std::int64_t &rows) {
  if (x->shape[x->ndim - 1] != fn.width) return false;
  rows = 1;
  for (int i = 0; i + 1 < x->ndim; ++i) rows *= x->shape[i];
  return true;
}

template <typename T>
struct Rows {
  ToyFunction *fn;
  const flatmem_reversible_context *ctx;
  const T *x;
  T *y;        // forward: output; vjp: dz scratch
  T *t;        // residuals (tanh values) or NULL
  const T *dy;
  T *dx;
};

template <typename T>
T pre_activation(const ToyFunction &fn, const T *x_row, int j) {
  const int w = fn.width;
  T s = T(fn.bias[std::size_t(j)]);
  if (fn.mixing)
    for (int k = 0; k < w; ++k) s += x_row[k] * T(fn.weight[std::size_t(k) * w + j]);
  else
    s += x_row[j] * T(fn.weight[std::size_t(j)]);
  return s;
}

template <typename T>
void forward_row(void *arg, std::int64_t i, std::int32_t) {
  auto &r = *static_cast<Rows<T> *>(arg);
  const ToyFunction &fn = *r.fn;
  const int w = fn.width;
  const T inv_keep = T(1 / (1 - fn.dropout));
  for (int j = 0; j < w; ++j) {
    const T t = std::tanh(pre_activation(fn, r.x + i * w, j));
    if (r.t) r.t[i * w + j] = t;
    r.y[i * w + j] = keep(fn.dropout, r.ctx->seed, r.ctx->offset, i * w + j) ? t * (fn.dropout > 0 ? inv_keep : T(1)) : T(0);
  }
}

// dz = dy * mask / (1 - p) * (1 - t^2) into r.y; dx += dz W^T (or dz * w).
template <typename T>
void vjp_row(void *arg, std::int64_t i, std::int32_t) {
  auto &r = *static_cast<Rows<T> *>(arg);
  const ToyFunction &fn = *r.fn;
  const int w = fn.width;
  const T inv_keep = T(1 / (1 - fn.dropout));
  T *dz = r.y + i * w;
  for (int j = 0; j < w; ++j) {
    const T t = r.t[i * w + j];
    const bool kept = keep(fn.dropout, r.ctx->seed, r.ctx->offset, i * w + j);
    dz[j] = kept ? r.dy[i * w + j] * (fn.dropout > 0 ? inv_keep : T(1)) * (T(1) - t * t) : T(0);
  }
  for (int k = 0; k < w; ++k) {
    T s = 0;
    if (fn.mixing)
      for (int j = 0; j < w; ++j) s += dz[j] * T(fn.weight[std::size_t(k) * w + j]);
    else
      s = dz[k] * T(fn.weight[std::size_t(k)]);
    r.dx[i * w + k] += s;
  }
}

template <typename T>
flatmem_status toy_forward(ToyFunction &fn, const flatmem_reversible_context *ctx, const DLTensor *x,
                           DLTensor *y, void *residuals) {
  std::int64_t rows;
  if (!check_x(fn, x, rows)) return FLATMEM_STATUS_INVALID_ARGUMENT;
  std::vector<T> scratch;
  Rows<T> r{&fn, ctx, static_cast<const T *>(x->data), static_cast<T *>(y->data),
            static_cast<T *>(residuals), nullptr, nullptr};
  ctx->parallel_for(ctx, rows, forward_row<T>, &r);
  return FLATMEM_STATUS_SUCCESS;
}

template <typename T>
flatmem_status toy_vjp(ToyFunction &fn, const flatmem_reversible_context *ctx, const DLTensor *x,
                       const void *residuals, const DLTensor *dy, DLTensor *dx) {
  std::int64_t rows;
  if (!check_x(fn, x, rows) || residuals == nullptr) return FLATMEM_STATUS_INVALID_ARGUMENT;
  const int w = fn.width;
  std::vector<T> dz(std::size_t(rows) * w);
  Rows<T> r{&fn, ctx, static_cast<const T *>(x->data), dz.data(),
            static_cast<T *>(const_cast<void *>(residuals)), static_cast<const T *>(dy->data),
            static_cast<T *>(dx->data)};
  ctx->parallel_for(ctx, rows, vjp_row<T>, &r);
  // Parameter gradients, serially in row order (deterministic), in double.
  for (std::int64_t i = 0; i < rows; ++i)
    for (int j = 0; j < w; ++j) {
      const double d = double(dz[std::size_t(i * w + j)]);
      fn.d_bias[std::size_t(j)] += d;
      if (fn.mixing)
        for (int k = 0; k < w; ++k) fn.d_weight[std::size_t(k) * w + j] += double(r.x[i * w + k]) * d;
      else
        fn.d_weight[std::size_t(j)] += double(r.x[i * w + j]) * d;
    }
  return FLATMEM_STATUS_SUCCESS;
}

bool is_f64(const DLTensor *x) { return x->dtype.bits == 64; }

flatmem_status forward_callback(void *user, const flatmem_reversible_context *ctx,
                                const DLTensor *x, DLTensor *y, void *residuals) {
  auto &fn = *static_cast<ToyFunction *>(user);
  Guard guard(fn);
  if (flatmem_status s = injected_failure(fn)) return s;
  return is_f64(x) ? toy_forward<double>(fn, ctx, x, y, residuals)
                   : toy_forward<float>(fn, ctx, x, y, residuals);
}

flatmem_status vjp_callback(void *user, const flatmem_reversible_context *ctx, const DLTensor *x,
                            const void *residuals, const DLTensor *dy, DLTensor *dx) {
  auto &fn = *static_cast<ToyFunction *>(user);
  Guard guard(fn);
  ++fn.vjp_calls;
  if (flatmem_status s = injected_failure(fn)) return s;
  return is_f64(x) ? toy_vjp<double>(fn, ctx, x, residuals, dy, dx)
                   : toy_vjp<float>(fn, ctx, x, residuals, dy, dx);
}

flatmem_status residual_size_callback(void *user, const flatmem_reversible_context *,
                                      const DLTensor *x, size_t *bytes) {
  auto &fn = *static_cast<ToyFunction *>(user);
  std::int64_t rows;
  if (!check_x(fn, x, rows)) return FLATMEM_STATUS_INVALID_ARGUMENT;
  *bytes = std::size_t(rows) * std::size_t(fn.width) * (is_f64(x) ? 8 : 4);
  return FLATMEM_STATUS_SUCCESS;
}

}  // namespace

ToyFunction::ToyFunction(int w, bool mix, std::uint64_t seed, double scale)
    : width(w), mixing(mix) {
  Random rng(seed);
  const std::size_t n = mix ? std::size_t(w) * w : std::size_t(w);
  // Mixing weights ~ scale / sqrt(width) keep tanh out of saturation.
  const double s = mix ? scale / std::sqrt(double(w)) : scale;
  for (std::size_t i = 0; i < n; ++i) weight.push_back(s * rng.normal());
  for (int j = 0; j < w; ++j) bias.push_back(0.1 * rng.normal());
  zero_gradients();
}

void ToyFunction::zero_gradients() {
  d_weight.assign(weight.size(), 0.0);
  d_bias.assign(bias.size(), 0.0);
}

flatmem_reversible_function ToyFunction::function() {
  return flatmem_reversible_function{forward_callback, vjp_callback, residual_size_callback, this};
}

ToySegment::ToySegment(int n, int width, bool mixing, std::uint64_t seed, double dropout,
                       double scale) {
  for (int k = 0; k < n; ++k) {
    f.push_back(std::make_unique<ToyFunction>(width, mixing, seed * 1000 + 2 * k, scale));
    g.push_back(std::make_unique<ToyFunction>(width, mixing, seed * 1000 + 2 * k + 1, scale));
    f.back()->dropout = g.back()->dropout = dropout;
    blocks.push_back(flatmem_reversible_block{f.back()->function(), g.back()->function()});
  }
}

void ToySegment::zero_gradients() {
  for (auto &fn : f) fn->zero_gradients();
  for (auto &fn : g) fn->zero_gradients();
}

std::uint64_t documented_block_seed(std::uint64_t seed, std::int32_t block, std::int32_t part) {
  const std::uint64_t m = 2 * std::uint64_t(block) + std::uint64_t(part) + 1;
  return splitmix(seed ^ (0x9E3779B97F4A7C15ull * m));
}

namespace {

// One function in double: t = tanh(pre), out = t * mask / (1 - p).
struct Activation {
  std::vector<double> t, mask;
};

Activation apply(const ToyFunction &fn, std::int64_t rows, const std::vector<double> &x,
                 std::uint64_t seed, std::uint64_t offset, std::vector<double> &out) {
  const int w = fn.width;
  Activation a;
  a.t.resize(x.size());
  a.mask.resize(x.size());
  out.resize(x.size());
  for (std::int64_t i = 0; i < rows; ++i)
    for (int j = 0; j < w; ++j) {
      double s = fn.bias[std::size_t(j)];
      if (fn.mixing)
        for (int k = 0; k < w; ++k) s += x[std::size_t(i * w + k)] * fn.weight[std::size_t(k) * w + j];
      else
        s += x[std::size_t(i * w + j)] * fn.weight[std::size_t(j)];
      const std::size_t e = std::size_t(i * w + j);
      a.t[e] = std::tanh(s);
      a.mask[e] = keep(fn.dropout, seed, offset, std::int64_t(e)) ? 1 / (1 - fn.dropout) : 0;
      out[e] = a.t[e] * a.mask[e];
    }
  return a;
}

// dx += J^T dy; parameter gradients into dw, db.
void pull_back(const ToyFunction &fn, std::int64_t rows, const std::vector<double> &x,
               const Activation &a, const std::vector<double> &dy, std::vector<double> &dx,
               std::vector<double> &dw, std::vector<double> &db) {
  const int w = fn.width;
  dw.assign(fn.weight.size(), 0.0);
  db.assign(fn.bias.size(), 0.0);
  for (std::int64_t i = 0; i < rows; ++i)
    for (int j = 0; j < w; ++j) {
      const std::size_t e = std::size_t(i * w + j);
      const double dz = dy[e] * a.mask[e] * (1 - a.t[e] * a.t[e]);
      db[std::size_t(j)] += dz;
      if (fn.mixing)
        for (int k = 0; k < w; ++k) {
          dx[std::size_t(i * w + k)] += dz * fn.weight[std::size_t(k) * w + j];
          dw[std::size_t(k) * w + j] += x[std::size_t(i * w + k)] * dz;
        }
      else {
        dx[e] += dz * fn.weight[std::size_t(j)];
        dw[std::size_t(j)] += x[e] * dz;
      }
    }
}

}  // namespace

ReferenceResult reference_segment(const ToySegment &segment, std::int64_t rows,
                                  const std::vector<double> &x1, const std::vector<double> &x2,
                                  const std::vector<double> &dy1, const std::vector<double> &dy2,
                                  std::uint64_t seed, std::uint64_t offset) {
  const std::size_t n = segment.blocks.size();
  std::vector<std::vector<double>> a(n + 1), b(n + 1);  // states S_k = (a_k, b_k)
  std::vector<Activation> act_f(n), act_g(n);
  a[0] = x1;
  b[0] = x2;
  for (std::size_t k = 0; k < n; ++k) {
    std::vector<double> f, g;
    act_f[k] = apply(*segment.f[k], rows, b[k], documented_block_seed(seed, int(k), 0), offset, f);
    a[k + 1] = a[k];
    for (std::size_t e = 0; e < f.size(); ++e) a[k + 1][e] += f[e];
    act_g[k] = apply(*segment.g[k], rows, a[k + 1], documented_block_seed(seed, int(k), 1), offset, g);
    b[k + 1] = b[k];
    for (std::size_t e = 0; e < g.size(); ++e) b[k + 1][e] += g[e];
  }
  ReferenceResult r;
  r.y1 = a[n];
  r.y2 = b[n];
  r.d_weight_f.resize(n);
  r.d_bias_f.resize(n);
  r.d_weight_g.resize(n);
  r.d_bias_g.resize(n);
  std::vector<double> da = dy1, db = dy2;
  for (std::size_t k = n; k-- > 0;) {
    // Y2 = X2 + G(Y1): dY1 total = dY1 + J_G^T dY2
    pull_back(*segment.g[k], rows, a[k + 1], act_g[k], db, da, r.d_weight_g[k], r.d_bias_g[k]);
    // Y1 = X1 + F(X2): dX2 = dY2 + J_F^T dX1
    pull_back(*segment.f[k], rows, b[k], act_f[k], da, db, r.d_weight_f[k], r.d_bias_f[k]);
  }
  r.dx1 = da;
  r.dx2 = db;
  return r;
}

}  // namespace flatmem_test
