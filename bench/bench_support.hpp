// Small helpers shared by the benchmark's driver and its variants: clock,
// feature generation, a two-level parallel for, and an fp32 exp that GCC
// vectorises (for the naive baseline's element-wise passes).
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

namespace bench {

inline double now_seconds() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double>(clock::now().time_since_epoch()).count();
}

inline int hardware_threads() {
  const unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : int(n);
}

// body(begin, end, thread) over [0, n) cut into one contiguous chunk per
// hardware thread (thread = 0 .. hardware_threads() - 1); the calling thread
// runs chunk 0.
template <typename Body>
void parallel_for(std::int64_t n, Body &&body) {
  const int threads = int(std::min<std::int64_t>(hardware_threads(), std::max<std::int64_t>(n, 1)));
  std::vector<std::thread> workers;
  for (int t = 1; t < threads; ++t)
    workers.emplace_back([&, t] { body(t * n / threads, (t + 1) * n / threads, t); });
  body(0, n / threads, 0);
  for (auto &w : workers) w.join();
}

// CLIP-like features: q_i uniform on the unit sphere, k_i = normalize(q_i + noise).
// Deterministic in (seed, d, row), so every variant of one size sees the same data.
inline void make_features(float *q, float *k, std::int64_t b, std::int64_t d, std::uint64_t seed) {
  parallel_for(b, [&](std::int64_t begin, std::int64_t end, int) {
    std::uint64_t state = 0;
    auto uniform = [&] {  // splitmix64 -> (0, 1)
      std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      z ^= z >> 31;
      return (double(z >> 11) + 0.5) / 9007199254740992.0;
    };
    auto normal = [&] { return std::sqrt(-2.0 * std::log(uniform())) * std::cos(6.283185307179586 * uniform()); };
    for (std::int64_t i = begin; i < end; ++i) {
      state = (seed << 40) ^ std::uint64_t(i) * 0xD1B54A32D192ED03ull;  // per row: any thread count
      float *qi = q + i * d, *ki = k + i * d;
      double qn = 0.0, kn = 0.0;
      for (std::int64_t t = 0; t < d; ++t) {
        qi[t] = float(normal());
        ki[t] = qi[t] + float(normal());
        qn += double(qi[t]) * qi[t];
        kn += double(ki[t]) * ki[t];
      }
      for (std::int64_t t = 0; t < d; ++t) {
        qi[t] = float(qi[t] / std::sqrt(qn));
        ki[t] = float(ki[t] / std::sqrt(kn));
      }
    }
  });
}

// Touches every page so that first-touch faults are not timed and the pages
// count in the resident set.
inline void touch(void *p, std::size_t bytes) { std::memset(p, 0, bytes); }

// exp(x) in fp32 for x <= 0 (arguments are shifted by a maximum or an LSE):
// x = n ln2 + r, |r| <= ln2/2, exp(r) by its degree-7 Taylor polynomial
// (relative error < 6e-9, under fp32 rounding), 2^n through the exponent
// bits. Branch-free so that loops calling it vectorise. x < -87 gives 0.
inline float exp_nonpositive(float x) {
  const float xc = x < -87.0f ? -87.0f : x;
  const float shifter = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float n = (xc * 1.4426950408889634f + shifter) - shifter;
  const float r = (xc - n * 0.693145751953125f) - n * 1.428606765330187e-06f;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const std::int32_t bits = (std::int32_t(n) + 127) << 23;
  float two_n;
  std::memcpy(&two_n, &bits, 4);
  return x < -87.0f ? 0.0f : p * two_n;
}

}  // namespace bench
