#include <chrono>
#include <vector>

#include "contrastive/ring/transport.hpp"

namespace flatmem::contrastive::ring {
namespace {

const char *message_name(Message kind) {
  switch (kind) {
    case Message::column_block: return "column block";
    case Message::column_lse: return "column log-sum-exp";
    case Message::column_state: return "column (max, sum) state";
    case Message::dk_partial: return "partial dk";
  }
  return "message";
}

double seconds_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

std::string step_label(const char *phase, int step, int ranks) {
  return std::string(phase) + ", step " + std::to_string(step) + " of " + std::to_string(ranks);
}

struct HostTransport::Posted final : Exchange {
  std::vector<Pending> pending;
};

HostTransport::HostTransport(comm::Communicator &comm, const char *phase, Stats &stats)
    : comm_(comm), phase_(phase), stats_(stats), ranks_(comm.size()), rank_(comm.rank()),
      sequence_(comm.next_sequence()) {
  stats_.steps = ranks_;
}

std::uint64_t HostTransport::tag(Message kind, int step) const {
  return comm::Communicator::internal_tag(sequence_, std::uint32_t(kind) * 4097u + std::uint32_t(step));
}

std::string HostTransport::label(Message kind, int step, const char *direction, int peer) const {
  return step_label(phase_, step, ranks_) + ": " + message_name(kind) + direction + std::to_string(peer);
}

ExchangePtr HostTransport::exchange(int step, std::span<const Outgoing> sends,
                                    std::span<const Incoming> receives) {
  auto posted = std::make_unique<Posted>();
  // receives first: the matching send of rank - 1 may already be on its way
  const int next = (rank_ + 1) % ranks_, previous = (rank_ + ranks_ - 1) % ranks_;
  for (const Incoming &in : receives)
    posted->pending.push_back({comm_.recv(previous, in.data, in.bytes, comm::Space::internal, tag(in.kind, step)),
                               label(in.kind, step, " from rank ", previous)});
  for (const Outgoing &out : sends) {
    posted->pending.push_back({comm_.send(next, out.data, out.bytes, comm::Space::internal, tag(out.kind, step)),
                               label(out.kind, step, " to rank ", next)});
    stats_.bytes_sent += out.bytes;
    stats_.messages_sent += 1;
  }
  return posted;
}

void HostTransport::wait(ExchangePtr &posted) {
  if (!posted) return;
  const double start = seconds_now();
  for (Pending &p : static_cast<Posted &>(*posted).pending)
    if (p.transfer) {
      comm_.wait_all({p.transfer}, comm_.default_timeout(), p.what);
      p.transfer.reset();
    }
  stats_.wait_seconds += seconds_now() - start;
  posted.reset();
}

}  // namespace flatmem::contrastive::ring
