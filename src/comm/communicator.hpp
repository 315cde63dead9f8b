// The object behind flatmem_comm_t, as the rest of the library uses it: host
// point-to-point transfers with deadlines, a few host collectives, the
// poisoning rules, and the hook where the device (NCCL) transport hangs.
//
// Every failure is thrown as flatmem::Error (TIMEOUT, PEER_FAILURE,
// COMM_POISONED, INVALID_ARGUMENT) with a message naming the operation, the
// peer and the step; TIMEOUT and PEER_FAILURE poison the handle first (see
// flatmem/comm.h). Library-internal traffic (the ring contrastive loss, the
// collectives) uses the `internal` tag space, which never meets user tags.
#pragma once

#include <flatmem/flatmem.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>

namespace flatmem::comm {

using Milliseconds = std::chrono::milliseconds;

// Which tag space a message belongs to: the user's, the library's collectives
// and ring loss (next_sequence tags), the cyclic runtime's chains (its own
// tags, so they may run beside collectives from another thread).
enum class Space : std::uint8_t { user = 1, internal = 2, cyclic = 3 };

// A posted send or receive, completed by Communicator::wait. Each transport
// derives its own (ucx::UcxTransfer, LocalTransfer) and static_casts back;
// nothing else looks inside.
class Transfer {
 public:
  virtual ~Transfer() = default;
};
using TransferPtr = std::shared_ptr<Transfer>;

// Element types the host all-reduce sums.
enum class SumType { f32, f64, i32, i64 };
// into[i] = into[i] + from[i], i < count (src/comm/collectives.cpp).
void add_into(SumType type, void *into, const void *from, std::size_t count);

class DeviceTransport;  // NCCL, src/comm/nccl/ (absent without NCCL)

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual Milliseconds default_timeout() const = 0;
  // 0 -> default_timeout(); > 0 -> that many ms.
  Milliseconds resolve(std::int64_t timeout_ms) const {
    return timeout_ms > 0 ? Milliseconds(timeout_ms) : default_timeout();
  }

  // Throws COMM_POISONED (with the first error's text) when poisoned.
  virtual void check_healthy() const = 0;
  // SUCCESS, or the poisoning status; *message gets the first error's text.
  virtual flatmem_status health(std::string *message) const = 0;
  // Poisons the handle (first reason wins), cancels outstanding transfers and
  // tells the peers. Safe from any thread.
  virtual void poison(flatmem_status status, const std::string &message) = 0;

  // Post a host transfer (peer may be rank(): a local copy). `data` stays the
  // caller's until the transfer is waited for. tag: 40 bits for Space::internal
  // (see next_sequence), 32 bits for Space::user.
  virtual TransferPtr send(int peer, const void *data, std::size_t bytes, Space space,
                           std::uint64_t tag) = 0;
  virtual TransferPtr recv(int peer, void *data, std::size_t bytes, Space space,
                           std::uint64_t tag) = 0;
  // Wait until `transfer` completes or `timeout` passes. `what` names the
  // operation and step for messages ("ring loss forward, step 2 of 4").
  // Throws: TIMEOUT / PEER_FAILURE (handle poisoned first), INVALID_ARGUMENT
  // (a receive of another size; handle stays healthy).
  virtual void wait(const TransferPtr &transfer, Milliseconds timeout, const std::string &what) = 0;
  // Non-blocking: whether it completed (successfully or not).
  virtual bool test(const TransferPtr &transfer) = 0;
  // Waits for every transfer in order. Any failure -- a size mismatch
  // included, which inside a collective means the ranks disagree -- poisons
  // the handle before it is rethrown, so the other transfers are cancelled and
  // their buffers may be freed during unwinding. Library-internal exchanges
  // (collectives, the ring loss) wait through this.
  void wait_all(std::span<const TransferPtr> transfers, Milliseconds timeout,
                const std::string &what);
  void wait_all(std::initializer_list<TransferPtr> transfers, Milliseconds timeout,
                const std::string &what) {
    wait_all(std::span<const TransferPtr>(transfers.begin(), transfers.size()), timeout, what);
  }

  // A fresh number for one collective operation; every rank must call it the
  // same number of times in the same order (true when every rank runs the
  // same sequence of collectives). Internal tags: (sequence << 16) | slot,
  // slot < 65536.
  virtual std::uint64_t next_sequence() = 0;
  static std::uint64_t internal_tag(std::uint64_t sequence, std::uint32_t slot) {
    return ((sequence & 0xffffffu) << 16) | (slot & 0xffffu);
  }

  // Host collectives, blocking, `timeout` per step, `what` prefixes messages.
  // Written once over send/recv/wait (src/comm/collectives.cpp); every
  // transport inherits them. Each takes one next_sequence() for its tags.
  //
  // recv = sum over ranks of send (recv may equal send); every element is
  // summed in a fixed order, so every rank gets the same bits. Small
  // payloads (size() <= 64 ranks, size() * bytes <= 64 KiB): one direct
  // exchange, then the sum in rank order 0 .. size()-1. Larger ones: ring
  // reduce-scatter then ring all-gather over size() chunks.
  void all_reduce_sum(const void *send, void *recv, std::size_t count, SumType type,
                      Milliseconds timeout, const std::string &what);
  // Always the ring, with the caller's tags (bandwidth-optimal whatever the
  // size; the cyclic runtime's SYNC reduction): step k of the ring (0 .. 2(size-1)-1)
  // uses tag_base + k in `space`. No next_sequence(): safe beside collectives
  // run by another thread when the spaces or bases differ. `what` is used as is.
  void all_reduce_sum_tagged(const void *send, void *recv, std::size_t count, SumType type,
                             Milliseconds timeout, const std::string &what, Space space,
                             std::uint64_t tag_base);
  // all[r * bytes ...] = rank r's `mine` (bytes each); all has size() * bytes.
  // Small payloads (as all_reduce_sum) in one direct exchange, else a ring.
  void all_gather(const void *mine, void *all, std::size_t bytes, Milliseconds timeout,
                  const std::string &what);
  void broadcast(void *data, std::size_t bytes, int root, Milliseconds timeout,
                 const std::string &what);
  // send -> rank + 1, recv <- rank - 1 (a copy when size() == 1).
  void ring_shift(const void *send, void *recv, std::size_t bytes, Milliseconds timeout,
                  const std::string &what);
  void barrier(Milliseconds timeout, const std::string &what);
  // The direct exchange: blocks[rank() * bytes ...] goes to every other rank,
  // whose block lands at blocks[peer * bytes ...]; all transfers posted at
  // once under one tag, then waited for (a failure poisons, as wait_all).
  void exchange_with_all(char *blocks, std::size_t bytes, Milliseconds timeout, std::uint64_t tag,
                         const std::string &what);

  // The NCCL transport once flatmem_comm_init_device ran, else nullptr.
  DeviceTransport *device() const { return device_.get(); }
  void set_device(std::unique_ptr<DeviceTransport> device);

 protected:
  std::shared_ptr<DeviceTransport> device_;
};

}  // namespace flatmem::comm

// The C handle is the communicator.
struct flatmem_comm_s {
  std::unique_ptr<flatmem::comm::Communicator> impl;
};
