#include <vector>

#include "contrastive/ring/transport.hpp"

namespace flatmem::contrastive::ring {
namespace {

struct HostExchange final : Exchange {
  std::vector<RingLink::Pending> pending;
};

}  // namespace

ExchangePtr HostTransport::exchange(int step, std::span<const Outgoing> sends,
                                    std::span<const Incoming> receives) {
  auto posted = std::make_unique<HostExchange>();
  // receives first: the matching send of rank - 1 may already be on its way
  for (const Incoming &in : receives) posted->pending.push_back(link_.receive(in.kind, step, in.data, in.bytes));
  for (const Outgoing &out : sends) posted->pending.push_back(link_.send(out.kind, step, out.data, out.bytes));
  return posted;
}

void HostTransport::wait(ExchangePtr &posted) {
  if (!posted) return;
  for (RingLink::Pending &p : static_cast<HostExchange &>(*posted).pending) link_.wait({&p});
  posted.reset();
}

}  // namespace flatmem::contrastive::ring
