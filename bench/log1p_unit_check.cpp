// log1p_unit_check -- the fp32 log1p(e), e in [0, 1], of the sigmoid-loss
// kernel (src/contrastive/cpu/sigmoid_math.hpp) against double log1p.
//
//   log1p_unit_check          every 61st fp32 in [0, 1] plus every fp32 within
//                             2^16 ulps of the points where the kernel switches
//                             branch (sqrt 2 - 1) or the result is steepest (0, 1)
//   log1p_unit_check --all    every fp32 in [0, 1] (about 1.07e9 values; ~10 s)
//
// Each e is evaluated twice: compiled for baseline x86-64 (no fused
// multiply-add) and for x86-64-v3 (FMA contraction allowed), as the kernel's
// ISA variants compile it. Fails (exit 1) when the largest absolute error
// exceeds 1 u = 2^-24: the sigmoid loss's error budget (tests/contrastive/
// sigmoid_reference.hpp, section 2) gives log1p less than 2u per term, and the
// kernel's comment claims 0.74u.
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

#include "contrastive/cpu/sigmoid_math.hpp"

namespace {

using flatmem::contrastive::cpu::log1p_unit;

struct Worst {
  double error = 0.0;  // in units of u = 2^-24
  float at = 0.0f;
  void add(float e, float value) {
    const double err = std::fabs(double(value) - std::log1p(double(e))) * 16777216.0;
    if (!(err <= error)) {  // NaN counts as worst
      error = err;
      at = e;
    }
  }
};

float from_bits(std::uint64_t bits) { return std::bit_cast<float>(std::uint32_t(bits)); }
std::uint32_t bits_of(float f) { return std::bit_cast<std::uint32_t>(f); }

// The same loop twice: baseline code, and code for x86-64-v3 into which the
// inline function is compiled with FMA contraction.
void check_range_baseline(std::uint32_t lo, std::uint32_t hi, std::uint32_t step, Worst &w) {
  for (std::uint64_t b = lo; b <= hi; b += step) w.add(from_bits(b), log1p_unit(from_bits(b)));
}
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target("arch=x86-64-v3")))
#endif
void check_range_fma(std::uint32_t lo, std::uint32_t hi, std::uint32_t step, Worst &w) {
  for (std::uint64_t b = lo; b <= hi; b += step) w.add(from_bits(b), log1p_unit(from_bits(b)));
}

}  // namespace

int main(int argc, char **argv) {
  const bool all = argc > 1 && std::string(argv[1]) == "--all";
  const std::uint32_t zero = 0, one = bits_of(1.0f), knee = bits_of(float(std::sqrt(2.0) - 1.0));
  const std::uint32_t window = 1u << 16;
  Worst baseline, fma;
  auto run = [&](std::uint32_t lo, std::uint32_t hi, std::uint32_t step) {
    check_range_baseline(lo, hi, step, baseline);
    check_range_fma(lo, hi, step, fma);
  };
  if (all) {
    run(zero, one, 1);
  } else {
    run(zero, one, 61);
    run(zero, zero + window, 1);
    run(knee - window, knee + window, 1);
    run(one - window, one, 1);
  }
  std::printf("log1p_unit over %s fp32 e in [0, 1]: largest absolute error %.4f u (at e = %.9g) baseline, "
              "%.4f u (at e = %.9g) with FMA; limit 1 u\n",
              all ? "every" : "a sample of", baseline.error, double(baseline.at), fma.error, double(fma.at));
  return baseline.error <= 1.0 && fma.error <= 1.0 ? 0 : 1;
}
