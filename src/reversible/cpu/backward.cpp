// The three backward schedules. With S_k the input state of block k
// (S_n = the segment output (Y1, Y2), the caller's, read only):
//   R_k reads S_{k+1}, writes S_k and block k's residuals;
//   B_k reads S_{k+1}.a (Y1), S_k.b (X2) and block k's residuals, and
//       updates the gradients in place.
// VANILLA runs R_{n-1}, B_{n-1}, R_{n-2}, B_{n-2}, ... on one chain, S_k in
// slot k mod 2 and one residual slot. OVERLAPPED runs the R chain on the
// handle's rebuild thread and the B chain on the caller's, S_k in slot k mod
// 3, block k's residuals in slot k mod 2; R_k waits for B_{k+2} (which last
// read both slots R_k overwrites), B_k waits for R_k.
#include <condition_variable>
#include <mutex>

#include "reversible/cpu/block_steps.hpp"
#include "reversible/cpu/executor.hpp"

namespace flatmem::reversible::cpu {
namespace {

int state_slots(flatmem_reversible_mode mode) {
  return mode == FLATMEM_REVERSIBLE_OVERLAPPED ? 3 : mode == FLATMEM_REVERSIBLE_VANILLA ? 2 : 0;
}
int residual_slots(flatmem_reversible_mode mode) {
  return mode == FLATMEM_REVERSIBLE_OVERLAPPED ? 2 : mode == FLATMEM_REVERSIBLE_VANILLA ? 1 : 0;
}

BlockCall block_call(flatmem_reversible_t &h, std::int32_t k, const StateLayout &s,
                     Randomness rng) {
  return BlockCall{&h.blocks[std::size_t(k)], k, &s, rng.seed, rng.offset};
}

// Gradients start as copies of (dY1, dY2), so that dx may alias dy and
// nothing the caller owns is written before the end.
void start_gradients(Chain &chain, const StateLayout &s, const BackwardIo &io, StatePair g) {
  chain.copy(s, io.dy1, g.a);
  chain.copy(s, io.dy2, g.b);
}

void finish(Chain &chain, const StateLayout &s, const BackwardIo &io, StatePair gradients,
            StatePair input) {
  chain.copy(s, gradients.a, io.dx1);
  chain.copy(s, gradients.b, io.dx2);
  if (io.x1 != nullptr) {
    chain.copy(s, input.a, io.x1);
    chain.copy(s, input.b, io.x2);
  }
}

void run_vanilla(flatmem_reversible_t &h, const StateLayout &s, const ResidualPlan &r,
                 Randomness rng, const BackwardIo &io, const BackwardBuffers &b) {
  Chain &chain = h.main_chain;
  start_gradients(chain, s, io, b.gradients);
  StatePair out{const_cast<char *>(io.y1), const_cast<char *>(io.y2)};
  for (std::int32_t k = h.size() - 1; k >= 0; --k) {
    BlockCall call = block_call(h, k, s, rng);
    point_residuals(call, b.residuals[0], r);
    const StatePair in = b.states[std::size_t(k % 2)];
    rebuild_block(chain, call, out, in);
    gradient_block(chain, call, out.a, in.b, b.gradients);
    out = in;
  }
  finish(chain, s, io, b.gradients, out);
}

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
  Chain &gradient_chain = *h.gradient_chain;
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
  finish(gradient_chain, s, io, b.gradients, state(0));
}

void run_standard(flatmem_reversible_t &h, const StateLayout &s, Randomness rng,
                  const BackwardIo &io, const BackwardBuffers &b) {
  Record &record = h.record;
  Chain &chain = h.main_chain;
  start_gradients(chain, s, io, b.gradients);
  for (std::int32_t k = h.size() - 1; k >= 0; --k) {
    BlockCall call = block_call(h, k, s, rng);
    point_residuals(call, record.residuals[std::size_t(k)], record.residual_plan);
    gradient_block(chain, call, record.states[std::size_t(k) + 1].a, record.states[std::size_t(k)].b,
                   b.gradients);
  }
  finish(chain, s, io, b.gradients, record.states[0]);
}

}  // namespace

std::size_t backward_workspace_bytes(const StateLayout &s, const ResidualPlan &r,
                                     flatmem_reversible_mode mode) {
  WorkspaceCarver measure;
  carve_backward(measure, s, r, state_slots(mode), residual_slots(mode));
  return measure.bytes();
}

void backward(flatmem_reversible_t &h, flatmem_reversible_mode mode, const StateLayout &s,
              const ResidualPlan &r, Randomness rng, const BackwardIo &io, void *workspace) {
  WorkspaceCarver carver(workspace);
  const BackwardBuffers b = carve_backward(carver, s, r, state_slots(mode), residual_slots(mode));
  switch (mode) {
    case FLATMEM_REVERSIBLE_STANDARD: run_standard(h, s, rng, io, b); break;
    case FLATMEM_REVERSIBLE_OVERLAPPED: run_overlapped(h, s, r, rng, io, b); break;
    default: run_vanilla(h, s, r, rng, io, b); break;
  }
}

}  // namespace flatmem::reversible::cpu
