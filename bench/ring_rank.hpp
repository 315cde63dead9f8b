// One rank of bench/ring_bench: its slice of a global batch, a communicator
// over UCX, timed forward + backward steps of the ring loss, and what the ring
// measured (flatmem_contrastive_ring_stats_get).
#pragma once

#include <flatmem/flatmem.h>

#include <cstdint>

namespace ring_bench {

struct RankConfig {
  int rank = 0, world = 1, threads = 1, steps = 3;
  std::int64_t batch = 4096, d = 512;  // global B (= C, symmetric loss), feature dimension
  bool bf16 = false;
  flatmem_comm_unique_id id{};
};

// Plain bytes: sent from the rank process to the parent through a pipe.
struct RankReport {
  std::int32_t ok = 0;
  char error[256] = {};
  double step_seconds = 0.0, forward_seconds = 0.0, backward_seconds = 0.0;  // means per step
  double wait_seconds = 0.0;       // per step, blocked in ring waits (forward + backward)
  double transfer_seconds = 0.0;   // per step, the same ring payload sent alone (ring shifts)
  double bytes_sent = 0.0;         // per step, forward + backward
  double peak_bytes = 0.0;         // this process's resident-set rise during the steps
  float loss = 0.0f;
};

RankReport run_rank(const RankConfig &config);

}  // namespace ring_bench
