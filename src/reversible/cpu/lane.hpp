// A thread owned by a segment handle that runs one job at a time: the rebuild
// chain of the overlapped backward. wait() returns when the job finished and
// rethrows what it threw.
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace flatmem::reversible::cpu {

class Lane {
 public:
  Lane();
  ~Lane();
  Lane(const Lane &) = delete;
  Lane &operator=(const Lane &) = delete;

  void start(std::function<void()> job);
  void wait();

 private:
  void main();

  std::mutex mutex_;
  std::condition_variable wake_, done_;
  std::function<void()> job_;
  bool busy_ = false, stopping_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace flatmem::reversible::cpu
