// How the ring schedule (schedule.hpp) moves bytes between this rank and its
// ring neighbours: it posts each step's transfers as one *exchange* (sends to
// rank + 1 and receives from rank - 1, issued together), and later waits for
// an exchange. Issuing a step's sends and receives together is what a
// transport like NCCL needs (a send and its peer's receive must sit in
// matching groups, or the ring deadlocks); a host transport posts them one by
// one.
//
// Waiting means "the data is usable by the next computation": the host
// transport blocks until the transfers completed (under the communicator's
// deadline); a device transport orders the compute stream after them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "comm/communicator.hpp"
#include "contrastive/ring/stats.hpp"

namespace flatmem::contrastive::ring {

// What a ring message carries (named in messages; part of the host tags).
enum class Message : std::uint32_t { column_block = 0, column_lse = 1, column_state = 2, dk_partial = 3 };

// "contrastive forward ring, step 2 of 4": where a transfer belongs, in every
// message a transport writes (phase: "contrastive forward ring", ...).
std::string step_label(const char *phase, int step, int ranks);

struct Outgoing {  // to rank + 1
  Message kind;
  const void *data;
  std::size_t bytes;
};
struct Incoming {  // from rank - 1
  Message kind;
  void *data;
  std::size_t bytes;
};

// One posted exchange; each transport derives its own.
class Exchange {
 public:
  virtual ~Exchange() = default;
};
using ExchangePtr = std::unique_ptr<Exchange>;

class Transport {
 public:
  virtual ~Transport() = default;
  virtual int ranks() const = 0;
  virtual int rank() const = 0;
  // Posts `sends` and `receives` as messages for ring step `step` (the step at
  // which the receiver uses them, 1 .. ranks). The sent buffers stay the
  // caller's until the exchange is waited for; so do the received ones.
  virtual ExchangePtr exchange(int step, std::span<const Outgoing> sends,
                               std::span<const Incoming> receives) = 0;
  // Until every transfer of `posted` is done (nothing when null); resets it.
  // A failure poisons the communicator and is rethrown.
  virtual void wait(ExchangePtr &posted) = 0;
};

// The host transport: the communicator's send / recv (UCX, or the in-process
// group), one tagged message per transfer.
//
// Tags: one sequence number per call (Communicator::next_sequence, the same
// on every rank), slot = kind * 4097 + step, where `step` is the step at
// which the receiver uses the message (1 .. n; n = the final delivery to the
// owner). Every message of a call therefore has its own tag. Every transfer
// is named in messages ("contrastive forward ring, step 2 of 4: column block
// from rank 1"), and counted in the ring statistics (bytes and messages sent,
// seconds blocked in waits).
class HostTransport final : public Transport {
 public:
  // phase: "contrastive forward ring", ... (named in every message)
  HostTransport(comm::Communicator &comm, const char *phase, Stats &stats);
  int ranks() const override { return ranks_; }
  int rank() const override { return rank_; }
  ExchangePtr exchange(int step, std::span<const Outgoing> sends,
                       std::span<const Incoming> receives) override;
  // Waits for the transfers in order; a failure poisons the communicator
  // (the ranks no longer agree) and is rethrown.
  void wait(ExchangePtr &posted) override;

 private:
  struct Pending {
    comm::TransferPtr transfer;
    std::string what;
  };
  struct Posted;
  std::uint64_t tag(Message kind, int step) const;
  // "contrastive forward ring, step 2 of 4: column block from rank 1"
  std::string label(Message kind, int step, const char *direction, int peer) const;

  comm::Communicator &comm_;
  const char *phase_;
  Stats &stats_;
  int ranks_, rank_;
  std::uint64_t sequence_;
};

}  // namespace flatmem::contrastive::ring
