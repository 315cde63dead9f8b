#include "reversible/cpu/lane.hpp"

namespace flatmem::reversible::cpu {

Lane::Lane() : thread_([this] { main(); }) {}

Lane::~Lane() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void Lane::start(std::function<void()> job) {
  std::lock_guard<std::mutex> lock(mutex_);
  job_ = std::move(job);
  error_ = nullptr;
  busy_ = true;
  wake_.notify_all();
}

void Lane::wait() {
  std::exception_ptr error;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return !busy_; });
    error = error_;
    error_ = nullptr;
  }
  if (error) std::rethrow_exception(error);
}

void Lane::main() {
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || busy_; });
      if (stopping_) return;
      job = std::move(job_);
    }
    std::exception_ptr error;
    try {
      job();
    } catch (...) {
      error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      error_ = error;
      busy_ = false;
    }
    done_.notify_all();
  }
}

}  // namespace flatmem::reversible::cpu
