// The object behind flatmem_contrastive_t: resolved options, the worker
// threads, the buffer used when a call passes no workspace (always, for the
// ring; device memory for the ring on CUDA tensors), and what the last ring calls measured.
#pragma once

#include "contrastive/cpu/logit_cache.hpp"
#include "contrastive/problem.hpp"
#include "contrastive/ring/stats.hpp"
#include "core/device_workspace.hpp"
#include "core/owned_workspace.hpp"
#include "core/thread_pool.hpp"

struct flatmem_contrastive_s {
  explicit flatmem_contrastive_s(const flatmem::contrastive::Options &o)
      : options(o), pool(o.num_threads), logit_cache(o.logit_cache_bytes) {}

  flatmem::contrastive::Options options;
  flatmem::ThreadPool pool;
  flatmem::OwnedWorkspace workspace;
  flatmem::DeviceWorkspace device_workspace;  // the ring's buffers on CUDA tensors
  flatmem::contrastive::cpu::LogitCache logit_cache;  // options.logit_cache_bytes
  flatmem::contrastive::ring::Stats ring_forward_stats, ring_backward_stats;
};
