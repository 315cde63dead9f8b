#include "support/saturation.hpp"

#include <algorithm>
#include <cmath>

namespace flatmem_test {

void fill_saturated(HostTensor &q, Random &rng, double cos) {
  const std::int64_t d = q.cols();
  std::vector<double> u(static_cast<std::size_t>(d)), row(static_cast<std::size_t>(d));
  const auto unit = [&](std::vector<double> &v) {
    double norm2 = 0.0;
    for (double &x : v) x = rng.normal(), norm2 += x * x;
    for (double &x : v) x /= std::sqrt(norm2);
  };
  unit(u);
  const double a = std::sqrt(cos / (1.0 - cos));
  for (std::int64_t r = 0; r < q.rows(); ++r) {
    unit(row);
    double norm2 = 0.0;
    for (std::int64_t t = 0; t < d; ++t) {
      row[std::size_t(t)] += a * u[std::size_t(t)];
      norm2 += row[std::size_t(t)] * row[std::size_t(t)];
    }
    for (std::int64_t t = 0; t < d; ++t) q.set(r, t, row[std::size_t(t)] / std::sqrt(norm2));
  }
}

std::vector<double> saturation_tolerance(const std::vector<double> &want) {
  double largest = 0.0;
  for (double w : want) largest = std::max(largest, std::fabs(w));
  return std::vector<double>(want.size(), 2.0 * largest + 1e-14);
}

}  // namespace flatmem_test
