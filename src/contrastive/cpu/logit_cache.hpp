// The logit cache (options.logit_cache_bytes): raw logit tiles <q_i, k_j>
// kept by a forward so that the next backward on the same q and k reads them
// instead of recomputing them (a GEMM per tile saved).
//
// Layout: tiles in row-major tile order, each stored densely (R x C floats,
// leading dimension C), the row stripe of rows [r0, r1) at offset r0 * c and
// its tile of columns [c0, c1) at r0 * c + (r1 - r0) * c0: the tiles of the
// whole b x c matrix packed without gaps, so that a budget of B bytes holds
// the first B / 4 floats' worth of whole tiles. A tile that does not fit is
// recomputed. The grid only depends on the plan, so the forward and the
// backward agree on every slot.
//
// Validity: the forward records a fingerprint of q and k (shapes, dtype, a
// 128-bit hash of their elements) and marks the cache valid only once it has
// finished; the backward uses the tiles only when its q and k give the same
// fingerprint. The handle's one-thread-at-a-time rule covers the object.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "contrastive/plan.hpp"
#include "contrastive/problem.hpp"
#include "core/thread_pool.hpp"

namespace flatmem::contrastive::cpu {

struct Fingerprint {
  std::int64_t b = -1, c = -1, d = -1, tile_rows = 0, tile_cols = 0;
  int dtype = -1;
  std::uint64_t hash[2] = {0, 0};
  bool operator==(const Fingerprint &) const = default;
};

// Shapes, dtype, tile grid and a 128-bit hash of q's and k's elements (rows
// hashed in parallel on the pool, combined in a fixed order).
Fingerprint fingerprint(ThreadPool &pool, const Plan &plan, const Inputs &in);

// A view of the cache's tile slots (see the layout above); empty: no slot.
class CachedTiles {
 public:
  CachedTiles() = default;
  CachedTiles(float *data, std::size_t floats, std::int64_t c) : data_(data), floats_(floats), c_(c) {}
  // The slot of tile [rows) x [cols), or nullptr when it lies past the budget.
  float *slot(Range rows, Range cols) const {
    if (data_ == nullptr) return nullptr;
    const std::size_t offset = std::size_t(rows.begin) * std::size_t(c_) +
                               std::size_t(rows.size()) * std::size_t(cols.begin);
    const std::size_t size = std::size_t(rows.size()) * std::size_t(cols.size());
    return offset + size <= floats_ ? data_ + offset : nullptr;
  }
  bool empty() const { return data_ == nullptr; }

 private:
  float *data_ = nullptr;
  std::size_t floats_ = 0;
  std::int64_t c_ = 0;
};

class LogitCache {
 public:
  explicit LogitCache(std::size_t budget_bytes) : budget_bytes_(budget_bytes) {}

  // Prepares a forward: invalidates the cache and, with a budget, sizes it
  // for the plan (allocating on first use; OUT_OF_MEMORY naming the option)
  // and records the inputs' fingerprint. Returns the slots the forward
  // fills (empty without a budget).
  CachedTiles begin_forward(ThreadPool &pool, const Plan &plan, const Inputs &in);
  // The forward finished: its tiles may be read by a backward.
  void finish_forward() { valid_ = used_floats_ > 0; }
  void invalidate() { valid_ = false; }

  // The slots a backward on (plan, in) may read: empty unless the last
  // forward finished on the same fingerprint.
  CachedTiles for_backward(ThreadPool &pool, const Plan &plan, const Inputs &in) const;

  std::size_t allocated_bytes() const { return capacity_floats_ * sizeof(float); }

 private:
  std::size_t budget_bytes_;
  std::unique_ptr<float[]> data_;
  std::size_t capacity_floats_ = 0;  // allocated
  std::size_t used_floats_ = 0;      // min(capacity, b c) of the last forward
  std::int64_t c_ = 0;
  Fingerprint filled_;
  bool valid_ = false;
};

}  // namespace flatmem::contrastive::cpu
