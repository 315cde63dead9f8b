// Shared by test_amx_gemm.cpp (the AMX kernels over the exact emulation of
// the tile operations, every machine) and amx_hardware_check.cpp (the
// hardware against the emulation, bit for bit, where the processor has AMX):
// random bf16 operands whose padding is NaN, the kernels' three products as
// function pointers, and the float64 products with their error bounds.
//
// Bounds (u = 2^-24, gamma_n = n u / (1 - n u)): bf16 x bf16 products are
// exact in fp32 and TDPBF16PS sums them in fp32 (per entry an even and an odd
// sum over its 16 pairs, their sum, then the accumulator: amx_tile_ops.hpp),
// so no product passes through more than n + 1 roundings and a sum of n
// products (plus the accumulated output) errs by at most gamma_{n+1} times the
// sum of the magnitudes. G (fp32) enters
// rounded to bf16 (relative 2^-8 per entry) or split in hi + lo (residual
// 2^-16 |G|, twice the terms), which adds rho * sum |G| |x|. A dropped pair, a
// wrong tile index or a misplaced edge moves an entry by a whole product,
// orders of magnitude beyond these bounds.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "contrastive/cpu/amx_gemm.hpp"
#include "core/dtype.hpp"
#include "support/bf16_operands.hpp"

namespace amx_test {

namespace amx = flatmem::contrastive::cpu::amx;
using flatmem::bf16_to_f32;
using flatmem::f32_to_bf16;

inline double gamma_n(double n) { return flatmem_test::bf16_gamma_n(n); }

struct Kernels {
  const char *name;
  void (*logits)(amx::Rows, amx::Rows, std::int64_t, std::int64_t, std::int64_t, float *, std::uint32_t *);
  void (*rows_times)(const float *, amx::Rows, std::int64_t, std::int64_t, std::int64_t, float *, std::int64_t,
                     bool, std::uint32_t *);
  void (*cols_times)(const float *, amx::Rows, std::int64_t, std::int64_t, std::int64_t, float *, std::int64_t,
                     bool, std::uint32_t *);
};

using flatmem_test::Bf16Matrix;
using flatmem_test::gaussian;

// Poisoned: the kernels must write every word they read.
inline std::vector<std::uint32_t> scratch_for(std::int64_t r, std::int64_t c, std::int64_t d) {
  return std::vector<std::uint32_t>(std::size_t(amx::scratch_words(r, c, d)), 0x7fc07fc0u);
}

struct Shape {
  std::int64_t r, c, d, pad;
};
// 1s, tile edges (16, 17, 31, 32, 33), odd reductions, more row / column
// blocks than one 32 x 32 block, and a long reduction (d = 519).
inline const Shape shapes[] = {{1, 1, 1, 0},    {1, 1, 2, 1},     {16, 16, 32, 0}, {17, 33, 31, 1},
                               {5, 63, 31, 2},  {13, 129, 64, 0}, {37, 97, 97, 3}, {64, 17, 128, 1},
                               {97, 131, 61, 0}, {7, 11, 519, 2}, {70, 66, 33, 1}};

// How far every output lies outside its bound (0: within; > 0: the worst excess).
struct Outcome {
  double worst_excess = 0.0;
  bool nan = false;
  void add(double got, double want, double bound) {
    if (std::isnan(got)) nan = true;
    worst_excess = std::max(worst_excess, std::fabs(got - want) - bound);
  }
  bool within() const { return !nan && worst_excess <= 0.0; }
};

// raw = Q K^T against float64.
inline Outcome check_logits(const Kernels &k, const Shape &s, std::uint64_t seed, std::vector<float> *out = nullptr) {
  std::mt19937_64 rng(seed);
  const Bf16Matrix q(s.r, s.d, s.pad, rng), kk(s.c, s.d, s.pad, rng);
  std::vector<float> raw(std::size_t(s.r * s.c), std::nanf(""));
  auto scratch = scratch_for(s.r, s.c, s.d);
  k.logits(q.rows_view(), kk.rows_view(), s.r, s.c, s.d, raw.data(), scratch.data());
  Outcome o;
  for (std::int64_t i = 0; i < s.r; ++i)
    for (std::int64_t j = 0; j < s.c; ++j) {
      double exact = 0.0, magnitude = 0.0;
      for (std::int64_t t = 0; t < s.d; ++t) exact += q.at(i, t) * kk.at(j, t), magnitude += std::fabs(q.at(i, t) * kk.at(j, t));
      o.add(raw[std::size_t(i * s.c + j)], exact, gamma_n(double(s.d + 1)) * magnitude);
    }
  if (out) *out = raw;
  return o;
}

// out += G K (rows) or G^T Q (cols) against float64, G split or rounded once.
inline Outcome check_gradient(const Kernels &k, const Shape &s, bool columns, bool split, std::uint64_t seed,
                              std::vector<float> *result = nullptr) {
  std::mt19937_64 rng(seed);
  const std::int64_t r = s.r, c = s.c, d = s.d;
  const std::vector<float> g = gaussian(std::size_t(r * c), rng, 0.5f);
  const Bf16Matrix x(columns ? r : c, d, s.pad, rng);  // k (c x d) or q (r x d)
  const std::int64_t out_rows = columns ? c : r, ld = d + 3, terms = columns ? r : c;
  std::vector<float> out = gaussian(std::size_t(out_rows * ld), rng, 1.0f);
  const std::vector<float> before = out;
  auto scratch = scratch_for(r, c, d);
  if (columns)
    k.cols_times(g.data(), x.rows_view(), r, c, d, out.data(), ld, split, scratch.data());
  else
    k.rows_times(g.data(), x.rows_view(), r, c, d, out.data(), ld, split, scratch.data());
  const double rho = split ? 0x1p-16 : 0x1p-8;
  Outcome o;
  for (std::int64_t i = 0; i < out_rows; ++i)
    for (std::int64_t f = 0; f < ld; ++f) {
      const std::size_t at = std::size_t(i * ld + f);
      if (f >= d) {  // outside the product: untouched
        o.add(out[at], before[at], 0.0);
        continue;
      }
      double exact = before[at], magnitude = std::fabs(before[at]), gx = 0.0;
      for (std::int64_t t = 0; t < terms; ++t) {
        const double gv = columns ? g[std::size_t(t * c + i)] : g[std::size_t(i * c + t)];
        exact += gv * x.at(t, f);
        magnitude += std::fabs(gv * x.at(t, f));
        gx += std::fabs(gv * x.at(t, f));
      }
      const double n = double(split ? 2 * terms : terms) + 1;
      o.add(out[at], exact, gamma_n(n) * magnitude * (1.0 + 0x1p-7) + rho * gx * 1.01);  // |hi| + |lo| <= (1 + 2^-8) |G|
    }
  if (result) *result = out;
  return o;
}

}  // namespace amx_test
