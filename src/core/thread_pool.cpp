#include "core/thread_pool.hpp"

namespace flatmem {

int hardware_threads() {
  unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : int(n);
}

ThreadPool::ThreadPool(int threads) {
  workers_.reserve(threads > 1 ? threads - 1 : 0);
  try {
    for (int t = 1; t < threads; ++t) workers_.emplace_back([this, t] { worker_main(t); });
  } catch (...) {
    shutdown();
    throw;
  }
}

ThreadPool::~ThreadPool() { shutdown(); }

void ThreadPool::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (auto &w : workers_)
    if (w.joinable()) w.join();
  workers_.clear();
}

void ThreadPool::work(int thread) {
  for (;;) {
    const std::int64_t item = next_item_.fetch_add(1, std::memory_order_relaxed);
    if (item >= items_) return;
    try {
      (*body_)(item, thread);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!error_) error_ = std::current_exception();
      next_item_.store(items_, std::memory_order_relaxed);  // stop handing out items
    }
  }
}

void ThreadPool::worker_main(int thread) {
  std::uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
    }
    work(thread);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (--busy_workers_ == 0) finished_.notify_one();
    }
  }
}

void ThreadPool::run(std::int64_t items, const Body &body) {
  if (items <= 0) return;
  if (workers_.empty() || items == 1) {
    for (std::int64_t i = 0; i < items; ++i) body(i, 0);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    body_ = &body;
    items_ = items;
    next_item_.store(0, std::memory_order_relaxed);
    error_ = nullptr;
    busy_workers_ = int(workers_.size());
    ++generation_;
  }
  wake_.notify_all();
  work(0);
  std::exception_ptr error;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    finished_.wait(lock, [&] { return busy_workers_ == 0; });
    body_ = nullptr;
    error = error_;
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace flatmem
