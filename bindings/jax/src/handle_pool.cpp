#include "handle_pool.hpp"

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <mutex>
#include <vector>

namespace flatmem_jax {
namespace {

struct Pool {
  std::mutex mutex;
  std::vector<flatmem_contrastive_t *> idle[3][2];  // [flatmem_contrastive_loss][cuda]
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

PooledHandle::PooledHandle(flatmem_contrastive_loss loss, bool cuda) : loss_(loss), cuda_(cuda) {
  {
    std::lock_guard<std::mutex> lock(pool().mutex);
    auto &idle = pool().idle[loss][cuda];
    if (!idle.empty()) {
      handle_ = idle.back();
      idle.pop_back();
      return;
    }
  }
  flatmem_contrastive_options options;
  status_ = flatmem_contrastive_options_init(&options);
  if (status_ != FLATMEM_STATUS_SUCCESS) return;
  options.loss = loss;
  options.num_threads = pool_num_threads();
  if (cuda) options.nonfinite = FLATMEM_NONFINITE_PROPAGATE;
  status_ = flatmem_contrastive_create(&handle_, &options);
}

PooledHandle::~PooledHandle() {
  if (handle_ == nullptr) return;
  std::lock_guard<std::mutex> lock(pool().mutex);
  try {
    pool().idle[loss_][cuda_].push_back(handle_);
  } catch (...) {  // no memory to keep it: let it go instead
    flatmem_contrastive_destroy(handle_);
  }
}

}  // namespace flatmem_jax
