#include "contrastive/ring/schedule.hpp"

#include <utility>

#include "core/error.hpp"

namespace flatmem::contrastive::ring {

Schedule::Schedule(Transport &transport, const Layout &layout, std::vector<Carried> carried,
                   std::optional<Relayed> relayed)
    : transport_(transport), layout_(layout), carried_(std::move(carried)), relayed_(std::move(relayed)) {
  if (carried_.empty() || carried_.size() > max_carried)
    fail(FLATMEM_STATUS_INTERNAL, "ring schedule: ", carried_.size(), " carried items; 1 .. ", max_carried,
         " are supported");
}

void Schedule::run(const std::function<void(const Step &)> &compute) {
  const int n = layout_.ranks;
  const auto cols_of = [&](int owner) { return layout_.cols[std::size_t(owner)]; };
  const auto bytes = [&](std::size_t per_column, int owner) {
    return per_column * std::size_t(cols_of(owner));
  };
  ExchangePtr relay;  // the relayed item of the previous step: sent on, and this step's received
  for (int t = 0; t < n; ++t) {
    Step step;
    step.t = t;
    step.owner = layout_.block_owner(t);
    step.cols = cols_of(step.owner);
    step.col_offset = layout_.col_offset[std::size_t(step.owner)];
    for (std::size_t i = 0; i < carried_.size(); ++i)
      step.carried[i] = t == 0 ? carried_[i].own : carried_[i].transit[t % 2];

    ExchangePtr blocks;
    if (t + 1 < n) {
      const int next_owner = layout_.block_owner(t + 1);
      Outgoing sends[max_carried];
      Incoming receives[max_carried];
      for (std::size_t i = 0; i < carried_.size(); ++i) {
        const Carried &c = carried_[i];
        sends[i] = {c.kind, step.carried[i], bytes(c.bytes_per_column, step.owner)};
        receives[i] = {c.kind, c.transit[(t + 1) % 2], bytes(c.bytes_per_column, next_owner)};
      }
      blocks = transport_.exchange(t + 1, std::span(sends, carried_.size()),
                                   std::span(receives, carried_.size()));
    }

    compute(step);

    if (relayed_) {
      const Relayed &r = *relayed_;
      void *into = r.transit[t % 2];
      // ranks o .. r - 1 first (arrived from r - 1), then this rank's share
      transport_.wait(relay);
      r.fold_in(into, r.fresh, step.cols, t == 0);
      const Outgoing send{r.kind, into, bytes(r.bytes_per_column, step.owner)};
      const Incoming receive{r.kind, r.transit[(t + 1) % 2],
                             bytes(r.bytes_per_column, layout_.block_owner(t + 1))};
      relay = transport_.exchange(t + 1, std::span(&send, 1), std::span(&receive, 1));
    }
    transport_.wait(blocks);
  }
  transport_.wait(relay);  // this rank's own item, from r - 1 (from itself when alone)
}

void *Schedule::relayed_result() const {
  return relayed_ ? relayed_->transit[layout_.ranks % 2] : nullptr;
}

}  // namespace flatmem::contrastive::ring
