// Training a StageMlp with cyclic data parallelism: the per-rank loop over a
// flatmem_cyclic_t (what a framework would write), and two single-process
// references -- a simulation of the update rules (the chain's summation
// order, the schedule's delays worked out here from their definition) and
// plain SGD on the concatenated batch of all ranks.
//
// Data: rank r trains in step s on rows (s * world + r) * rows .. + rows - 1
// of task_batch, so the N micro-batches of a step make one global batch.
#pragma once

#include <flatmem/flatmem.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "support/stage_mlp.hpp"

namespace test {

struct TrainSetup {
  std::vector<int> widths{6, 8, 7, 5};  // L = widths.size() - 1 stages
  int rows = 4;                         // micro-batch of one rank
  std::int64_t steps = 6;
  flatmem_cyclic_rule rule = FLATMEM_CYCLIC_DELAY1;
  double lr = 0.1;
  std::uint64_t seed = 7;
  int stages() const { return int(widths.size()) - 1; }
};

template <typename T>
struct RankRun {
  StageMlp<T> model;
  std::vector<double> losses;  // per step, on this rank's micro-batch
};

// Called after each action of the loop (benchmarks time and sample here).
using ActionHook = std::function<void(const flatmem_cyclic_action &)>;

// One rank's training through `handle` (created over a communicator of
// `world` ranks with setup's stages, steps and rule). Returns "" or what failed
// (the failing call, its status and message).
template <typename T>
std::string train_rank(flatmem_cyclic_t *handle, const TrainSetup &setup, int rank, int world,
                       RankRun<T> &run, const ActionHook &hook = nullptr);

// The update rules of flatmem/cyclic.h in one process: every rank's model after
// the whole schedule, with bitwise the runtime's arithmetic for DELAY1 and
// NEWEST (SYNC sums in chain order here, the runtime in ring order).
template <typename T>
std::vector<RankRun<T>> simulate(const TrainSetup &setup, int world);

// Plain SGD on the concatenated batch (world * rows rows per step).
template <typename T>
StageMlp<T> train_concatenated(const TrainSetup &setup, int world);

// The flatmem_cyclic_options for a setup (activation bytes per stage: rows *
// widths[j + 1] * sizeof(T), the stage's output).
struct CyclicOptions {
  flatmem_cyclic_options options;
  std::vector<std::int64_t> activation_bytes;
  std::vector<std::int64_t> parameter_count;  // relayed_options only
};
CyclicOptions cyclic_options(const TrainSetup &setup, std::size_t element_bytes,
                             std::int64_t timeout_ms = 0);

// The MLP of the cyclic tests: widths 5, 4, 5, 6, 4, ... , 3 (L stages), 3 rows.
TrainSetup mlp_setup(int stages, std::int64_t steps, flatmem_cyclic_rule rule);

// A compact 1-d host tensor of n = *shape elements of T (float / double).
template <typename T>
DLTensor vector_tensor(T *data, std::int64_t *shape);

// "<call>: <status>: <last error>" for a failed call.
std::string call_failed(const char *call, flatmem_status status);

// --- ZeRO relay (options.parameters = RELAYED) ---
// cyclic_options plus parameters = RELAYED and parameter_count = the
// StageMlp's stage sizes (out x (in + 1)).
CyclicOptions relayed_options(const TrainSetup &setup, std::size_t element_bytes,
                              std::int64_t timeout_ms = 0);

// [begin, end) of a stage of n elements that `rank` of `world` owns, from the
// header's definition: c = ceil(n / world), [min(rank c, n), min((rank+1) c, n)).
struct ShardRange {
  std::size_t begin, end;
};
ShardRange shard_of(std::size_t n, int rank, int world);

// One rank of a relayed training: its shards of every stage (initially
// those of StageMlp::make) and its losses.
template <typename T>
struct RelayRun {
  std::vector<std::vector<T>> shards;
  std::vector<double> losses;
  static RelayRun initial(const TrainSetup &setup, int rank, int world);
};

// train_rank for a relayed handle: registers the shards, takes every stage
// from flatmem_cyclic_parameters before its forward / backward, applies each
// update to its shard (the same SGD expression as StageMlp::sgd); one
// gradient buffer per stage (the header says that is enough when relayed).
// The relay calls train_rank_relayed makes: set_shard(handle, stage, shard)
// at the start, parameters(handle, action, full) before each FORWARD /
// BACKWARD. Empty: flatmem_cyclic_set_shard / flatmem_cyclic_parameters
// (tests substitute the _stream variants, or try wrong tensors first).
struct RelayCalls {
  std::function<flatmem_status(flatmem_cyclic_t *, std::int32_t, DLTensor *)> set_shard;
  std::function<flatmem_status(flatmem_cyclic_t *, const flatmem_cyclic_action &, DLTensor *)> parameters;
};

template <typename T>
std::string train_rank_relayed(flatmem_cyclic_t *handle, const TrainSetup &setup, int rank, int world,
                               RelayRun<T> &run, const ActionHook &hook = nullptr, const RelayCalls &calls = {});

// The full model from every rank's shards.
template <typename T>
StageMlp<T> assemble(const TrainSetup &setup, const std::vector<RelayRun<T>> &runs);

}  // namespace test
