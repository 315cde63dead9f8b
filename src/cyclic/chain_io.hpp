// How the chain threads of a cyclic handle move and combine gradient
// buffers (see runtime.hpp): host memory over the communicator's host
// transport (chain_io.cpp), or device memory over a private NCCL
// communicator and a stream of the thread's own (cuda/device_chain_io.cpp).
//
// One ChainIo per chain thread, used by that thread only (an NCCL
// communicator must not be driven from two threads). Every call returns when
// its work is complete in memory, and waits without a deadline of its own:
// the caller's flatmem_cyclic_next holds the deadline and poisons the
// communicator when it passes, which ends the wait. A failure poisons the
// communicator (so the peers fail at once) and is thrown with a message that
// starts with the `what` of the operation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "core/error.hpp"

namespace flatmem::cyclic {

// A handed-over gradient buffer and how far its reduction got.
struct Gradient {
  std::int32_t stage = 0;
  std::int64_t step = 0;
  std::int64_t handed_over_at = 0;  // the time step of its backward
  char *data = nullptr;
  std::size_t count = 0, bytes = 0;
  comm::SumType type = comm::SumType::f32;
  // Device gradients: the event recorded on the caller's stream at hand-over
  // (owned; device_gradient_ready). Empty for host gradients.
  std::shared_ptr<void> ready;
  // Guarded by Runtime::mutex_.
  bool reduced = false;  // this rank's part of the reduce chain is finished
  bool done = false;     // the average is in data (and passed on)
  std::string stuck_on;  // what its chain waits for now ("" = not started)
};
using GradientPtr = std::shared_ptr<Gradient>;

class ChainIo {
 public:
  // One send or receive of an exchange. The tag is the host transport's
  // check; NCCL matches by order (the chains' order is the same on every rank).
  struct Transfer {
    bool send = false;
    int peer = 0;
    char *data = nullptr;
    std::size_t bytes = 0;
    std::uint64_t tag = 0;
    std::string what;
  };

  virtual ~ChainIo() = default;
  // Before this thread first touches g: wait for its producer (device: the
  // event of the caller's stream). With `scan`, returns the index of the
  // first element that is not finite, or -1.
  virtual std::int64_t prepare(const Gradient &g, bool scan) = 0;
  // The transfers posted together; returns when all completed.
  virtual void exchange(std::span<const Transfer> transfers) = 0;
  // g.data[i] = g.data[i] + partial[i], the partial sum received from `peer`.
  virtual void receive_add(Gradient &g, int peer, std::uint64_t tag, const std::string &what) = 0;
  // g.data *= 1/n, the factor rounded to the element type (as kept.hpp's to_average).
  virtual void average(Gradient &g, std::int64_t n) = 0;
  // g.data = the sum of every rank's g.data (a collective of this thread's
  // peers; the step's SYNC reduction). Scaling is average()'s.
  virtual void all_reduce(Gradient &g, std::uint64_t tag, const std::string &what) = 0;
  // Returns once everything enqueued so far is complete (device: a host wait
  // for the stream; host: nothing is ever left pending).
  virtual void finish(const std::string &what) = 0;
};

// Host buffers over comm's host transport, Space::cyclic.
std::unique_ptr<ChainIo> host_chain_io(comm::Communicator &comm);

// --- device gradients (src/cyclic/cuda/, or no_device_chain_io.cpp) -------

// Whether this flatmem was built with the NCCL transport.
bool device_chains_built();
// options.memory of either cyclic handle: true for CUDA; INVALID_ARGUMENT
// for an unknown value, UNSUPPORTED for CUDA in a build without NCCL.
bool read_memory(std::int32_t memory);
// How the refusals name options.memory (0 HOST, 1 CUDA).
inline const char *memory_name(std::int64_t memory) { return memory == 0 ? "HOST" : "CUDA"; }
// Either create, after its all-gather of every rank's Agreement (fields
// `memory`: options.memory as read_memory read it; `device`: the
// communicator's NCCL device, -1 = none): INVALID_ARGUMENT naming the first
// rank whose memory differs from rank 0's, then, for CUDA, the first rank with
// no device transport. `create`: the C function named in the advice.
template <typename Agreement>
void check_memory_agreement(const std::vector<Agreement> &all, const char *create) {
  for (std::size_t r = 1; r < all.size(); ++r)
    if (all[r].memory != all[0].memory)
      invalid("options.memory: rank ", r, " passes ", memory_name(all[r].memory), ", rank 0 ",
              memory_name(all[0].memory), "; every rank must pass the same");
  if (all.empty() || all[0].memory == 0) return;
  for (std::size_t r = 0; r < all.size(); ++r)
    if (all[r].device < 0)
      invalid("options.memory: CUDA, but the communicator of rank ", r, " has no device transport; call "
              "flatmem_comm_init_device on every rank before ", create);
}
// Collective over comm (every rank, the same order): a private NCCL
// communicator on comm's device and a non-blocking stream. Within `timeout`.
std::unique_ptr<ChainIo> device_chain_io(comm::Communicator &comm, comm::Milliseconds timeout);
// INVALID_ARGUMENT naming `name` unless p is device (or managed) memory of
// `device`; UNSUPPORTED in a build without NCCL.
void check_device_memory(const void *p, int device, const char *name);
// INVALID_ARGUMENT naming `name` unless work can be ordered on `stream` (a
// cudaStream_t of `device`; NULL = the legacy default stream): an event is
// recorded on it and dropped.
void check_device_stream(void *stream, int device, const char *name);
// Caller's thread, at hand-over: checks that [data, data + bytes) is device
// memory of `device` (INVALID_ARGUMENT naming "gradient") and records an
// event on `stream` (INVALID_ARGUMENT naming "stream" when CUDA refuses it).
std::shared_ptr<void> device_gradient_ready(const void *data, std::size_t bytes, int device, void *stream);

}  // namespace flatmem::cyclic
