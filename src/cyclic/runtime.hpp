// The object behind flatmem_cyclic_t: the caller's clock over the schedule,
// the gradients in flight, and two threads that run the point-to-point
// chains (see flatmem/cyclic.h for the protocol).
//
//   caller thread   next(): advance, pace (start token), wait for updates;
//                   reduce(): validate, hand a gradient to the chains.
//   reducer thread  per gradient, in hand-over order: receive the partial sum
//                   from rank - 1, add, send to rank + 1 (rank N-1: scale to
//                   the average). SYNC: a ring all-reduce of the step's
//                   stages once stage 0 is handed over.
//   deliverer       per gradient, once reduced: receive the average into the
//                   buffer and pass it on. NEWEST: at once, down the chain
//                   (N-1 -> N-2 -> ... -> 0: the late ranks, which may use it
//                   in the next step, first). DELAY1: around the ring in
//                   stagger order (N-1 -> 0 -> 1 -> ... -> N-2), each hop
//                   released by the sender's clock (see release_time), in the
//                   order the ranks need them (step, then stage): the
//                   delivery traffic is as spread out as the reduce chain's.
//
// How a thread moves and combines buffers is its ChainIo (chain_io.hpp): the
// host transport, or (options.memory = CUDA) a private NCCL communicator and
// stream per thread, with a host wait at the end of every link.
//
// Each thread talks to one neighbour in one direction in a fixed order, the
// same on every rank, so messages match by order; tags (src/cyclic/tags.hpp)
// carry the stage and step as a check. The threads wait without deadline
// (a peer's death still fails them at once); deadlines belong to the caller,
// whose next() names what the chain is stuck on when it gives up.
#pragma once

#include <flatmem/cyclic.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.hpp"
#include "core/error.hpp"
#include "cyclic/accounting.hpp"
#include "cyclic/chain_io.hpp"
#include "cyclic/relay.hpp"
#include "cyclic/schedule.hpp"

namespace flatmem::cyclic {

struct Settings {
  Schedule schedule;
  std::vector<std::int64_t> activation_bytes;  // L entries
  comm::Milliseconds timeout{60000};
  bool scan_nonfinite = true;
  std::int64_t history = 65536;
  // The ZeRO relay (options.parameters = RELAYED): n_j per stage; empty = replicated.
  std::vector<std::int64_t> parameter_count;
  bool relayed() const { return !parameter_count.empty(); }
  // options.memory: kDLCUDA gradients over NCCL (src/cyclic/cuda/).
  bool device = false;
};

// options.parameters / parameter_count into s (s.schedule already read):
// INVALID_ARGUMENT / UNSUPPORTED naming the field.
void read_parameter_options(std::int32_t mode, const std::int64_t *parameter_count, Settings &s);
// options.memory into s (after read_parameter_options).
void read_memory_option(std::int32_t memory, Settings &s);

class Runtime {
 public:
  // Collective: checks that every rank passes the same schedule.
  Runtime(comm::Communicator &comm, Settings settings);
  ~Runtime();  // see flatmem_cyclic_destroy

  const Schedule &schedule() const { return settings_.schedule; }
  flatmem_cyclic_action next();
  // stream: the caller's cudaStream_t for a device gradient (ignored on the host).
  void reduce(std::int32_t stage, const DLTensor *gradient, void *stream);
  std::int64_t stats(std::int64_t first, std::int64_t count,
                     const StructArrayOut<flatmem_cyclic_time_step_stats> &out) const;
  flatmem_cyclic_summary summary() const;

  // The ZeRO relay (src/cyclic/relay.cpp); INVALID_ARGUMENT on a replicated handle.
  // stream: the caller's cudaStream_t for device shards / stages (ignored on the host).
  void set_shard(std::int32_t stage, const DLTensor *shard, void *stream);
  void parameters(const DLTensor *full, void *stream);
  std::pair<std::int64_t, std::int64_t> shard_range(std::int32_t stage, std::int32_t rank) const;
  std::int64_t relay_stats(std::int64_t first, std::int64_t count,
                           const StructArrayOut<flatmem_cyclic_relay_time_step> &out) const;
  void relay_summary(flatmem_cyclic_relay_summary &out) const;

 private:
  // Throws the recorded failure: its own status once, COMM_POISONED after.
  void throw_if_failed(std::unique_lock<std::mutex> &lock);
  // Records the first failure and wakes everyone (lock held).
  void record_failure(flatmem_status status, const std::string &message);
  void start_token(std::int64_t time_step);
  void wait_for_update(std::int32_t stage, std::int64_t step);
  GradientPtr take(std::int32_t stage, std::int64_t step);
  void check_not_in_flight(const Gradient &g) const;  // lock held

  // The threads (src/cyclic/chains.cpp).
  void reducer_loop();
  void deliverer_loop();
  void reduce_link(Gradient &g);
  void all_reduce_step(const std::vector<GradientPtr> &stages);
  void deliver_link(Gradient &g);
  // Relayed: rank N-1 sends shard k of the average to owner k.
  void scatter_link(Gradient &g);
  const Relay &relay() const;  // INVALID_ARGUMENT when replicated
  // Runs a relay call; a communication failure is recorded as the handle's.
  template <typename F>
  void relay_call(F f);
  // DELAY1 paces the delivery around the ring; NEWEST delivers at once.
  bool paced() const { return settings_.schedule.rule == FLATMEM_CYCLIC_DELAY1; }
  int deliver_from() const;  // -1: none (this rank formed the sum)
  int deliver_to() const;    // -1: none (the last rank of the delivery)
  std::int64_t delivery_key(const Gradient &g);  // mutex held
  // Global time step at which this rank passes g's average on (paced).
  std::int64_t release_time(const Gradient &g) const;
  // Waits for g's producer and scans a device gradient (NON_FINITE: poisons, throws).
  void prepare(ChainIo &io, Gradient &g);
  std::string nonfinite_message(std::int32_t stage, std::int64_t step, std::int64_t element) const;
  // reduce(): the checks of a host or device gradient against options.memory.
  void check_memory(const DLTensor &gradient, std::int32_t device_type) const;
  // Accounts a send posted now that the protocol assigns to time step `scheduled`.
  void sent(std::size_t bytes, std::int64_t scheduled);
  // Records what a thread waits for now (for timeout messages).
  void waiting(Gradient &g, std::string &doing, const std::string &what);
  // What the chain of g waits for (lock held).
  std::string stuck_on(const Gradient &g) const;

  comm::Communicator &comm_;
  Settings settings_;
  std::int32_t rank_ = 0, world_ = 1;
  std::uint32_t id_ = 0;  // tells this handle's messages from an earlier one's

  // Caller's side (one thread); time_step_ is written under mutex_ (the
  // deliverer reads it).
  std::int64_t time_step_ = -1;
  flatmem_cyclic_action current_{};
  bool handed_over_ = false;
  comm::TransferPtr token_out_;

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<GradientPtr> in_flight_;        // handed over, update not yet returned
  std::deque<GradientPtr> reduce_queue_;      // cyclic: chain jobs
  std::deque<std::vector<GradientPtr>> sync_queue_;  // SYNC: whole steps
  // Delivery jobs by their order key (delivery_key) and the next key due.
  std::map<std::int64_t, GradientPtr> deliver_pending_;
  std::int64_t deliver_next_ = 0, handed_over_count_ = 0;
  bool stopping_ = false;
  flatmem_status failure_ = FLATMEM_STATUS_SUCCESS;
  std::string failure_message_;
  bool failure_reported_ = false;
  Accounting accounting_;
  // How each chain thread moves its buffers (host transport or NCCL); each
  // is used by its thread only.
  std::unique_ptr<ChainIo> reduce_io_, deliver_io_;
  std::string reducer_doing_, deliverer_doing_;  // guarded by mutex_

  std::unique_ptr<Relay> relay_;  // relayed handles only; caller's thread

  std::thread reducer_, deliverer_;
};

}  // namespace flatmem::cyclic

// The C handle.
struct flatmem_cyclic_s {
  std::unique_ptr<flatmem::cyclic::Runtime> impl;
};

namespace flatmem::cyclic {

// The runtime behind a C handle; INVALID_ARGUMENT "handle: NULL" (src/capi/).
inline Runtime &runtime_of(flatmem_cyclic_t *handle) {
  if (handle == nullptr || !handle->impl) invalid("handle: NULL");
  return *handle->impl;
}
inline const Runtime &runtime_of(const flatmem_cyclic_t *handle) {
  if (handle == nullptr || !handle->impl) invalid("handle: NULL");
  return *handle->impl;
}

}  // namespace flatmem::cyclic
