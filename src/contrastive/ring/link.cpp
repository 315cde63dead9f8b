#include "contrastive/ring/link.hpp"

#include <chrono>

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

RingLink::RingLink(comm::Communicator &comm, const char *phase, Stats &stats)
    : comm_(comm), phase_(phase), stats_(stats), ranks_(comm.size()), rank_(comm.rank()),
      sequence_(comm.next_sequence()) {
  stats_.steps = ranks_;
}

std::string RingLink::label(Message kind, int step, bool sending) const {
  // A message for (0-based) step s is waited for during (1-based) step s.
  return std::string(phase_) + ", step " + std::to_string(step) + " of " +
         std::to_string(ranks_) + ": " + message_name(kind) + (sending ? " to rank " : " from rank ") +
         std::to_string(sending ? next() : previous());
}

RingLink::Pending RingLink::send(Message kind, int step, const void *data, std::size_t bytes) {
  const std::uint64_t tag =
      comm::Communicator::internal_tag(sequence_, std::uint32_t(kind) * 4097u + std::uint32_t(step));
  stats_.bytes_sent += bytes;
  stats_.messages_sent += 1;
  return {comm_.send(next(), data, bytes, comm::Space::internal, tag), label(kind, step, true)};
}

RingLink::Pending RingLink::receive(Message kind, int step, void *data, std::size_t bytes) {
  const std::uint64_t tag =
      comm::Communicator::internal_tag(sequence_, std::uint32_t(kind) * 4097u + std::uint32_t(step));
  return {comm_.recv(previous(), data, bytes, comm::Space::internal, tag), label(kind, step, false)};
}

void RingLink::wait(std::initializer_list<Pending *> pending) {
  const double start = seconds_now();
  for (Pending *p : pending)
    if (p != nullptr && p->transfer) {
      comm_.wait_all({p->transfer}, comm_.default_timeout(), p->what);
      p->transfer.reset();
    }
  stats_.wait_seconds += seconds_now() - start;
}

}  // namespace flatmem::contrastive::ring
