// The device side of a stage rank (options.memory = CUDA; see "Transport" in
// flatmem/cyclic_stages.h): the four boundary streams over a private NCCL
// communicator, in one NCCL group per time step on a transfer stream of the
// handle, and the two gradient accumulators. Built with the NCCL transport
// (cuda/device_boundaries.cpp); without it device_boundaries() is
// UNSUPPORTED (no_device_boundaries.cpp). Caller's thread only.
//
// Slots: per stream and parity (tau % 2) `slots` messages of
// 32 + boundary_bytes bytes: the messages produced in tau - 1 travel in the
// group of tau from the sender's parity (tau - 1) % 2 slots into the
// receiver's parity tau % 2 slots; ordinal i = the i-th message of the
// stream in that time step (both ends count the same, by the schedule).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "comm/communicator.hpp"

namespace flatmem::cyclic::stages {

// Every boundary message starts with this header (host and device paths).
struct Header {
  std::int64_t bytes;
  std::int64_t step;
  std::int32_t micro_batch;
  std::int32_t kind;
  std::int64_t reserved;
};
static_assert(sizeof(Header) == 32);

// The four streams of a stage rank.
enum Direction : int { in_activation = 0, out_activation = 1, in_gradient = 2, out_gradient = 3 };
inline bool incoming(int direction) { return direction == in_activation || direction == in_gradient; }

// One stream as the device side needs it: the neighbour (-1: none) and the
// message size (32 + boundary_bytes).
struct Link {
  int peer = -1;
  std::size_t message_bytes = 0;
};

class DeviceBoundaries {
 public:
  virtual ~DeviceBoundaries() = default;
  // The clock enters tau: enqueue the group of count[d] messages of each
  // stream d (sends: produced in tau - 1; receives: consumed in tau).
  virtual void enter(std::int64_t tau, const std::array<int, 4> &count) = 0;
  // During tau: the ordinal-th message of outgoing stream d -- header, then
  // `bytes` of device memory at data -- into its slot, on caller_stream.
  virtual void put(int d, int ordinal, std::int64_t tau, const Header &h, const void *data,
                   std::size_t bytes, void *caller_stream) = 0;
  // During tau: waits on the host (<= timeout) for the group of tau; the
  // header of the ordinal-th message of incoming stream d.
  virtual Header arrived(int d, int ordinal, std::int64_t tau, comm::Milliseconds timeout) = 0;
  // Then its payload into `into` (device memory), on caller_stream.
  virtual void take(int d, int ordinal, std::int64_t tau, void *into, std::size_t bytes,
                    void *caller_stream) = 0;
  // Waits on the host (<= timeout) until every group enqueued so far is done.
  virtual void finish(comm::Milliseconds timeout) = 0;

  // The accumulators (two of `bytes`, allocated at the first call), on
  // caller_stream: slot = step % 2; first: copy, else add; then, when
  // average_over > 1, scale by 1/average_over (the host arithmetic).
  virtual void accumulate(int slot, bool first, bool f64, const void *gradient, std::size_t count,
                          std::size_t bytes, std::int64_t average_over, void *caller_stream) = 0;
  // Each waits for the slot's previous accumulate / average, on any stream.
  virtual void average(int slot, void *out, std::size_t bytes, void *caller_stream) = 0;
  // The CUDA device of the communicator.
  virtual int device() const = 0;
};

// Collective over comm when any link is active (a private NCCL communicator
// on comm's device, connected to the linked neighbours before it returns).
// `slots` messages per stream and parity: the most one time step carries.
std::unique_ptr<DeviceBoundaries> device_boundaries(comm::Communicator &comm, const std::array<Link, 4> &links,
                                                    int slots, comm::Milliseconds timeout);

}  // namespace flatmem::cyclic::stages
