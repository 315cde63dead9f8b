// OVERLAPPED on the CPU: the rebuild chain R_{n-1} .. R_0 runs on the
// handle's rebuild thread (its own pool), the gradient chain B_{n-1} .. B_0 on
// the calling thread (its own pool); they meet through Progress. See
// schedules.hpp for the slots and why R_k waits for B_{k+2}. A failure on
// either chain aborts the other at its next wait: nothing hangs.
#include <condition_variable>
#include <mutex>

#include "reversible/schedules.hpp"

namespace flatmem::reversible::cpu {
namespace {

// Progress of the two chains of an overlapped backward, shared under a lock.
class Progress {
 public:
  explicit Progress(std::int32_t n) : rebuilt_(n), gradients_(n) {}
  // Blocks >= `rebuilt` have been rebuilt; blocks >= `gradients` have their
  // gradients done. Each wait returns false when the other chain failed.
  bool wait_rebuilt(std::int32_t k) {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return aborted_ || rebuilt_ <= k; });
    return !aborted_;
  }
  bool wait_gradients(std::int32_t k) {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return aborted_ || gradients_ <= k; });
    return !aborted_;
  }
  void rebuilt(std::int32_t k) { publish([&] { rebuilt_ = k; }); }
  void gradients_done(std::int32_t k) { publish([&] { gradients_ = k; }); }
  void abort() { publish([&] { aborted_ = true; }); }

 private:
  template <typename Change>
  void publish(Change change) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      change();
    }
    changed_.notify_all();
  }
  std::mutex mutex_;
  std::condition_variable changed_;
  std::int32_t rebuilt_, gradients_;
  bool aborted_ = false;
};

}  // namespace

void run_overlapped(flatmem_reversible_t &h, const StateLayout &s, const ResidualPlan &r,
                    Randomness rng, const BackwardIo &io, const BackwardBuffers &b) {
  h.start_overlap_chains();
  const std::int32_t n = h.size();
  auto state = [&](std::int32_t j) {
    return j == n ? StatePair{const_cast<char *>(io.y1), const_cast<char *>(io.y2)}
                  : b.states[std::size_t(j % 3)];
  };
  auto call_for = [&](std::int32_t k) {
    BlockCall call = block_call(h, k, s, rng);
    point_residuals(call, b.residuals[std::size_t(k % 2)], r);
    return call;
  };
  ThreadChain &gradient_chain = *h.gradient_chain;
  start_gradients(gradient_chain, s, io, b.gradients);

  Progress progress(n);
  h.rebuild_lane->start([&] {
    try {
      for (std::int32_t k = n - 1; k >= 0; --k) {
        if (k + 2 < n && !progress.wait_gradients(k + 2)) return;
        rebuild_block(*h.rebuild_chain, call_for(k), state(k + 1), state(k));
        progress.rebuilt(k);
      }
    } catch (...) {
      progress.abort();
      throw;
    }
  });
  try {
    for (std::int32_t k = n - 1; k >= 0; --k) {
      if (!progress.wait_rebuilt(k)) break;
      gradient_block(gradient_chain, call_for(k), state(k + 1).a, state(k).b, b.gradients);
      progress.gradients_done(k);
    }
  } catch (...) {
    progress.abort();
    try {
      h.rebuild_lane->wait();
    } catch (...) {
      // The gradient chain's error is the one reported; the rebuild chain
      // only stopped because of it or failed independently.
    }
    throw;
  }
  h.rebuild_lane->wait();  // rethrows a rebuild failure
  finish_backward(gradient_chain, s, io, b.gradients, state(0));
}

}  // namespace flatmem::reversible::cpu
