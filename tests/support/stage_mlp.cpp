#include "support/stage_mlp.hpp"

#include <cmath>

namespace test {
namespace {

// splitmix64: a well-mixed 64-bit hash.
std::uint64_t mix(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// U(-1, 1) from a key.
double uniform(std::uint64_t key) { return double(mix(key) >> 11) * 0x1.0p-52 - 1.0; }

}  // namespace

template <typename T>
StageMlp<T> StageMlp<T>::make(const std::vector<int> &widths, std::uint64_t seed) {
  StageMlp m;
  m.widths = widths;
  for (int j = 0; j + 1 < int(widths.size()); ++j) {
    const int in = widths[std::size_t(j)], out = widths[std::size_t(j) + 1];
    std::vector<T> p(std::size_t(out) * std::size_t(in + 1));
    const double scale = 1.0 / std::sqrt(double(in));
    for (std::size_t i = 0; i < p.size(); ++i)
      p[i] = T(scale * uniform(seed * 0x100000001b3ull + std::uint64_t(j) * 0x1000000ull + i));
    m.params.push_back(std::move(p));
  }
  return m;
}

template <typename T>
void StageMlp<T>::forward(int j, const T *x, T *y, int rows) const {
  const int in = widths[std::size_t(j)], out = widths[std::size_t(j) + 1];
  const T *w = params[std::size_t(j)].data(), *b = w + std::size_t(out) * std::size_t(in);
  for (int r = 0; r < rows; ++r)
    for (int o = 0; o < out; ++o) {
      T acc = b[o];
      const T *wo = w + std::size_t(o) * std::size_t(in), *xr = x + std::size_t(r) * std::size_t(in);
      for (int i = 0; i < in; ++i) acc += wo[i] * xr[i];
      y[std::size_t(r) * std::size_t(out) + std::size_t(o)] = last(j) ? acc : std::tanh(acc);
    }
}

template <typename T>
void StageMlp<T>::backward(int j, const T *x, const T *y, const T *dy, T *dx, T *grad,
                           int rows) const {
  const int in = widths[std::size_t(j)], out = widths[std::size_t(j) + 1];
  const T *w = params[std::size_t(j)].data();
  T *gw = grad, *gb = grad + std::size_t(out) * std::size_t(in);
  for (std::size_t i = 0; i < param_count(j); ++i) grad[i] = T(0);
  std::vector<T> dz(static_cast<std::size_t>(out));
  for (int r = 0; r < rows; ++r) {
    const T *xr = x + std::size_t(r) * std::size_t(in);
    for (int o = 0; o < out; ++o) {
      const std::size_t k = std::size_t(r) * std::size_t(out) + std::size_t(o);
      dz[std::size_t(o)] = last(j) ? dy[k] : dy[k] * (T(1) - y[k] * y[k]);
      gb[o] += dz[std::size_t(o)];
      T *gwo = gw + std::size_t(o) * std::size_t(in);
      for (int i = 0; i < in; ++i) gwo[i] += dz[std::size_t(o)] * xr[i];
    }
    if (dx == nullptr) continue;
    for (int i = 0; i < in; ++i) {
      T acc = T(0);
      for (int o = 0; o < out; ++o) acc += dz[std::size_t(o)] * w[std::size_t(o) * std::size_t(in) + std::size_t(i)];
      dx[std::size_t(r) * std::size_t(in) + std::size_t(i)] = acc;
    }
  }
}

template <typename T>
void StageMlp<T>::sgd(int j, const T *grad, T lr) {
  std::vector<T> &p = params[std::size_t(j)];
  for (std::size_t i = 0; i < p.size(); ++i) p[i] -= lr * grad[i];
}

template <typename T>
void task_batch(std::int64_t first_row, int rows, int in, int out, T *x, T *target) {
  for (int r = 0; r < rows; ++r) {
    const std::uint64_t row = std::uint64_t(first_row + r);
    for (int i = 0; i < in; ++i) x[std::size_t(r) * std::size_t(in) + std::size_t(i)] = T(uniform(row * 65537u + std::uint64_t(i)));
    for (int o = 0; o < out; ++o) {
      double acc = 0;
      for (int i = 0; i < in; ++i)
        acc += double(x[std::size_t(r) * std::size_t(in) + std::size_t(i)]) *
               uniform(0xabcdefull * 1000003u + std::uint64_t(i) * 4099u + std::uint64_t(o)) * 1.5 / std::sqrt(double(in));
      target[std::size_t(r) * std::size_t(out) + std::size_t(o)] = T(0.5 * std::tanh(acc));
    }
  }
}

template <typename T>
double mse_loss(const T *prediction, const T *target, int rows, int out, T *dprediction) {
  double loss = 0;
  for (std::size_t k = 0; k < std::size_t(rows) * std::size_t(out); ++k) {
    const T d = prediction[k] - target[k];
    loss += 0.5 * double(d) * double(d);
    dprediction[k] = d / T(rows);
  }
  return loss / rows;
}

template struct StageMlp<float>;
template struct StageMlp<double>;
template void task_batch<float>(std::int64_t, int, int, int, float *, float *);
template void task_batch<double>(std::int64_t, int, int, int, double *, double *);
template double mse_loss<float>(const float *, const float *, int, int, float *);
template double mse_loss<double>(const double *, const double *, int, int, double *);

}  // namespace test
