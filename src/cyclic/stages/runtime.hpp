// The object behind flatmem_cyclic_stages_t: one stage rank's clock over the
// stage-parallel schedule, its boundary streams and its gradient
// accumulators (see flatmem/cyclic_stages.h for the protocol).
//
// No thread of its own: sends are posted from handle staging and progress in
// the transport; receives are posted ahead. Four streams at most -- the
// activations from stage j-1 and to j+1, the gradients from j+1 and to j-1 --
// each an ordered sequence of messages k = 0, 1, ... for (step k / N,
// micro-batch k % N): every stage meets its micro-batches in that order in
// both directions, so message k of a stream is known by its index alone.
//
// options.memory = CUDA: the streams move through DeviceBoundaries instead
// (device_boundaries.hpp: one NCCL group per time step, entered by next());
// the host staging and posted receives are then unused.
#pragma once

#include <flatmem/cyclic_stages.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/message.hpp"
#include "cyclic/stages/accounting.hpp"
#include "cyclic/stages/device_boundaries.hpp"
#include "cyclic/stages/schedule.hpp"
#include "cyclic/stages/tags.hpp"

namespace flatmem::cyclic::stages {

struct StageSettings {
  StageSchedule schedule;
  std::vector<std::int64_t> boundary_bytes;    // L - 1 entries
  std::vector<std::int64_t> activation_bytes;  // L entries
  comm::Milliseconds timeout{60000};
  std::int64_t history = 65536;
  bool device = false;  // options.memory = CUDA (device_boundaries.hpp)
};

// One direction of one boundary, as seen by this rank.
struct Stream {
  bool active = false;
  bool incoming = false;
  Boundary kind = Boundary::activation;
  int peer = -1;
  std::size_t message_bytes = 0;  // header + boundary bytes
  std::int64_t boundary_bytes = 0;
  std::vector<std::vector<char>> buffers;  // R
  std::vector<comm::TransferPtr> transfers;  // R: message k uses [k % R]
  std::int64_t next = 0;    // next message to consume (incoming) / produce (outgoing)
  std::int64_t posted = 0;  // incoming: receives posted so far
};

class StageRuntime {
 public:
  // Collective: checks that every rank passes the same schedule and boundaries.
  StageRuntime(comm::Communicator &comm, StageSettings settings);
  ~StageRuntime();  // see flatmem_cyclic_stages_destroy

  const StageSchedule &schedule() const { return settings_.schedule; }
  flatmem_cyclic_stages_action next();
  // stream: the caller's cudaStream_t for device tensors (ignored on the host).
  void send(const DLTensor *tensor, void *stream);
  void receive(DLTensor *into, void *stream);
  void accumulate(const DLTensor *gradient, void *stream);
  void average(DLTensor *out, void *stream) const;
  std::int64_t stats(std::int64_t first, std::int64_t count,
                     const StructArrayOut<flatmem_cyclic_stages_time_step_stats> &out) const;
  flatmem_cyclic_stages_summary summary() const;

 private:
  void agree() const;
  void throw_if_failed() const;
  // Records the first failure, poisons the communicator, throws it.
  [[noreturn]] void failed(flatmem_status status, const std::string &message);
  // Runs a wait; any failure (the communicator is then poisoned) is recorded and rethrown.
  void wait(const comm::TransferPtr &t, const std::string &what);
  void post_receives(Stream &s);
  void reap_sends(Stream &s);
  void finish();  // DONE: the last sends
  std::string where() const;  // "cyclic stages, stage 2, micro-batch 3, step 7" (the current action)
  std::string where(std::int64_t message) const;  // the same for message k of a stream
  std::string describe(const Stream &s) const;  // "the activation from stage 1 (rank 1)"
  Stream &stream(bool incoming, bool forward);
  // The Direction of a stream (device_boundaries.hpp).
  int direction(const Stream &s) const;
  // A tensor's memory against options.memory (INVALID_ARGUMENT naming `name`).
  void check_memory(const comm::Message &m, const char *name) const;
  // The header of a received message against the current action and `into`.
  void check_header(const Header &h, const Stream &s, std::uint64_t into_bytes);
  // Device: the group of the time step being entered.
  void enter_device();

  comm::Communicator &comm_;
  StageSettings settings_;
  std::int32_t stage_ = 0;
  std::uint32_t id_ = 0;
  std::int64_t messages_ = 0;  // per stream: N * S
  std::int32_t staging_ = 1;   // R

  Stream in_activation_, out_activation_, in_gradient_, out_gradient_;

  // The clock.
  std::int64_t tau_ = -1;
  std::vector<flatmem_cyclic_stages_action> now_;  // the actions of tau_
  std::size_t index_ = 0;
  flatmem_cyclic_stages_action current_{};
  bool started_ = false, done_ = false;
  bool received_ = false, sent_ = false, accumulated_ = false;

  // Gradient accumulators, [s % 2]: the step they hold and how many
  // micro-batches are in (N: the average).
  std::vector<char> accumulator_[2];
  std::int64_t accumulator_step_[2] = {-1, -1};
  std::int32_t accumulated_count_[2] = {0, 0};
  comm::SumType type_ = comm::SumType::f32;
  std::size_t gradient_count_ = 0, gradient_bytes_ = 0;

  // options.memory = CUDA: the device side, and the messages of each
  // Direction produced (sends) / consumed (receives) in the current time step.
  std::unique_ptr<DeviceBoundaries> device_;
  std::array<int, 4> moved_{};

  flatmem_status failure_ = FLATMEM_STATUS_SUCCESS;
  std::string failure_message_;
  mutable bool failure_reported_ = false;
  StageAccounting accounting_;
};

}  // namespace flatmem::cyclic::stages

// The C handle.
struct flatmem_cyclic_stages_s {
  std::unique_ptr<flatmem::cyclic::stages::StageRuntime> impl;
};
