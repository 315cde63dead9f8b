// The object behind flatmem_reversible_t: the blocks, the resolved options,
// the CPU chains (all threads for forward / VANILLA / STANDARD; a rebuild
// chain on its own thread and a gradient chain for OVERLAPPED, made on first
// use), STANDARD mode's record of the last forward, and AUTO's timings.
#pragma once

#include <flatmem/flatmem.h>

#include <memory>
#include <vector>

#include "core/owned_workspace.hpp"
#include "reversible/auto_mode.hpp"
#include "reversible/buffers.hpp"
#include "reversible/chain.hpp"
#include "reversible/cpu/thread_chain.hpp"
#include "reversible/cpu/lane.hpp"
#include "reversible/state.hpp"

namespace flatmem::reversible {

// STANDARD mode's stored activations: states S_0 .. S_n (S_k is block k's
// input) and every block's residuals.
struct Record {
  bool valid = false;
  StateLayout layout;
  ResidualPlan residual_plan;
  ChainBuffer memory{nullptr, nullptr};
  std::size_t memory_bytes = 0;
  DLDevice memory_device{kDLCPU, 0};
  std::vector<StatePair> states;      // n + 1
  std::vector<char *> residuals;      // n slots of residual_plan.slot_bytes
};

namespace cuda {
// The OVERLAPPED schedule's second stream and its events (cuda/overlapped.cpp).
struct OverlapResources;
// AUTO's timing events on CUDA (cuda/auto_timing.cpp).
struct AutoTiming;
}  // namespace cuda
using CudaOverlapPointer = std::unique_ptr<cuda::OverlapResources, void (*)(cuda::OverlapResources *)>;
using CudaAutoTimingPointer = std::unique_ptr<cuda::AutoTiming, void (*)(cuda::AutoTiming *)>;

// Splits num_threads between the rebuild chain (a third, at least 1) and the
// gradient chain (the rest, at least 1).
int rebuild_threads(int num_threads);
int gradient_threads(int num_threads);

}  // namespace flatmem::reversible

struct flatmem_reversible_s {
  flatmem_reversible_s(std::vector<flatmem_reversible_block> b, flatmem_reversible_mode m,
                       int threads)
      : blocks(std::move(b)), mode(m), num_threads(threads), main_chain(threads) {}

  std::int32_t size() const { return std::int32_t(blocks.size()); }
  // The OVERLAPPED chains and the rebuild thread, started on first use.
  void start_overlap_chains();

  std::vector<flatmem_reversible_block> blocks;
  flatmem_reversible_mode mode;
  int num_threads;
  flatmem::reversible::cpu::ThreadChain main_chain;
  std::unique_ptr<flatmem::reversible::cpu::ThreadChain> rebuild_chain, gradient_chain;
  std::unique_ptr<flatmem::reversible::cpu::Lane> rebuild_lane;
  flatmem::reversible::Record record;
  flatmem::reversible::AutoChooser chooser;
  flatmem_reversible_mode last_mode = FLATMEM_REVERSIBLE_AUTO;
  flatmem::OwnedWorkspace workspace;
  // CUDA: the workspace used when a call passes none, and OVERLAPPED's stream.
  flatmem::reversible::ChainBuffer device_workspace{nullptr, nullptr};
  std::size_t device_workspace_bytes = 0;
  flatmem::reversible::CudaOverlapPointer cuda_overlap{nullptr, nullptr};
  flatmem::reversible::CudaAutoTimingPointer cuda_auto{nullptr, nullptr};
};
