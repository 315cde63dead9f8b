// A small MLP cut into L stages, for the cyclic data-parallel tests, the
// benchmark and their single-process references. Stage j maps widths[j] to
// widths[j + 1] features: y = tanh(x W^T + b), the last stage without tanh.
// Loss: mean over rows of 0.5 * |prediction - target|^2 on a synthetic
// regression task (a fixed random teacher), so training converges.
//
// Deterministic plain loops (no BLAS, no threads): the same inputs give the
// same bits in every process, which the bitwise equivalence tests rely on.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace test {

template <typename T>
struct StageMlp {
  std::vector<int> widths;             // L + 1
  std::vector<std::vector<T>> params;  // per stage: W (out x in, row-major), then b (out)

  // Parameters ~ U(-1, 1) / sqrt(in) from `seed`.
  static StageMlp make(const std::vector<int> &widths, std::uint64_t seed);

  int stages() const { return int(widths.size()) - 1; }
  std::size_t param_count(int j) const { return params[std::size_t(j)].size(); }
  bool last(int j) const { return j + 1 == stages(); }

  // x: rows x in; y: rows x out.
  void forward(int j, const T *x, T *y, int rows) const;
  // Given the stage's input x, output y and dL/dy: writes dL/dx (when dx is
  // not null) and the parameter gradient (W then b, summed over rows).
  void backward(int j, const T *x, const T *y, const T *dy, T *dx, T *grad, int rows) const;
  // params[j] -= lr * grad
  void sgd(int j, const T *grad, T lr);
};

// Rows first_row .. first_row + rows - 1 of the synthetic task: x in
// [-1, 1]^in from a hash of (row, column), target = 0.5 tanh(x A) with a
// fixed teacher A (in x out).
template <typename T>
void task_batch(std::int64_t first_row, int rows, int in, int out, T *x, T *target);

// Loss of a prediction (rows x out) and dL/dprediction (mean over rows).
template <typename T>
double mse_loss(const T *prediction, const T *target, int rows, int out, T *dprediction);

extern template struct StageMlp<float>;
extern template struct StageMlp<double>;

}  // namespace test
