// Training a StageMlp stage-parallel: the loop of one stage rank over a
// flatmem_cyclic_stages_t (what a framework would write: parameter versions in
// versions_kept slots, activations kept per micro-batch, boundary tensors
// through the handle), and an in-process runner (L threads over
// flatmem_comm_create_local). Micro-batch m of step s trains on the rows that
// data-parallel rank m of N trains on in step s (support/cyclic_train.hpp), so
// the results compare with flatmem_cyclic_t training on N ranks.
#pragma once

#include <flatmem/flatmem.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "support/cyclic_train.hpp"

namespace test {

template <typename T>
struct StageRun {
  std::vector<T> params;               // the stage's version S: the trained parameters
  std::vector<std::vector<double>> losses;  // last stage: [micro-batch][step]
  std::int32_t versions_kept = 0;
};

// Called after each action (fault tests stop or kill a rank here).
using StageHook = std::function<void(const flatmem_cyclic_stages_action &)>;

// The four tensor calls of train_stage, each replaceable (tests interpose
// refusals, the *_stream variants, device tensors around the host compute).
// Each gets the handle, the current action and the host tensor the plain
// call would get (the model's buffer: a replacement that receives or
// averages must leave the result there). Empty: the plain call.
using StageCall = std::function<flatmem_status(flatmem_cyclic_stages_t *, const flatmem_cyclic_stages_action &,
                                               DLTensor *)>;
struct StageCalls {
  StageCall send, receive, accumulate, average;
};

// Stage `stage`'s training through `handle` (created over L ranks with
// setup's stages, steps, rule and `micro_batches`). "" or what failed.
template <typename T>
std::string train_stage(flatmem_cyclic_stages_t *handle, const TrainSetup &setup, int micro_batches,
                        int stage, StageRun<T> &run, const StageHook &hook = nullptr,
                        const StageCalls &calls = {});

// flatmem_cyclic_stages_options for a setup: boundary j = rows * widths[j+1]
// elements, activation bytes of stage j = its input and output per micro-batch.
struct StageOptions {
  flatmem_cyclic_stages_options options;
  std::vector<std::int64_t> boundary_bytes, activation_bytes;
};
StageOptions stage_options(const TrainSetup &setup, int micro_batches, std::size_t element_bytes,
                           std::int64_t timeout_ms = 0);

template <typename T>
struct StageTraining {
  std::vector<StageRun<T>> runs;       // per stage
  std::vector<std::string> errors;     // per stage, "" = fine
  std::vector<flatmem_cyclic_stages_summary> summaries;
  std::vector<std::vector<flatmem_cyclic_stages_time_step_stats>> stats;  // per stage, all kept
};

// L threads, one per stage, over an in-process group. `hook(stage)` may give
// a per-stage hook, `calls(stage)` per-stage calls (nullptr: none).
template <typename T>
StageTraining<T> train_stages_local(const TrainSetup &setup, int micro_batches, std::int64_t timeout_ms = 20000,
                                    const std::function<StageHook(int)> &hook = nullptr,
                                    const std::function<StageCalls(int)> &calls = nullptr);

}  // namespace test
