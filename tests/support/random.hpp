// Reproducible random inputs: a fixed-seed 64-bit generator and our own
// uniform / normal transforms (the standard library's distributions are not
// specified bit for bit, so the same seed could give other inputs elsewhere).
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "support/tensor.hpp"

namespace flatmem_test {

class Random {
 public:
  explicit Random(std::uint64_t seed) : state_(seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull) {}

  // splitmix64
  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  /** Uniform in [0, 1) with 53 random bits. */
  double uniform() { return double(next() >> 11) * 0x1.0p-53; }
  /** Uniform integer in [0, n). */
  std::int64_t below(std::int64_t n) { return std::int64_t(next() % std::uint64_t(n)); }
  /** Standard normal (Box-Muller). */
  double normal() {
    const double u1 = 1.0 - uniform(), u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  std::uint64_t state_;
};

/** Fills every element of a matrix with N(0, sigma^2), rounded to its dtype.
 *  unit_rows: each row is scaled to Euclidean norm 1 before rounding (after
 *  rounding to bf16/fp16 the norm is 1 within the format's precision). */
inline void fill_features(HostTensor &m, Random &rng, double sigma, bool unit_rows) {
  std::vector<double> row(std::size_t(m.cols()));
  for (std::int64_t r = 0; r < m.rows(); ++r) {
    double norm2 = 0.0;
    for (auto &v : row) {
      v = sigma * rng.normal();
      norm2 += v * v;
    }
    const double scale = unit_rows && norm2 > 0.0 ? 1.0 / std::sqrt(norm2) : 1.0;
    for (std::int64_t c = 0; c < m.cols(); ++c) m.set(r, c, row[std::size_t(c)] * scale);
  }
}

}  // namespace flatmem_test
