// The partial dk that travels behind its column block (the softmax backward
// ring and the sigmoid ring): at step t rank r computes its share of block
// o = (r - t) mod n's dk into `fresh`, adds it to the partial that arrived
// from r - 1 (ranks o .. r - 1, one step behind the block: always in that
// order, deterministic) and sends the sum on to r + 1; at t = n - 1 rank
// o - 1 sends the complete dk_o to its owner, which receives it after the
// loop. One rank alone: its own fresh block is the whole dk.
#pragma once

#include <cstdint>

#include "contrastive/ring/agreement.hpp"
#include "contrastive/ring/link.hpp"

namespace flatmem::contrastive::ring {

class DkRelay {
 public:
  // fresh: (max_cols x d) fp32; partial[0..1]: two such blocks in transit
  // (unused when the ring has one rank). active = false: dk not requested,
  // every call does nothing.
  DkRelay(RingLink &link, const Layout &layout, std::int64_t d, float *fresh, float *const partial[2],
          bool active);

  // Start of step t: posts the receive of step t + 1's partial (of block
  // owner(t + 1)); the one posted at the previous step is now this step's.
  void begin_step(int t);
  // After this rank's share of block owner(t) is in fresh(): adds it to the
  // partial from r - 1 (waiting for it) and posts the send of the sum. The
  // send is waited for with the step's other messages: pending_send().
  void pass_on(int t);
  RingLink::Pending &pending_send() { return out_; }
  float *fresh() const { return fresh_; }
  // After the last step: this rank's complete dk (c_r x d, ld d).
  const float *finish();

 private:
  std::int64_t block_floats(int step) const;

  RingLink &link_;
  const Layout &layout_;
  std::int64_t d_;
  float *fresh_;
  float *partial_[2];
  bool active_;
  RingLink::Pending next_in_, now_in_, out_;
};

}  // namespace flatmem::contrastive::ring
