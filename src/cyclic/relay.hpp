// The ZeRO relay of a cyclic handle (see "ZeRO relay" in flatmem/cyclic.h):
// the registered shards, the staging buffers, and the relay transfers. Driven
// by the caller's thread only (flatmem_cyclic_next / _parameters /
// _set_shard); the gradient shards travel on the runtime's deliverer thread
// (chains.cpp). Every wait has the handle's deadline; a failed wait poisons
// the communicator (Communicator::wait_all) and is thrown.
//
//   advance(tau), inside next(tau):  free the slots whose send completed;
//       post the receives of this rank's relays at tau (waiting for a slot if
//       all are still being taken) and tau + 1 (if one is free); rank 0
//       copies its own shard into the gather of tau; an owner k > 0 sends a
//       copy of its shard for rank 0's gathers whose contribution time is tau.
//   parameters(full), during a FORWARD / BACKWARD: wait for the relay, copy
//       it out, send it on to rank + 1 from the slot.
#pragma once

#include <flatmem/cyclic.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/message.hpp"
#include "cyclic/relay_links.hpp"
#include "cyclic/relay_plan.hpp"

namespace flatmem::cyclic {

class Relay {
 public:
  // `account_sent(bytes)` / `account_held(bytes)` record into the stats.
  // device: options.memory = CUDA (collective: the relay's NCCL communicator).
  Relay(comm::Communicator &comm, RelayPlan plan, std::uint32_t id, comm::Milliseconds timeout,
        std::function<void(std::int64_t)> account_sent, std::function<void(std::int64_t)> account_held,
        bool device);

  const RelayPlan &plan() const { return plan_; }
  // stream: the caller's cudaStream_t for a device shard (ignored on the host).
  void set_shard(std::int32_t stage, const DLTensor *shard, void *stream);
  // Element type of the shards (0 before the first set_shard).
  std::size_t element() const { return element_; }
  bool f64() const { return element_ == 8; }
  // INVALID_ARGUMENT unless every stage has a shard (first next()).
  void check_registered() const;
  void advance(std::int64_t tau);
  void parameters(const flatmem_cyclic_action &current, const DLTensor *full, void *stream);
  // Whether flatmem_cyclic_parameters served the action of time step tau.
  bool served(std::int64_t tau) const { return served_through_ >= tau; }
  // Waits until every send of this rank completed (before DONE).
  void finish();
  // Whether a transfer is still in flight (destroy must poison first).
  bool busy();
  // After the communicator was poisoned: let the cancelled transfers finish
  // before the buffers go away.
  void abandon();
  std::int64_t shard_bytes() const;
  std::int64_t staging_bytes() const {
    if (links_) return links_->staging_bytes();
    return std::int64_t(slots_.size()) * plan_.largest() * std::int64_t(element_);
  }
  std::int64_t staging_buffers() const { return plan_.staging_buffers(); }

 private:
  struct Slot {
    std::vector<char> data;
    bool used = false;  // holds a relay (posted, in use, or being sent on)
    RelayItem item;
    std::vector<comm::TransferPtr> receives;
    std::vector<int> from;  // the rank of each receive
    comm::TransferPtr send;
  };
  struct ShardCopy {
    std::vector<char> data;
    comm::TransferPtr send;
    std::string what;
  };

  // A tensor's memory against options.memory (INVALID_ARGUMENT naming `name`).
  void check_memory(const comm::Message &m, const char *name) const;
  Slot *find(std::int64_t tau);
  Slot *free_slot(bool wait);  // nullptr when none and !wait
  void post(const RelayItem &item, Slot &slot);
  void contribute(const RelayItem &gather);
  void reap();
  void report_held();
  std::string label(const RelayItem &item) const;
  std::size_t bytes(std::int32_t stage) const { return std::size_t(plan_.count[std::size_t(stage)]) * element_; }
  comm::TransferPtr send(int peer, const char *data, std::size_t n, std::uint64_t tag);

  comm::Communicator &comm_;
  RelayPlan plan_;
  std::uint32_t id_;
  comm::Milliseconds timeout_;
  std::function<void(std::int64_t)> account_sent_, account_held_;
  std::int32_t rank_, world_;

  std::size_t element_ = 0;
  std::vector<const char *> shards_;   // per stage: this rank's shard
  std::vector<bool> registered_;
  std::vector<Slot> slots_;
  std::deque<ShardCopy> copies_;       // shard sends to rank 0 in flight
  // options.memory = CUDA: the transfers (relay_links.hpp) and the shards' streams.
  std::unique_ptr<RelayLinks> links_;
  std::vector<DeviceShard> device_shards_;
  std::int64_t posted_through_ = -1;   // this rank's relays posted for time steps <= this
  std::int64_t contributed_through_ = -1;  // rank 0's gathers contributed to (owners)
  std::int64_t served_through_ = -1;
};

}  // namespace flatmem::cyclic
