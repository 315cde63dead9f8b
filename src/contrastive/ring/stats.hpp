// What one ring call measured about its own communication (the experimental
// flatmem_contrastive_ring_stats reports the last forward and backward).
#pragma once

#include <cstdint>

namespace flatmem::contrastive::ring {

struct Stats {
  std::uint64_t bytes_sent = 0;      // ring payload this rank sent (not the small collectives)
  std::uint64_t messages_sent = 0;
  double wait_seconds = 0.0;         // blocked in waits for ring messages
  double seconds = 0.0;              // the whole call
  std::int32_t steps = 0;            // ring steps (= ranks)
};

}  // namespace flatmem::contrastive::ring
