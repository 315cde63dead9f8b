// A thread owned by a segment handle that runs one job at a time: the rebuild
// chain of the overlapped backward. wait() returns when the job finished and
// throws a flatmem::Error with the status and message of what the job threw.
// (The failure crosses threads as a status and a string, not as an
// exception_ptr, whose reference count lives in uninstrumented libstdc++ and
// makes ThreadSanitizer report a race on the exception object.)
#pragma once

#include <condition_variable>
#include <flatmem/flatmem.h>

#include <functional>
#include <mutex>
#include <string>
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
  flatmem_status status_ = FLATMEM_STATUS_SUCCESS;
  std::string message_;
  std::thread thread_;
};

}  // namespace flatmem::reversible::cpu
