// Random operands of the CPU bf16 kernel tests (test_bf16_gemm.cpp for the
// vdpbf16ps kernels, contrastive/amx_test_support.hpp for the AMX ones): bf16
// matrices whose row padding holds NaN, so that a kernel reading past a
// row's end shows up in its results; Gaussian fp32 vectors; gamma_n.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "contrastive/cpu/bf16_gemm.hpp"
#include "core/dtype.hpp"

namespace flatmem_test {

constexpr double bf16_u32 = 0x1p-24;
inline double bf16_gamma_n(double n) { return n * bf16_u32 / (1.0 - n * bf16_u32); }

struct Bf16Matrix {
  std::int64_t rows, cols, ld;
  std::vector<std::uint16_t> data;
  Bf16Matrix(std::int64_t r, std::int64_t c, std::int64_t pad, std::mt19937_64 &rng)
      : rows(r), cols(c), ld(c + pad),
        data(std::size_t(r * (c + pad)) + 1, flatmem::f32_to_bf16(std::nanf(""))) {
    std::normal_distribution<float> n(0.0f, 1.0f);
    for (std::int64_t i = 0; i < r; ++i)
      for (std::int64_t j = 0; j < c; ++j) data[std::size_t(i * ld + j)] = flatmem::f32_to_bf16(n(rng));
  }
  double at(std::int64_t i, std::int64_t j) const { return flatmem::bf16_to_f32(data[std::size_t(i * ld + j)]); }
  flatmem::contrastive::cpu::bf16::Rows rows_view() const { return {data.data(), ld}; }
};

inline std::vector<float> gaussian(std::size_t n, std::mt19937_64 &rng, float sigma) {
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(n);
  for (float &x : v) x = d(rng);
  return v;
}

}  // namespace flatmem_test
