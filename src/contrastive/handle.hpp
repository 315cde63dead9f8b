// The object behind flatmem_contrastive_t: resolved options, the worker
// threads, and the buffer used when a call passes no workspace.
#pragma once

#include "contrastive/problem.hpp"
#include "core/blas.hpp"
#include "core/owned_workspace.hpp"
#include "core/thread_pool.hpp"

struct flatmem_contrastive_s {
  explicit flatmem_contrastive_s(const flatmem::contrastive::Options &o)
      : options(o), pool(o.num_threads) {
    flatmem::prepare_blas();
  }

  flatmem::contrastive::Options options;
  flatmem::ThreadPool pool;
  flatmem::OwnedWorkspace workspace;
};
