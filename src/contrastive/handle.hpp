// The object behind flatmem_contrastive_t: resolved options, the worker
// threads, and the buffer used when a call passes no workspace.
#pragma once

#include <memory>

#include "contrastive/problem.hpp"
#include "core/blas.hpp"
#include "core/thread_pool.hpp"

struct flatmem_contrastive_s {
  explicit flatmem_contrastive_s(const flatmem::contrastive::Options &o)
      : options(o), pool(o.num_threads) {
    flatmem::prepare_blas();
  }

  // Returns `given` after checking its size, or the handle's own buffer
  // (grown to `needed`) when given is NULL.
  void *workspace(void *given, std::size_t given_bytes, std::size_t needed);

  flatmem::contrastive::Options options;
  flatmem::ThreadPool pool;
  std::unique_ptr<char[]> owned;
  std::size_t owned_bytes = 0;
};
