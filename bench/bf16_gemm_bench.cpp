// bf16_gemm_bench: the bf16 tile products (src/contrastive/cpu/bf16_gemm_kernels.inc,
// compiled here for the hardware exactly as the library compiles it) against
// single-threaded OpenBLAS sgemm on the same tile in fp32, in the same process,
// so that a noisy machine shows in both columns. One thread, one tile at a time,
// as the loss's walk calls them. Per product and shape: GFLOP/s (2 R C d per
// product, whatever the split costs), best of --rounds, the ratio to sgemm, and
// the share of vdpbf16ps's own ceiling, measured first in registers only (the
// split issues two vdpbf16ps per multiply-add pair: counted).
//
//   bf16_gemm_bench [--shapes 512x512x512,512x512x256,...] [--min-time 0.05] [--rounds 10]
//
// Without AVX512_BF16 it says so and exits 0.
#include <cblas.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <immintrin.h>

#include "bench_support.hpp"
#include "contrastive/cpu/bf16_gemm.hpp"
#include "core/dtype.hpp"
#include <flatmem/flatmem.h>

#pragma GCC push_options
#pragma GCC target("arch=x86-64-v4,avx512bf16,prefer-vector-width=512")
#define FLATMEM_BF16_NS bench_kernels
#define FLATMEM_V(name) _mm512_##name
#define FLATMEM_VT(type) __##type
#include "contrastive/cpu/bf16_gemm_kernels.inc"
#undef FLATMEM_VT
#undef FLATMEM_V
#undef FLATMEM_BF16_NS

namespace {

// The instruction ceilings, registers only (24 independent accumulators, no
// loads): what vdpbf16ps and fp32 vfmadd231ps sustain on this core, in FLOP/s
// (vdpbf16ps: 32 bf16 multiply-adds, vfmadd231ps: 16 fp32 ones).
template <bool Bf16>
double peak_gflops(double min_time) {
  __m512 acc[24];
  for (__m512 &a : acc) a = _mm512_setzero_ps();
  const __m512 x = _mm512_set1_ps(1.0f), y = _mm512_set1_ps(0x1p-60f);
  const __m512bh xb = (__m512bh)_mm512_set1_epi32(0x3f803f80), yb = (__m512bh)_mm512_set1_epi32(0x20002000);
  const long batch = 100000;
  long iters = 0;
  const double t0 = bench::now_seconds();
  double t = t0;
  do {
    for (long it = 0; it < batch; ++it) {
#pragma GCC unroll 24
      for (int i = 0; i < 24; ++i)
        acc[i] = Bf16 ? _mm512_dpbf16_ps(acc[i], xb, yb) : _mm512_fmadd_ps(x, y, acc[i]);
    }
    iters += batch;
    t = bench::now_seconds();
  } while (t - t0 < min_time);
  alignas(64) float lanes[16];
  float sum = 0.0f;
  for (__m512 &a : acc) {
    _mm512_store_ps(lanes, a);
    sum += lanes[0];
  }
  if (sum == 1.25f) std::printf(" ");  // keeps the loop
  return double(iters) * 24.0 * (Bf16 ? 64.0 : 32.0) / (t - t0) * 1e-9;
}

}  // namespace
#pragma GCC pop_options

// -DFLATMEM_BENCH_BASELINE='"path/to/old/bf16_gemm_kernels.inc"': another
// version of the kernels (say, git show HEAD~3:src/contrastive/cpu/...) timed
// in the same rounds, for before / after columns. It is given the scratch of
// the current version twice over.
#ifdef FLATMEM_BENCH_BASELINE
#pragma GCC push_options
#pragma GCC target("arch=x86-64-v4,avx512bf16,prefer-vector-width=512")
#define FLATMEM_BF16_NS bench_baseline
#define FLATMEM_V(name) _mm512_##name
#define FLATMEM_VT(type) __##type
#include FLATMEM_BENCH_BASELINE
#undef FLATMEM_VT
#undef FLATMEM_V
#undef FLATMEM_BF16_NS
#pragma GCC pop_options
#endif

extern "C" void openblas_set_num_threads(int);

namespace {

namespace bf = flatmem::contrastive::cpu::bf16;

struct Shape {
  std::int64_t r, c, d;
};

struct Current {
  static constexpr auto logits = bench_kernels::tile_logits;
  static constexpr auto rows_times = bench_kernels::accumulate_rows_times;
  static constexpr auto cols_times = bench_kernels::accumulate_cols_times;
};
#ifdef FLATMEM_BENCH_BASELINE
struct Baseline {
  static constexpr auto logits = bench_baseline::tile_logits;
  static constexpr auto rows_times = bench_baseline::accumulate_rows_times;
  static constexpr auto cols_times = bench_baseline::accumulate_cols_times;
};
#endif

// One product under every engine: the fp32 sgemm, the kernels, and the
// baseline kernels when compiled in. Seconds per call, best over the rounds;
// the engines alternate within each round so that a noisy neighbour slows
// them alike.
struct Product {
  const char *name;
  int parts;  // vdpbf16ps per multiply-add pair: 2 for the split
  std::vector<std::function<void()>> engines;  // sgemm, kernels[, baseline]
};

std::vector<double> best_seconds(const Product &p, double min_time, int rounds) {
  std::vector<double> best(p.engines.size(), 1e30);
  for (const auto &fn : p.engines) fn();  // warm the caches and the pages
  for (int round = 0; round < rounds; ++round)
    for (std::size_t e = 0; e < p.engines.size(); ++e) {
      int reps = 0;
      const double t0 = bench::now_seconds();
      double t = t0;
      do {
        p.engines[e]();
        ++reps;
        t = bench::now_seconds();
      } while (t - t0 < min_time);
      best[e] = std::min(best[e], (t - t0) / reps);
    }
  return best;
}

void run_shape(const Shape &s, double min_time, int rounds, double dpbf16_peak) {
  std::mt19937_64 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto fill = [&](std::vector<float> &v, float sigma) {
    for (float &x : v) x = sigma * normal(rng);
  };
  std::vector<float> qf(std::size_t(s.r * s.d)), kf(std::size_t(s.c * s.d)), g(std::size_t(s.r * s.c));
  fill(qf, 1.0f), fill(kf, 1.0f), fill(g, 1e-3f);
  std::vector<std::uint16_t> qb(qf.size()), kb(kf.size());
  for (std::size_t i = 0; i < qf.size(); ++i) qb[i] = flatmem::f32_to_bf16(qf[i]), qf[i] = flatmem::bf16_to_f32(qb[i]);
  for (std::size_t i = 0; i < kf.size(); ++i) kb[i] = flatmem::f32_to_bf16(kf[i]), kf[i] = flatmem::bf16_to_f32(kb[i]);
  std::vector<float> raw(std::size_t(s.r * s.c)), dq(std::size_t(s.r * s.d), 0.0f), dk(std::size_t(s.c * s.d), 0.0f);
  // twice the current need: room for a baseline whose layout needed more
  std::vector<std::uint32_t> scratch(std::size_t(2 * bf::scratch_words(s.r, s.c, s.d)));
  const bf::Rows q{qb.data(), s.d}, k{kb.data(), s.d};
  const int r = int(s.r), c = int(s.c), d = int(s.d);
  float *const rawp = raw.data(), *const dqp = dq.data(), *const dkp = dk.data();
  std::uint32_t *const sp = scratch.data();
  const float *const gp = g.data();

  std::vector<Product> products;
  auto logits = [&](auto kernels) { return [=] { kernels.logits(q, k, s.r, s.c, s.d, rawp, sp); }; };
  auto rows_times = [&](auto kernels, bool split) {
    return [=] { kernels.rows_times(gp, k, s.r, s.c, s.d, dqp, s.d, split, sp); };
  };
  auto cols_times = [&](auto kernels, bool split) {
    return [=] { kernels.cols_times(gp, q, s.r, s.c, s.d, dkp, s.d, split, sp); };
  };
  const std::function<void()> sgemm_logits = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r, c, d, 1.0f, qf.data(), d, kf.data(), d, 0.0f, rawp, c);
  };
  const std::function<void()> sgemm_rows = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r, d, c, 1.0f, gp, c, kf.data(), d, 1.0f, dqp, d);
  };
  const std::function<void()> sgemm_cols = [&] {
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, c, d, r, 1.0f, gp, c, qf.data(), d, 1.0f, dkp, d);
  };
  products.push_back({"logits Q K^T", 1, {sgemm_logits, logits(Current{})}});
  products.push_back({"dq += G K, split", 2, {sgemm_rows, rows_times(Current{}, true)}});
  products.push_back({"dq += G K, once", 1, {sgemm_rows, rows_times(Current{}, false)}});
  products.push_back({"dk += G^T Q, split", 2, {sgemm_cols, cols_times(Current{}, true)}});
  products.push_back({"dk += G^T Q, once", 1, {sgemm_cols, cols_times(Current{}, false)}});
#ifdef FLATMEM_BENCH_BASELINE
  products[0].engines.push_back(logits(Baseline{}));
  products[1].engines.push_back(rows_times(Baseline{}, true));
  products[2].engines.push_back(rows_times(Baseline{}, false));
  products[3].engines.push_back(cols_times(Baseline{}, true));
  products[4].engines.push_back(cols_times(Baseline{}, false));
#endif

  const double flops = 2.0 * double(s.r) * double(s.c) * double(s.d);
  for (const Product &p : products) {
    const std::vector<double> t = best_seconds(p, min_time, rounds);
    std::printf("%4lld %4lld %4lld  %-20s %8.1f %8.1f %7.2fx %8.0f%%", (long long)s.r, (long long)s.c,
                (long long)s.d, p.name, flops / t[1] * 1e-9, flops / t[0] * 1e-9, t[0] / t[1],
                100.0 * p.parts * flops / t[1] * 1e-9 / dpbf16_peak);
    if (t.size() > 2) std::printf(" %9.1f %7.2fx", flops / t[2] * 1e-9, t[2] / t[1]);
    std::printf("\n");
    std::fflush(stdout);
  }
}

}  // namespace

int main(int argc, char **argv) {
  std::string shapes = "512x512x512,512x512x256,512x512x768";
  double min_time = 0.05;
  int rounds = 10;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string opt = argv[i];
    if (opt == "--shapes") shapes = argv[i + 1];
    else if (opt == "--min-time") min_time = std::atof(argv[i + 1]);
    else if (opt == "--rounds") rounds = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: %s [--shapes RxCxD,...] [--min-time s] [--rounds n]\n", argv[0]);
      return 2;
    }
  }
  flatmem_cpu_isa best = FLATMEM_CPU_ISA_BASELINE;
  if (flatmem_cpu_isa_get(nullptr, &best) != FLATMEM_STATUS_SUCCESS || best < FLATMEM_CPU_ISA_AVX512BF16) {
    std::printf("no AVX512_BF16 on this processor: nothing to measure\n");
    return 0;
  }
  openblas_set_num_threads(1);
  double dpbf16_peak = 0.0, fma_peak = 0.0;
  for (int round = 0; round < rounds; ++round)
    dpbf16_peak = std::max(dpbf16_peak, peak_gflops<true>(min_time)),
    fma_peak = std::max(fma_peak, peak_gflops<false>(min_time));
  std::printf("ceilings, registers only: vdpbf16ps %.1f GFLOP/s (bf16), vfmadd231ps %.1f GFLOP/s (fp32)\n",
              dpbf16_peak, fma_peak);
  std::printf("   R    C    d  product              bf16 GF/s sgemm GF/s  bf16/sgemm  of peak%s\n",
#ifdef FLATMEM_BENCH_BASELINE
              "  baseline GF/s  speedup"
#else
              ""
#endif
  );
  for (const std::string &item : bench::split(shapes)) {
    Shape s{};
    if (std::sscanf(item.c_str(), "%lldx%lldx%lld", (long long *)&s.r, (long long *)&s.c, (long long *)&s.d) != 3) {
      std::fprintf(stderr, "bad shape %s (want RxCxD)\n", item.c_str());
      return 2;
    }
    run_shape(s, min_time, rounds, dpbf16_peak);
  }
  return 0;
}
