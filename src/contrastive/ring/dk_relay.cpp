#include "contrastive/ring/dk_relay.hpp"

#include <utility>

namespace flatmem::contrastive::ring {

DkRelay::DkRelay(RingLink &link, const Layout &layout, std::int64_t d, float *fresh,
                 float *const partial[2], bool active)
    : link_(link), layout_(layout), d_(d), fresh_(fresh), partial_{partial[0], partial[1]},
      active_(active) {}

std::int64_t DkRelay::block_floats(int step) const {
  return layout_.cols[std::size_t(layout_.block_owner(step))] * d_;
}

void DkRelay::begin_step(int t) {
  if (!active_ || layout_.ranks == 1) return;
  now_in_ = std::move(next_in_);
  next_in_ = link_.receive(Message::dk_partial, t + 1, partial_[(t + 1) % 2],
                           std::size_t(block_floats(t + 1)) * sizeof(float));
}

void DkRelay::pass_on(int t) {
  if (!active_ || layout_.ranks == 1) return;
  const std::int64_t count = block_floats(t);
  float *sum = fresh_;
  if (t > 0) {  // ranks o .. r - 1 first, then this rank
    link_.wait({&now_in_});
    sum = partial_[t % 2];
    for (std::int64_t i = 0; i < count; ++i) sum[i] += fresh_[i];
  }
  out_ = link_.send(Message::dk_partial, t + 1, sum, std::size_t(count) * sizeof(float));
}

const float *DkRelay::finish() {
  if (!active_ || layout_.ranks == 1) return fresh_;
  link_.wait({&next_in_});
  return partial_[layout_.ranks % 2];
}

}  // namespace flatmem::contrastive::ring
