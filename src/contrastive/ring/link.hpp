// The ring's messages to rank + 1 and from rank - 1, with the tags, the
// messages that name the step, and the bookkeeping behind the ring
// statistics (bytes sent, time blocked in waits).
//
// Tags: one sequence number per call (Communicator::next_sequence, the same
// on every rank), slot = kind * 4097 + step, where `step` is the step at
// which the receiver uses the message (1 .. n; n = the final delivery to the
// owner). Every message of a call therefore has its own tag.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include "comm/communicator.hpp"
#include "contrastive/ring/stats.hpp"

namespace flatmem::contrastive::ring {

enum class Message : std::uint32_t { column_block = 0, column_lse = 1, column_state = 2, dk_partial = 3 };

class RingLink {
 public:
  // phase: "contrastive forward ring" / "contrastive backward ring".
  RingLink(comm::Communicator &comm, const char *phase, Stats &stats);

  int ranks() const { return ranks_; }
  int rank() const { return rank_; }
  int next() const { return (rank_ + 1) % ranks_; }
  int previous() const { return (rank_ + ranks_ - 1) % ranks_; }

  struct Pending {
    comm::TransferPtr transfer;
    std::string what;  // "contrastive forward ring, step 2 of 4: column block from rank 1"
  };
  // Post a send to next() / a receive from previous() of `kind` for `step`.
  Pending send(Message kind, int step, const void *data, std::size_t bytes);
  Pending receive(Message kind, int step, void *data, std::size_t bytes);
  // Waits (in order) for those given that were posted; a failure poisons the
  // communicator (the ranks no longer agree) and is rethrown.
  void wait(std::initializer_list<Pending *> pending);

 private:
  std::string label(Message kind, int step, bool sending) const;

  comm::Communicator &comm_;
  const char *phase_;
  Stats &stats_;
  int ranks_, rank_;
  std::uint64_t sequence_;
};

}  // namespace flatmem::contrastive::ring
