// The ZeRO relay's transfers on the device (options.memory = CUDA; see "On
// the device" under "ZeRO relay" in flatmem/cyclic.h): a private NCCL
// communicator, a transfer stream, device staging (K full stages, 3 shard
// copies), and one NCCL group per time step with every relay transfer of
// that time step. Built with the NCCL transport (cuda/relay_links.cpp);
// without it relay_links() is UNSUPPORTED (no_device_chain_io.cpp). Used by
// the caller's thread only, through Relay (relay.hpp), which keeps the
// argument checks, the registration and the accounting.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "comm/communicator.hpp"
#include "cyclic/relay_plan.hpp"

namespace flatmem::cyclic {

// A registered device shard: its memory and the stream the caller updates it on.
struct DeviceShard {
  const char *data = nullptr;
  void *stream = nullptr;
};

class RelayLinks {
 public:
  virtual ~RelayLinks() = default;
  // Inside flatmem_cyclic_next(tau): the shard copies whose contribution
  // time is tau (on the shards' streams), rank 0's own shard into its gather
  // of tau, then the group of tau. `shards` per stage; `element` bytes each.
  virtual void advance(std::int64_t tau, const std::vector<DeviceShard> &shards, std::size_t element) = 0;
  // During tau: waits on the host (<= timeout) for the group of tau, then
  // copies the stage of tau's relay (bytes) into `full` on `stream`.
  virtual void take(std::int64_t tau, void *full, std::size_t bytes, void *stream, comm::Milliseconds timeout) = 0;
  // Waits on the host (<= timeout) for every group enqueued so far.
  virtual void finish(comm::Milliseconds timeout) = 0;
  // Device bytes of staging (0 before the first advance).
  virtual std::int64_t staging_bytes() const = 0;
  virtual int device() const = 0;
};

// Collective over comm (a private NCCL communicator on comm's device,
// connected to the relay's neighbours within `timeout`). account_sent(bytes)
// is called for every send a group carries.
std::unique_ptr<RelayLinks> relay_links(comm::Communicator &comm, const RelayPlan &plan,
                                        comm::Milliseconds timeout, std::function<void(std::int64_t)> account_sent);

}  // namespace flatmem::cyclic
