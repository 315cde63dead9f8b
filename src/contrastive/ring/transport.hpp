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
#include <memory>
#include <span>

#include "comm/communicator.hpp"
#include "contrastive/ring/link.hpp"
#include "contrastive/ring/stats.hpp"

namespace flatmem::contrastive::ring {

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
// group), through RingLink (tags, messages naming the step, statistics).
class HostTransport final : public Transport {
 public:
  // phase: "contrastive forward ring", ... (named in every message)
  HostTransport(comm::Communicator &comm, const char *phase, Stats &stats) : link_(comm, phase, stats) {}
  int ranks() const override { return link_.ranks(); }
  int rank() const override { return link_.rank(); }
  ExchangePtr exchange(int step, std::span<const Outgoing> sends,
                       std::span<const Incoming> receives) override;
  void wait(ExchangePtr &posted) override;

 private:
  RingLink link_;
};

}  // namespace flatmem::contrastive::ring
