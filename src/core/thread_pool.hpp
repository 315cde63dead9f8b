// A fixed set of worker threads owned by one handle. run() is a parallel-for
// with a barrier at its end: items are claimed dynamically, the calling thread
// works too, and run() returns when every item is done. Which thread runs an
// item must never change a result: callers give each item its own outputs.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace flatmem {

class ThreadPool {
 public:
  // `threads` counts the caller: threads - 1 workers are started.
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool &) = delete;
  ThreadPool &operator=(const ThreadPool &) = delete;

  int size() const { return int(workers_.size()) + 1; }

  // Calls body(item, thread) for item in [0, items); thread in [0, size()).
  // Rethrows the first exception a body threw, after all threads stopped.
  using Body = std::function<void(std::int64_t item, int thread)>;
  void run(std::int64_t items, const Body &body);

 private:
  void shutdown();
  void worker_main(int thread);
  void work(int thread);

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_, finished_;
  std::uint64_t generation_ = 0;
  bool stopping_ = false;
  int busy_workers_ = 0;
  const Body *body_ = nullptr;
  std::int64_t items_ = 0;
  std::atomic<std::int64_t> next_item_{0};
  std::exception_ptr error_;
};

// The number of online processors (at least 1).
int hardware_threads();

}  // namespace flatmem
