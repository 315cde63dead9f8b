#include "reversible/cpu/lane.hpp"

#include <new>

#include "core/error.hpp"

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
  status_ = FLATMEM_STATUS_SUCCESS;
  message_.clear();
  busy_ = true;
  wake_.notify_all();
}

void Lane::wait() {
  flatmem_status status;
  std::string message;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return !busy_; });
    status = status_;
    message.swap(message_);
  }
  if (status != FLATMEM_STATUS_SUCCESS) throw Error(status, message);
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
    flatmem_status status = FLATMEM_STATUS_SUCCESS;
    std::string message;
    try {
      job();
    } catch (const Error &e) {
      status = e.status();
      message = e.what();
    } catch (const std::bad_alloc &) {
      status = FLATMEM_STATUS_OUT_OF_MEMORY;
      message = "out of host memory";
    } catch (const std::exception &e) {
      status = FLATMEM_STATUS_INTERNAL;
      message = std::string("internal error: ") + e.what();
    } catch (...) {
      status = FLATMEM_STATUS_INTERNAL;
      message = "internal error: unknown exception";
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      status_ = status;
      message_.swap(message);
      busy_ = false;
    }
    done_.notify_all();
  }
}

}  // namespace flatmem::reversible::cpu
