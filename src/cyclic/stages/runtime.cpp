#include "cyclic/stages/runtime.hpp"

#include <algorithm>
#include <cstring>

#include "comm/device_transport.hpp"
#include "comm/message.hpp"
#include "core/error.hpp"
#include "core/tensor.hpp"
#include "cyclic/chain_io.hpp"
#include "cyclic/kept.hpp"

namespace flatmem::cyclic::stages {
namespace {

using Clock = std::chrono::steady_clock;

// Every message: a Header (device_boundaries.hpp), then the tensor, padded
// to boundary bytes.

// What every rank must agree on, as exchanged at create.
struct Agreement {
  std::int64_t stages, micro_batches, steps, rule;
  std::int64_t memory;  // options.memory (0 HOST, 1 CUDA)
  std::int64_t device;  // the communicator's NCCL device, -1 = none
};

const char *rule_name(std::int64_t rule) {
  switch (rule) {
    case FLATMEM_CYCLIC_SYNC: return "SYNC";
    case FLATMEM_CYCLIC_NEWEST: return "NEWEST";
    default: return "DELAY1";
  }
}

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

const char *kind_name(flatmem_cyclic_action_kind kind) {
  switch (kind) {
    case FLATMEM_CYCLIC_FORWARD: return "FORWARD";
    case FLATMEM_CYCLIC_BACKWARD: return "BACKWARD";
    case FLATMEM_CYCLIC_IDLE: return "IDLE (update only)";
    default: return "DONE";
  }
}

}  // namespace

StageRuntime::StageRuntime(comm::Communicator &comm, StageSettings settings)
    : comm_(comm), settings_(std::move(settings)), stage_(comm.rank()),
      accounting_(settings_.activation_bytes, comm.rank(), settings_.history,
                  settings_.schedule.occupancy(comm.rank()).busy_fraction) {
  const StageSchedule &s = settings_.schedule;
  comm_.check_healthy();
  agree();
  id_ = std::uint32_t(comm_.next_sequence());
  messages_ = std::int64_t(s.micro_batches) * s.steps;
  const std::int64_t l2 = 2 * std::int64_t(s.stages);
  staging_ = std::int32_t(std::min<std::int64_t>((s.micro_batches + l2 - 1) / l2, 64) + 1);
  const auto open = [&](Stream &st, bool incoming, Boundary kind, int peer, std::int64_t bytes) {
    st.active = true;
    st.incoming = incoming;
    st.kind = kind;
    st.peer = peer;
    st.boundary_bytes = bytes;
    st.message_bytes = sizeof(Header) + std::size_t(bytes);
    if (settings_.device) return;  // device staging: device_boundaries
    st.buffers.assign(std::size_t(staging_), std::vector<char>(st.message_bytes, 0));
    st.transfers.assign(std::size_t(staging_), nullptr);
  };
  if (stage_ > 0) {
    const std::int64_t b = settings_.boundary_bytes[std::size_t(stage_ - 1)];
    open(in_activation_, true, Boundary::activation, stage_ - 1, b);
    open(out_gradient_, false, Boundary::gradient, stage_ - 1, b);
  }
  if (stage_ + 1 < s.stages) {
    const std::int64_t b = settings_.boundary_bytes[std::size_t(stage_)];
    open(out_activation_, false, Boundary::activation, stage_ + 1, b);
    open(in_gradient_, true, Boundary::gradient, stage_ + 1, b);
  }
  if (settings_.device) {
    std::array<Link, 4> links;
    for (const Stream *st : {&in_activation_, &out_activation_, &in_gradient_, &out_gradient_})
      if (st->active) links[std::size_t(direction(*st))] = Link{st->peer, st->message_bytes};
    // The most messages one time step carries on a stream: the micro-batches
    // sharing an offset, ceil(N / 2L) (no cap: they all travel in that step).
    const std::int32_t slots = std::int32_t((s.micro_batches + l2 - 1) / l2);
    device_ = device_boundaries(comm_, links, slots, settings_.timeout);  // collective when L > 1
    return;
  }
  post_receives(in_activation_);
  post_receives(in_gradient_);
}

int StageRuntime::direction(const Stream &s) const {
  if (s.kind == Boundary::activation) return s.incoming ? in_activation : out_activation;
  return s.incoming ? in_gradient : out_gradient;
}

void StageRuntime::agree() const {
  // Every rank must run the same schedule over the same boundaries: one
  // all-gather each, then every rank names the first rank that differs from rank 0.
  const StageSchedule &s = settings_.schedule;
  const int world = comm_.size();
  const Agreement mine{s.stages, s.micro_batches, s.steps, std::int64_t(s.rule), settings_.device ? 1 : 0,
                       comm_.device() ? comm_.device()->device() : -1};
  std::vector<Agreement> all(static_cast<std::size_t>(world));
  comm_.all_gather(&mine, all.data(), sizeof mine, settings_.timeout, "cyclic stages create: agreement");
  for (int r = 1; r < world; ++r) {
    const Agreement &a = all[std::size_t(r)], &z = all[0];
    if (a.stages != z.stages || a.micro_batches != z.micro_batches || a.steps != z.steps || a.rule != z.rule)
      invalid("options: rank ", r, " has stages ", a.stages, ", micro_batches ", a.micro_batches,
              ", steps ", a.steps, ", rule ", rule_name(a.rule), " but rank 0 has stages ", z.stages,
              ", micro_batches ", z.micro_batches, ", steps ", z.steps, ", rule ", rule_name(z.rule),
              "; every rank must pass the same");
  }
  check_memory_agreement(all, "flatmem_cyclic_stages_create");
  const std::size_t n = settings_.boundary_bytes.size();
  if (n == 0) return;
  std::vector<std::int64_t> bounds(n * std::size_t(world));
  comm_.all_gather(settings_.boundary_bytes.data(), bounds.data(), n * sizeof(std::int64_t),
                   settings_.timeout, "cyclic stages create: boundary bytes");
  for (int r = 1; r < world; ++r)
    for (std::size_t b = 0; b < n; ++b)
      if (bounds[std::size_t(r) * n + b] != bounds[b])
        invalid("options.boundary_bytes[", b, "]: rank ", r, " has ", bounds[std::size_t(r) * n + b],
                " but rank 0 has ", bounds[b], "; every rank must pass the same");
}

StageRuntime::~StageRuntime() {
  if (!done_ && failure_ == FLATMEM_STATUS_SUCCESS && comm_.size() > 1) {
    // The neighbours cannot finish without us: tell them, and cancel our
    // transfers so the staging may go.
    comm_.poison(FLATMEM_STATUS_PEER_FAILURE,
                 "cyclic stages: stage " + std::to_string(stage_) +
                     " was destroyed before the end of its schedule (time step " +
                     std::to_string(std::max<std::int64_t>(tau_, 0)) + ")");
  }
}

void StageRuntime::throw_if_failed() const {
  if (failure_ == FLATMEM_STATUS_SUCCESS) return;
  if (!failure_reported_) {
    failure_reported_ = true;
    throw Error(failure_, failure_message_);
  }
  fail(FLATMEM_STATUS_COMM_POISONED, "cyclic stages handle failed earlier: ", failure_message_);
}

void StageRuntime::failed(flatmem_status status, const std::string &message) {
  if (failure_ == FLATMEM_STATUS_SUCCESS) {
    failure_ = status;
    failure_message_ = message;
  }
  failure_reported_ = true;
  comm_.poison(status, message);
  throw Error(status, message);
}

void StageRuntime::wait(const comm::TransferPtr &t, const std::string &what) {
  const auto begun = Clock::now();
  try {
    comm_.wait_all({t}, settings_.timeout, what);  // poisons the communicator on failure
  } catch (const Error &e) {
    accounting_.waited(seconds_since(begun));
    failed(e.status(), e.what());
  }
  accounting_.waited(seconds_since(begun));
}

std::string StageRuntime::where() const {
  std::string w = "cyclic stages, stage " + std::to_string(stage_);
  if (current_.micro_batch >= 0)
    w += ", micro-batch " + std::to_string(current_.micro_batch) + ", step " + std::to_string(current_.step);
  return w;
}

std::string StageRuntime::where(std::int64_t message) const {
  const std::int64_t n = settings_.schedule.micro_batches;
  return "cyclic stages, stage " + std::to_string(stage_) + ", micro-batch " + std::to_string(message % n) +
         ", step " + std::to_string(message / n);
}

std::string StageRuntime::describe(const Stream &s) const {
  const char *what = s.kind == Boundary::activation ? "the activation" : "the gradient";
  return std::string(what) + (s.incoming ? " from" : " to") + " stage " + std::to_string(s.peer) +
         " (rank " + std::to_string(s.peer) + ")";
}

Stream &StageRuntime::stream(bool incoming, bool forward) {
  if (incoming) return forward ? in_activation_ : in_gradient_;
  return forward ? out_activation_ : out_gradient_;
}

void StageRuntime::post_receives(Stream &s) {
  if (!s.active) return;
  const std::int64_t n = settings_.schedule.micro_batches;
  while (s.posted < messages_ && s.posted < s.next + staging_) {
    const std::int64_t k = s.posted++;
    std::vector<char> &buffer = s.buffers[std::size_t(k % staging_)];
    s.transfers[std::size_t(k % staging_)] =
        comm_.recv(s.peer, buffer.data(), s.message_bytes, comm::Space::cyclic,
                   boundary_tag(id_, s.kind, std::int32_t(k % n), k / n));
  }
}

void StageRuntime::reap_sends(Stream &s) {
  if (!s.active) return;
  // Message k sits in slot k % R: the in-flight ones are k = next - R .. next - 1.
  for (std::int64_t k = std::max<std::int64_t>(0, s.next - staging_); k < s.next; ++k) {
    comm::TransferPtr &t = s.transfers[std::size_t(k % staging_)];
    if (t && comm_.test(t)) {
      const comm::TransferPtr done = t;
      t = nullptr;
      wait(done, where(k) + ": send " + describe(s));  // completed: reports a failure, if any
    }
  }
}

void StageRuntime::finish() {
  if (device_) {
    const auto begun = Clock::now();
    try {
      device_->finish(settings_.timeout);
    } catch (const Error &e) {
      accounting_.waited(seconds_since(begun));
      failed(e.status(), "cyclic stages, stage " + std::to_string(stage_) +
                             ": at the end, the last transfers with the neighbouring stages (are they still "
                             "running?): " + e.what());
    }
    accounting_.waited(seconds_since(begun));
    done_ = true;
    return;
  }
  for (Stream *s : {&out_activation_, &out_gradient_}) {
    if (!s->active) continue;
    for (std::int64_t k = std::max<std::int64_t>(0, s->next - staging_); k < s->next; ++k) {
      comm::TransferPtr &t = s->transfers[std::size_t(k % staging_)];
      if (t) {
        wait(t, where(k) + ": at the end, send " + describe(*s) + " (is that stage still running?)");
        t = nullptr;
      }
    }
  }
  done_ = true;
}

flatmem_cyclic_stages_action StageRuntime::next() {
  throw_if_failed();
  const StageSchedule &s = settings_.schedule;
  if (started_ && !done_) {
    const char *missing = current_.receives && !received_ ? "flatmem_cyclic_stages_receive"
                          : current_.sends && !sent_   ? "flatmem_cyclic_stages_send"
                          : current_.accumulates && !accumulated_ ? "flatmem_cyclic_stages_accumulate"
                                                                  : nullptr;
    if (missing != nullptr)
      invalid("flatmem_cyclic_stages_next: the current action (", kind_name(current_.kind), ", ",
              where(), ", time step ", current_.time_step, ") needs ", missing, " first");
  }
  if (done_) return current_;
  started_ = true;
  if (++index_ >= now_.size()) {
    // The next time step with actions; the ones between are recorded empty.
    const std::int64_t end = s.length();
    for (;;) {
      ++tau_;
      if (tau_ >= end) break;
      now_ = s.actions(stage_, tau_);
      index_ = 0;
      if (device_) enter_device();
      accounting_.begin(tau_, std::int32_t(now_.size()),
                        now_.empty() ? s.activations_held(stage_, tau_) : now_[0].activations_held,
                        Clock::now());
      if (!now_.empty()) break;
    }
    if (tau_ >= end) {
      if (device_ && (moved_[out_activation] != 0 || moved_[out_gradient] != 0))
        fail(FLATMEM_STATUS_INTERNAL, "cyclic stages, stage ", stage_, ": messages sent in the last time step");
      finish();
      current_ = flatmem_cyclic_stages_action{};
      current_.time_step = end;
      current_.kind = FLATMEM_CYCLIC_DONE;
      current_.stage = -1;
      current_.micro_batch = -1;
      current_.step = current_.version = current_.update_step = -1;
      return current_;
    }
  }
  current_ = now_[index_];
  received_ = sent_ = accumulated_ = false;
  if (!device_)
    for (Stream *st : {&out_activation_, &out_gradient_}) reap_sends(*st);
  if (current_.update_step >= 0) {
    const std::size_t slot = std::size_t(current_.update_step % 2);
    if (accumulator_step_[slot] != current_.update_step ||
        accumulated_count_[slot] != s.micro_batches)
      fail(FLATMEM_STATUS_INTERNAL, where(), ": the average of step ", current_.update_step,
           " is due but incomplete");
  }
  return current_;
}

void StageRuntime::enter_device() {
  // The messages produced in tau - 1 (counted by send) and consumed in tau
  // (the schedule's receives): the neighbours count the same.
  std::array<int, 4> count{};
  count[out_activation] = moved_[out_activation];
  count[out_gradient] = moved_[out_gradient];
  for (const flatmem_cyclic_stages_action &a : now_)
    if (a.receives) ++count[a.kind == FLATMEM_CYCLIC_FORWARD ? in_activation : in_gradient];
  moved_ = {};
  try {
    device_->enter(tau_, count);
  } catch (const Error &e) {
    failed(e.status(), e.what());
  }
}

void StageRuntime::check_memory(const comm::Message &m, const char *name) const {
  const bool device = settings_.device;
  if (m.device.device_type != (device ? kDLCUDA : kDLCPU))
    invalid(name, ": device type ", int(m.device.device_type), "; options.memory = ", memory_name(device ? 1 : 0),
            " takes ", device ? "kDLCUDA" : "kDLCPU", " tensors",
            device ? "" : " (device tensors need options.memory = FLATMEM_CYCLIC_MEMORY_CUDA)");
  if (!device) return;
  if (m.device.device_id != device_->device())
    invalid(name, ": on CUDA device ", m.device.device_id, "; the communicator's device transport is on device ",
            device_->device());
  if (m.bytes > 0) check_device_memory(m.data, device_->device(), name);
}

void StageRuntime::check_header(const Header &h, const Stream &st, std::uint64_t into_bytes) {
  if (h.step != current_.step || h.micro_batch != current_.micro_batch)
    failed(FLATMEM_STATUS_INTERNAL, where() + ": receive " + describe(st) + ": got micro-batch " +
                                        std::to_string(h.micro_batch) + ", step " + std::to_string(h.step));
  if (std::uint64_t(h.bytes) != into_bytes)
    failed(FLATMEM_STATUS_INVALID_ARGUMENT,
           where() + ": receive " + describe(st) + ": the sender sent " + std::to_string(h.bytes) +
               " bytes but `into` has " + std::to_string(into_bytes) + " bytes");
}

void StageRuntime::receive(DLTensor *into, void *stream) {
  throw_if_failed();
  if (!started_ || done_ || !current_.receives)
    invalid("into: the current action (", kind_name(current_.kind), ", ", where(),
            ") receives nothing; call flatmem_cyclic_stages_receive only when the action's receives is 1");
  if (received_) invalid("into: the current action's tensor was already received (", where(), ")");
  const comm::Message m = comm::check_message(into, "into");
  check_memory(m, "into");
  Stream &st = this->stream(true, current_.kind == FLATMEM_CYCLIC_FORWARD);
  if (device_) {
    const int d = direction(st);
    const int ordinal = moved_[std::size_t(d)];
    const auto begun = Clock::now();
    Header h{};
    try {
      h = device_->arrived(d, ordinal, tau_, settings_.timeout);
    } catch (const Error &e) {
      accounting_.waited(seconds_since(begun));
      failed(e.status(), where() + ": receive " + describe(st) + ": " + e.what());
    }
    accounting_.waited(seconds_since(begun));
    check_header(h, st, m.bytes);
    try {
      device_->take(d, ordinal, tau_, m.data, m.bytes, stream);
    } catch (const Error &e) {
      failed(e.status(), where() + ": receive " + describe(st) + ": " + e.what());
    }
    ++moved_[std::size_t(d)];
    ++st.next;
    received_ = true;
    return;
  }
  const std::int64_t k = st.next;
  post_receives(st);
  const std::size_t slot = std::size_t(k % staging_);
  wait(st.transfers[slot], where() + ": receive " + describe(st));
  st.transfers[slot] = nullptr;
  Header h{};
  std::memcpy(&h, st.buffers[slot].data(), sizeof h);
  check_header(h, st, m.bytes);
  if (m.bytes > 0) std::memcpy(m.data, st.buffers[slot].data() + sizeof h, m.bytes);
  ++st.next;
  post_receives(st);
  received_ = true;
}

void StageRuntime::send(const DLTensor *tensor, void *stream) {
  throw_if_failed();
  if (!started_ || done_ || !current_.sends)
    invalid("tensor: the current action (", kind_name(current_.kind), ", ", where(),
            ") sends nothing; call flatmem_cyclic_stages_send only when the action's sends is 1");
  if (sent_) invalid("tensor: the current action's tensor was already sent (", where(), ")");
  const comm::Message m = comm::check_message(tensor, "tensor");
  check_memory(m, "tensor");
  Stream &st = this->stream(false, current_.kind == FLATMEM_CYCLIC_FORWARD);
  const std::size_t boundary = std::size_t(current_.kind == FLATMEM_CYCLIC_FORWARD ? stage_ : stage_ - 1);
  if (m.bytes > std::uint64_t(st.boundary_bytes))
    invalid("tensor: ", m.bytes, " bytes, more than options.boundary_bytes[", boundary, "] = ",
            st.boundary_bytes, " (", where(), ")");
  if (device_) {
    const int d = direction(st);
    const Header h{std::int64_t(m.bytes), current_.step, current_.micro_batch, std::int32_t(st.kind), 0};
    try {
      device_->put(d, moved_[std::size_t(d)], tau_, h, m.data, m.bytes, stream);
    } catch (const Error &e) {
      failed(e.status(), where() + ": send " + describe(st) + ": " + e.what());
    }
    ++moved_[std::size_t(d)];
    accounting_.sent(std::int64_t(st.message_bytes));
    ++st.next;
    sent_ = true;
    return;
  }
  const std::int64_t k = st.next;
  const std::size_t slot = std::size_t(k % staging_);
  if (st.transfers[slot]) {
    // The staging buffer still carries message k - R.
    wait(st.transfers[slot], where(k - staging_) + ": send " + describe(st) +
                                 " (its staging buffer is needed for micro-batch " +
                                 std::to_string(current_.micro_batch) + ", step " +
                                 std::to_string(current_.step) + ")");
    st.transfers[slot] = nullptr;
  }
  std::vector<char> &buffer = st.buffers[slot];
  const Header h{std::int64_t(m.bytes), current_.step, current_.micro_batch,
                 std::int32_t(st.kind), 0};
  std::memcpy(buffer.data(), &h, sizeof h);
  if (m.bytes > 0) std::memcpy(buffer.data() + sizeof h, m.data, m.bytes);
  st.transfers[slot] = comm_.send(st.peer, buffer.data(), st.message_bytes, comm::Space::cyclic,
                                  boundary_tag(id_, st.kind, current_.micro_batch, current_.step));
  accounting_.sent(std::int64_t(st.message_bytes));
  ++st.next;
  sent_ = true;
}

void StageRuntime::accumulate(const DLTensor *gradient, void *stream) {
  throw_if_failed();
  if (!started_ || done_ || !current_.accumulates)
    invalid("gradient: the current action (", kind_name(current_.kind), ", ", where(),
            ") is not a BACKWARD; hand a gradient over right after its backward");
  if (accumulated_) invalid("gradient: the gradient of ", where(), " was already accumulated");
  const comm::Message m = comm::check_message(gradient, "gradient");
  check_memory(m, "gradient");
  if (m.dtype.code != kDLFloat || (m.dtype.bits != 32 && m.dtype.bits != 64))
    invalid("gradient: dtype ", dtype_text(m.dtype), "; expected float32 or float64");
  if (m.count == 0) invalid("gradient: no elements");
  check_element_aligned(m.data, m.dtype.bits / 8, "gradient");  // added to as float / double
  const comm::SumType type = m.dtype.bits == 32 ? comm::SumType::f32 : comm::SumType::f64;
  if (gradient_count_ == 0) {
    if (!device_) {
      accumulator_[0].assign(m.bytes, 0);
      accumulator_[1].assign(m.bytes, 0);
    }
    type_ = type;
    gradient_count_ = m.count;
    gradient_bytes_ = m.bytes;
  } else if (type != type_ || m.count != gradient_count_) {
    invalid("gradient: ", m.count, " elements of float", int(m.dtype.bits), " but the first gradient had ",
            gradient_count_, " of float", type_ == comm::SumType::f32 ? 32 : 64,
            "; every gradient of the stage must match");
  }
  const std::size_t slot = std::size_t(current_.step % 2);
  if (device_) {
    const std::int32_t n = settings_.schedule.micro_batches;
    const bool last = (current_.micro_batch == 0 ? 0 : accumulated_count_[slot]) + 1 == n;
    try {
      device_->accumulate(int(slot), current_.micro_batch == 0, type_ == comm::SumType::f64, m.data,
                          gradient_count_, gradient_bytes_, last && n > 1 ? n : 0, stream);
    } catch (const Error &e) {
      failed(e.status(), where() + ": accumulate: " + e.what());
    }
    if (current_.micro_batch == 0) {
      accumulator_step_[slot] = current_.step;
      accumulated_count_[slot] = 0;
    }
    ++accumulated_count_[slot];
    accumulated_ = true;
    return;
  }
  char *acc = accumulator_[slot].data();
  // Micro-batch order, as the data-parallel reduce chain: ((g0 + g1) + g2) ...
  if (current_.micro_batch == 0) {
    std::memcpy(acc, m.data, m.bytes);
    accumulator_step_[slot] = current_.step;
    accumulated_count_[slot] = 0;
  } else {
    comm::add_into(type_, acc, m.data, gradient_count_);
  }
  if (++accumulated_count_[slot] == settings_.schedule.micro_batches && settings_.schedule.micro_batches > 1)
    to_average(type_, acc, gradient_count_, settings_.schedule.micro_batches);
  accumulated_ = true;
}

void StageRuntime::average(DLTensor *out, void *stream) const {
  throw_if_failed();
  if (!started_ || done_ || current_.update_step < 0)
    invalid("out: the current action (", kind_name(current_.kind), ", ", where(),
            ") carries no update; the average is there only while update_step >= 0");
  const comm::Message m = comm::check_message(out, "out");
  check_memory(m, "out");
  const int bits = type_ == comm::SumType::f32 ? 32 : 64;
  if (m.dtype.code != kDLFloat || m.dtype.bits != bits || m.count != gradient_count_)
    invalid("out: ", m.count, " elements of dtype ", dtype_text(m.dtype), "; expected ", gradient_count_,
            " elements of float", bits, " (as the gradients)");
  const std::size_t slot = std::size_t(current_.update_step % 2);
  if (device_)
    device_->average(int(slot), m.data, gradient_bytes_, stream);
  else
    std::memcpy(m.data, accumulator_[slot].data(), gradient_bytes_);
}

std::int64_t StageRuntime::stats(std::int64_t first, std::int64_t count,
                                 const StructArrayOut<flatmem_cyclic_stages_time_step_stats> &out) const {
  return accounting_.copy(first, count, out);
}

flatmem_cyclic_stages_summary StageRuntime::summary() const { return accounting_.summary(Clock::now()); }

}  // namespace flatmem::cyclic::stages
