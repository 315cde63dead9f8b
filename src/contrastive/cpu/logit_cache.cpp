#include "contrastive/cpu/logit_cache.hpp"

#include <algorithm>
#include <cstring>
#include <new>
#include <vector>

#include "core/dtype.hpp"
#include "core/error.hpp"

namespace flatmem::contrastive::cpu {
namespace {

// Two independent 64-bit lanes; each step is a bijection of the lane for a
// fixed word, so inputs differing in one word never collide, and others
// collide with probability about 2^-128.
struct Hash128 {
  std::uint64_t a = 0x243f6a8885a308d3ull, b = 0x13198a2e03707344ull;
  void word(std::uint64_t w) {
    a = (a ^ w) * 0x9e3779b97f4a7c15ull;
    a ^= a >> 29;
    b = (b + w) * 0xc2b2ae3d27d4eb4full;
    b = (b << 31) | (b >> 33);
  }
  void bytes(const char *p, std::size_t n) {
    std::size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      std::uint64_t w;
      std::memcpy(&w, p + i, 8);
      word(w);
    }
    if (i < n) {
      std::uint64_t w = 0;
      std::memcpy(&w, p + i, n - i);
      word(w ^ (std::uint64_t(n - i) << 56));
    }
  }
};

// The hash of rows [begin, end) of m.
Hash128 hash_rows(const MatrixView &m, std::int64_t begin, std::int64_t end) {
  Hash128 h;
  const std::size_t row_bytes = std::size_t(m.cols) * dtype_bytes(m.dtype);
  const std::size_t stride_bytes = std::size_t(m.row_stride) * dtype_bytes(m.dtype);
  for (std::int64_t r = begin; r < end; ++r) h.bytes(m.data + std::size_t(r) * stride_bytes, row_bytes);
  return h;
}

}  // namespace

Fingerprint fingerprint(ThreadPool &pool, const Plan &plan, const Inputs &in) {
  Fingerprint f;
  f.b = plan.b;
  f.c = plan.c;
  f.d = plan.d;
  f.tile_rows = plan.tile_rows;
  f.tile_cols = plan.tile_cols;
  f.dtype = int(in.q.dtype);
  // Fixed chunks (not per thread) so that the fingerprint does not depend on
  // the thread count; chunk hashes combined in order.
  constexpr std::int64_t chunk_rows = 256;
  const std::int64_t q_chunks = (plan.b + chunk_rows - 1) / chunk_rows;
  const std::int64_t k_chunks = (plan.c + chunk_rows - 1) / chunk_rows;
  std::vector<Hash128> parts(std::size_t(q_chunks + k_chunks));
  pool.run(q_chunks + k_chunks, [&](std::int64_t i, int) {
    const bool is_q = i < q_chunks;
    const MatrixView &m = is_q ? in.q : in.k;
    const std::int64_t begin = (is_q ? i : i - q_chunks) * chunk_rows;
    parts[std::size_t(i)] = hash_rows(m, begin, std::min(begin + chunk_rows, m.rows));
  });
  Hash128 all;
  for (const Hash128 &p : parts) {
    all.word(p.a);
    all.word(p.b);
  }
  f.hash[0] = all.a;
  f.hash[1] = all.b;
  return f;
}

CachedTiles LogitCache::begin_forward(ThreadPool &pool, const Plan &plan, const Inputs &in) {
  valid_ = false;
  used_floats_ = 0;
  const std::size_t all = std::size_t(plan.b) * std::size_t(plan.c);
  const std::size_t wanted = std::min(budget_bytes_ / sizeof(float), all);
  if (wanted == 0) return {};
  if (capacity_floats_ < wanted) {
    data_.reset();
    capacity_floats_ = 0;
    data_.reset(new (std::nothrow) float[wanted]);
    if (!data_)
      fail(FLATMEM_STATUS_OUT_OF_MEMORY, "options.logit_cache_bytes: allocating ",
           wanted * sizeof(float), " bytes of logit cache failed (set a smaller budget, or 0)");
    capacity_floats_ = wanted;
  }
  used_floats_ = wanted;
  c_ = plan.c;
  filled_ = fingerprint(pool, plan, in);
  return {data_.get(), used_floats_, c_};
}

CachedTiles LogitCache::for_backward(ThreadPool &pool, const Plan &plan, const Inputs &in) const {
  if (!valid_ || used_floats_ == 0) return {};
  if (!(fingerprint(pool, plan, in) == filled_)) return {};
  return {data_.get(), used_floats_, c_};
}

}  // namespace flatmem::contrastive::cpu
