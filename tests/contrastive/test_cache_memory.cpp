// The logit cache's memory (flatmem.h, "Logit cache"): a handle holds
// min(logit_cache_bytes, 4 b c) bytes of cache after its first forward, all
// of it written (resident), and never more than the budget. Measured as peak
// resident memory (VmHWM) of a forward + backward on a handle with the cache
// minus the same on an identical handle without it, both handles alive so
// that neither reuses the other's freed memory, after a warm-up run. Unsanitized builds only.
#include <doctest/doctest.h>
#include <flatmem/flatmem.h>

#include <cstdint>

#include "support/contrastive.hpp"
#include "support/contrastive_bitwise.hpp"
#include "support/peak_memory.hpp"

using namespace flatmem_test;

TEST_CASE("contrastive/logit-cache/memory-is-the-budget") {
  // b = c = 2048: all tiles are 16 MiB. Tolerances: 256 KiB below (the cache
  // is written in full, so it is resident; page granularity only) and
  // 512 KiB above (allocator bookkeeping and the 16 KiB fingerprint scratch).
  const BitwiseCase bc{FLATMEM_CONTRASTIVE_SYMMETRIC, Dtype::f32, 2048, 2048, 16};
  const BitwiseProblem p(bc);
  const std::int64_t all = 2048LL * 2048 * 4;
  struct Budget {
    std::size_t bytes;
    std::int64_t expected;
  };
  // A first run on its own handle pays the one-time costs (BLAS buffers,
  // thread-local state) that would otherwise land in the first measurement.
  Handle warm = create_handle(p.options(2));
  Results warm_results;
  p.forward(warm.get(), warm_results);
  p.backward(warm.get(), warm_results);
  for (const Budget budget : {Budget{3u << 20, 3LL << 20}, Budget{64u << 20, all}}) {
    CAPTURE(budget.bytes);
    Handle plain = create_handle(p.options(2));
    Results r0, r1;
    const std::int64_t base = peak_bytes_during([&] {
      p.forward(plain.get(), r0);
      p.backward(plain.get(), r0);
    });
    Handle cached = create_handle(p.options(2, budget.bytes));
    const std::int64_t with = peak_bytes_during([&] {
      p.forward(cached.get(), r1);
      p.backward(cached.get(), r1);
    });
    const std::int64_t extra = with - base;
    CHECK_MESSAGE(extra >= budget.expected - (256 << 10), "extra ", extra, " bytes");
    CHECK_MESSAGE(extra <= budget.expected + (512 << 10), "extra ", extra, " bytes");
    check_identical(r0, r1, true);
  }
}
