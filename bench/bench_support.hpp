// Small helpers shared by the benchmarks: clock, feature generation, a
// two-level parallel for, an fp32 exp that GCC vectorises (for the naive
// baseline's element-wise passes), normal fills, and the process's peak
// resident memory as the kernel measures it.
#pragma once

#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace bench {

// "a,b,,c" -> {"a", "b", "c"}: the comma-separated lists of the bench options.
inline std::vector<std::string> split(const std::string &s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

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

// log(1 + e) in fp32 for e in [0, 1] (the softplus of the naive sigmoid loss,
// e = exp(-|v|)), branch-free for the same reason: log1p(e) = 2 atanh(r),
// r = e / (2 + e) in [0, 1/3], by its series through r^13 (the first omitted
// term, 2 r^15 / 15 <= 1e-8, is below fp32 rounding of the result).
inline float log1p_series(float e) {
  const float r = e / (2.0f + e), r2 = r * r;
  float p = 1.0f / 13.0f;
  p = p * r2 + 1.0f / 11.0f;
  p = p * r2 + 1.0f / 9.0f;
  p = p * r2 + 1.0f / 7.0f;
  p = p * r2 + 1.0f / 5.0f;
  p = p * r2 + 1.0f / 3.0f;
  p = p * r2 + 1.0f;
  return 2.0f * r * p;
}

// x[i] = mean + stddev * N(0, 1), deterministic in (seed, i) whatever the
// thread count (a splitmix64 stream per block of 4096 elements, Box-Muller).
inline void fill_normal(float *x, std::int64_t n, float mean, float stddev, std::uint64_t seed) {
  constexpr std::int64_t chunk = 4096;
  const std::int64_t chunks = (n + chunk - 1) / chunk;
  parallel_for(chunks, [&](std::int64_t begin, std::int64_t end, int) {
    for (std::int64_t c = begin; c < end; ++c) {
      std::uint64_t state = (seed * 0xD1B54A32D192ED03ull) ^ (std::uint64_t(c) * 0x9E3779B97F4A7C15ull);
      auto uniform = [&] {  // splitmix64 -> (0, 1)
        std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        return (double(z >> 11) + 0.5) / 9007199254740992.0;
      };
      for (std::int64_t i = c * chunk; i < std::min(n, (c + 1) * chunk); ++i) {
        const double r = std::sqrt(-2.0 * std::log(uniform()));
        x[i] = float(mean + stddev * r * std::cos(6.283185307179586 * uniform()));
      }
    }
  });
}

inline std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown CPU";
}

// ---- peak resident memory of this process (Linux >= 4.0) ----------------------
//
// The kernel keeps the high-water mark of the resident set (VmHWM); writing
// "5" to /proc/self/clear_refs resets it to the current RSS. So: reset, note
// VmRSS, run something, read VmHWM: the difference is what that something
// added at its peak. For freed buffers to leave the resident set between
// measurements, call malloc_for_peak_measurement() first (glibc serves every
// allocation of 1 MiB and more with mmap, unmapped on free); PeakRss::start()
// also trims the heap.
//
// That policy makes every large malloc/free pair an mmap/munmap, so code that
// allocates per call pays fresh page faults on every call. For timings,
// malloc_for_timing() puts glibc where its own dynamic thresholds settle after
// a few calls (large buffers reused from the heap, up to glibc's 32 MiB cap).

// kB of a /proc/self/status field ("VmHWM", "VmRSS"); -1 if unreadable.
inline std::int64_t proc_status_kb(const char *field) {
  std::ifstream in("/proc/self/status");
  const std::string key = std::string(field) + ":";
  for (std::string line; std::getline(in, line);)
    if (line.rfind(key, 0) == 0) {
      std::istringstream s(line.substr(key.size()));
      std::int64_t kb = -1;
      s >> kb;
      return kb;
    }
  return -1;
}

inline void trim_freed_memory() { malloc_trim(0); }

inline void malloc_for_peak_measurement() {
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
  mallopt(M_TRIM_THRESHOLD, 128 * 1024);  // glibc's default
  trim_freed_memory();
}

// mmap_threshold: allocations at least this large get their own mapping
// (glibc accepts at most 32 MiB on 64-bit); freed heap tops below twice it stay.
inline void malloc_for_timing(std::size_t mmap_threshold = std::size_t(32) << 20) {
  mallopt(M_MMAP_THRESHOLD, int(mmap_threshold));
  mallopt(M_TRIM_THRESHOLD, int(2 * mmap_threshold));
}

// Resets VmHWM to the current RSS; false if the kernel refuses.
inline bool reset_peak_rss() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  out.flush();
  return bool(out);
}

// One peak measurement: start() trims, resets the mark and notes the RSS;
// bytes() is how far the RSS rose above it since (NAN if unmeasurable).
class PeakRss {
 public:
  void start() {
    trim_freed_memory();
    ok_ = reset_peak_rss();
    before_kb_ = proc_status_kb("VmRSS");
    ok_ = ok_ && before_kb_ >= 0;
  }
  double bytes() const {
    const std::int64_t hwm = proc_status_kb("VmHWM");
    return ok_ && hwm >= 0 ? 1024.0 * double(hwm - before_kb_) : NAN;
  }
  double baseline_bytes() const { return ok_ ? 1024.0 * double(before_kb_) : NAN; }

 private:
  bool ok_ = false;
  std::int64_t before_kb_ = 0;
};

}  // namespace bench
