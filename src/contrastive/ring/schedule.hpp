// The ring's schedule, one piece of code for every backend and all three
// losses: which column block each rank holds at each step, what travels with
// it, what travels one step behind it and is combined on the way, and in which
// order. The backends differ only in the computation of a step and in the
// transport (transport.hpp); the CPU ring tests (threads, processes,
// emulated networks) prove this schedule for all of them.
//
// At step t = 0 .. n-1 rank r holds the block of owner o = (r - t) mod n:
//  - Carried items (the block's columns; its col_lse in the softmax backward)
//    travel rank -> rank + 1: at step t the rank sends what it holds and
//    receives step t + 1's block into the other of two transit buffers, while
//    it computes its rows x block o.
//  - The relayed item (the forward's column (max, sum) states; the partial dk
//    of the backward and sigmoid rings) travels one step behind its block:
//    at step t the rank folds its fresh share of block o into what arrived for
//    block o from r - 1 (ranks o .. r - 1, always in that order:
//    deterministic) and sends the result on to r + 1; at t = n - 1 that is
//    rank o - 1 handing block o's complete item to its owner. The owner has
//    it after run(): relayed_result(). With one rank the item goes round
//    through the transport to the rank itself, so one rank exercises every
//    transfer a ring of many makes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "contrastive/ring/agreement.hpp"
#include "contrastive/ring/transport.hpp"

namespace flatmem::contrastive::ring {

// An item that travels with the column block.
struct Carried {
  Message kind;
  const void *own = nullptr;       // this rank's, held at step 0 (compact when sent)
  void *transit[2] = {};           // blocks of steps 1 .. n-1 (unused with one rank)
  std::size_t bytes_per_column = 0;
};

// The item that travels one step behind the block and is combined on its way.
struct Relayed {
  Message kind;
  void *fresh = nullptr;       // this rank's share of the current block (the step writes it)
  void *transit[2] = {};       // the combined item sent at step t sits in transit[t % 2]
  std::size_t bytes_per_column = 0;
  // into = fresh (first: the block's first rank) or into = into (+) fresh, for
  // `cols` columns; runs where the step's computation runs (after it).
  std::function<void(void *into, const void *fresh, std::int64_t cols, bool first)> fold_in;
};

// The most items a ring carries with its block: the block itself and, for
// the symmetric loss, its column states (Step::carried holds one per item).
inline constexpr std::size_t max_carried = 2;

// What the computation of one step sees.
struct Step {
  int t = 0;                   // 0 .. ranks - 1
  int owner = 0;               // whose columns the block is
  std::int64_t cols = 0;       // its columns
  std::int64_t col_offset = 0; // its first global column
  const void *carried[max_carried] = {}; // each Carried item of this block (own at t = 0)
};

class Schedule {
 public:
  // 1 .. max_carried carried items (the first is the block; more is an
  // INTERNAL error, thrown here), at most one relayed.
  Schedule(Transport &transport, const Layout &layout, std::vector<Carried> carried,
           std::optional<Relayed> relayed);
  // Runs the n steps, calling compute(step) for each; returns once every
  // transfer of the ring has completed (as the transport defines it).
  void run(const std::function<void(const Step &)> &compute);
  // After run(): this rank's complete relayed item (its own columns).
  void *relayed_result() const;

 private:
  Transport &transport_;
  const Layout &layout_;
  std::vector<Carried> carried_;
  std::optional<Relayed> relayed_;
};

}  // namespace flatmem::contrastive::ring
