#include "handle_pool.hpp"

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

namespace flatmem_jax {
namespace {

struct Idle {
  flatmem_contrastive_t *handle;
  Inputs last;  // the q and k of the handle's last successful forward
};

struct KeyLess {
  bool operator()(const PoolKey &a, const PoolKey &b) const {
    return std::tie(a.loss, a.cuda, a.logit_cache_bytes, a.fp32_precision) <
           std::tie(b.loss, b.cuda, b.logit_cache_bytes, b.fp32_precision);
  }
};

struct Pool {
  std::mutex mutex;
  std::map<PoolKey, std::vector<Idle>, KeyLess> idle;  // given back last = at the back
  std::atomic<std::int64_t> handles{0}, cached_backwards{0}, cached_backwards_hit{0};
};

Pool &pool() {
  static Pool *p = new Pool;  // intentionally leaked, see handle_pool.hpp
  return *p;
}

int read_num_threads() {
  const char *text = std::getenv("FLATMEM_JAX_NUM_THREADS");
  if (text == nullptr || *text == '\0') return 0;
  char *end = nullptr;
  errno = 0;
  const long value = std::strtol(text, &end, 10);
  if (errno != 0 || *end != '\0' || value < INT_MIN || value > INT_MAX) return -1;
  return static_cast<int>(value);
}

}  // namespace

int pool_num_threads() {
  static const int n = read_num_threads();
  return n;
}

PooledHandle::PooledHandle(const PoolKey &key, Inputs inputs) : key_(key) {
  if (key_.cuda) key_.logit_cache_bytes = 0;  // see PoolKey
  {
    std::lock_guard<std::mutex> lock(pool().mutex);
    auto found = pool().idle.find(key_);
    if (found != pool().idle.end() && !found->second.empty()) {
      std::vector<Idle> &idle = found->second;
      auto pick = idle.end() - 1;
      if (inputs.q != nullptr)
        for (auto it = idle.rbegin(); it != idle.rend(); ++it)
          if (it->last == inputs) {
            pick = it.base() - 1;
            found_ = true;
            break;
          }
      handle_ = pick->handle;
      last_ = pick->last;
      idle.erase(pick);
      return;
    }
  }
  flatmem_contrastive_options options;
  status_ = flatmem_contrastive_options_init(&options, sizeof(flatmem_contrastive_options));
  if (status_ != FLATMEM_STATUS_SUCCESS) return;
  options.loss = key_.loss;
  options.num_threads = pool_num_threads();
  options.logit_cache_bytes = key_.logit_cache_bytes;
  options.fp32_precision = key_.fp32_precision;
  if (key_.cuda) options.nonfinite = FLATMEM_NONFINITE_PROPAGATE;
  status_ = flatmem_contrastive_create(&handle_, &options);
  if (status_ == FLATMEM_STATUS_SUCCESS) ++pool().handles;
}

PooledHandle::~PooledHandle() {
  if (handle_ == nullptr) return;
  std::lock_guard<std::mutex> lock(pool().mutex);
  try {
    pool().idle[key_].push_back(Idle{handle_, last_});
  } catch (...) {  // no memory to keep it: let it go instead
    flatmem_contrastive_destroy(handle_);
    --pool().handles;
  }
}

PoolStats pool_stats() {
  return PoolStats{pool().handles.load(), pool().cached_backwards.load(),
                   pool().cached_backwards_hit.load()};
}

void count_cached_backward(bool on_forward_handle) {
  ++pool().cached_backwards;
  if (on_forward_handle) ++pool().cached_backwards_hit;
}

}  // namespace flatmem_jax
