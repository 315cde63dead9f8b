#include "cyclic/runtime.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "comm/device_transport.hpp"
#include "comm/message.hpp"
#include "core/error.hpp"
#include "core/tensor.hpp"
#include "cyclic/kept.hpp"
#include "cyclic/tags.hpp"

namespace flatmem::cyclic {
namespace {

using Clock = std::chrono::steady_clock;

// What every rank must agree on, as exchanged at create.
struct Agreement {
  std::int64_t stages, steps, rule, world;
  std::uint64_t parameter_counts;  // FNV-1a of options.parameter_count; 0 = replicated
  std::int64_t memory;             // options.memory (0 HOST, 1 CUDA)
  std::int64_t device;             // the communicator's NCCL device, -1 = none
};

std::uint64_t fingerprint(const std::vector<std::int64_t> &counts) {
  if (counts.empty()) return 0;
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (std::int64_t c : counts) h = (h ^ std::uint64_t(c)) * 0x100000001b3ull;
  return h | 1;
}

std::string rule_name(flatmem_cyclic_rule rule) {
  switch (rule) {
    case FLATMEM_CYCLIC_SYNC: return "SYNC";
    case FLATMEM_CYCLIC_NEWEST: return "NEWEST";
    default: return "DELAY1";
  }
}

// "stage 2, step 7"
std::string where(std::int32_t stage, std::int64_t step) {
  return "stage " + std::to_string(stage) + ", step " + std::to_string(step);
}

template <typename T>
std::int64_t first_nonfinite(const char *data, std::size_t count) {
  const T *v = reinterpret_cast<const T *>(data);
  for (std::size_t i = 0; i < count; ++i)
    if (!std::isfinite(v[i])) return std::int64_t(i);
  return -1;
}

// The token's payload: static, so a send still in flight when the handle
// goes away never reads freed memory.
const char token_byte = 1;

}  // namespace

Runtime::Runtime(comm::Communicator &comm, Settings settings)
    : comm_(comm), settings_(std::move(settings)), rank_(comm.rank()), world_(comm.size()),
      accounting_(settings_.activation_bytes, settings_.history) {
  const Schedule &s = settings_.schedule;
  comm_.check_healthy();
  // Every rank must run the same schedule: one all-gather, then every rank
  // names the first one that differs from rank 0.
  const Agreement mine{s.stages, s.steps, std::int64_t(s.rule), world_, fingerprint(settings_.parameter_count),
                       settings_.device ? 1 : 0, comm_.device() ? comm_.device()->device() : -1};
  std::vector<Agreement> all(static_cast<std::size_t>(world_));
  comm_.all_gather(&mine, all.data(), sizeof mine, settings_.timeout, "cyclic create: agreement");
  for (std::int32_t r = 1; r < world_; ++r) {
    const Agreement &a = all[std::size_t(r)], &z = all[0];
    if (a.stages != z.stages || a.steps != z.steps || a.rule != z.rule)
      invalid("options: rank ", r, " has stages ", a.stages, ", steps ", a.steps, ", rule ",
              rule_name(flatmem_cyclic_rule(a.rule)), " but rank 0 has stages ", z.stages,
              ", steps ", z.steps, ", rule ", rule_name(flatmem_cyclic_rule(z.rule)),
              "; every rank must pass the same");
    if (a.parameter_counts != z.parameter_counts)
      invalid("options: rank ", r, " passes other options.parameters / parameter_count than rank 0 (",
              a.parameter_counts == 0 ? "REPLICATED" : "RELAYED", " vs ",
              z.parameter_counts == 0 ? "REPLICATED" : "RELAYED", "); every rank must pass the same");
  }
  check_memory_agreement(all, "flatmem_cyclic_create");
  id_ = std::uint32_t(comm_.next_sequence());
  // Collective for device memory: the same order on every rank.
  reduce_io_ = settings_.device ? device_chain_io(comm_, settings_.timeout) : host_chain_io(comm_);
  deliver_io_ = settings_.device ? device_chain_io(comm_, settings_.timeout) : host_chain_io(comm_);
  if (settings_.relayed())
    relay_ = std::make_unique<Relay>(
        comm_, RelayPlan{s, settings_.parameter_count}, id_, settings_.timeout,
        [this](std::int64_t bytes) {
          std::lock_guard lock(mutex_);
          accounting_.relay_sent(bytes);
        },
        [this](std::int64_t bytes) {
          std::lock_guard lock(mutex_);
          accounting_.relay_held(bytes);
        },
        settings_.device);
  if (relay_) accounting_.relay_enable();
  reducer_ = std::thread([this] { reducer_loop(); });
  deliverer_ = std::thread([this] { deliverer_loop(); });
}

Runtime::~Runtime() {
  {
    // Relayed: from the first time step until DONE the peers need this
    // rank's shards and relays, whatever is in flight at this moment.
    const bool relaying = relay_ && ((time_step_ >= 0 && time_step_ < settings_.schedule.length()) || relay_->busy());
    std::unique_lock lock(mutex_);
    if (relaying && failure_ == FLATMEM_STATUS_SUCCESS) {
      lock.unlock();
      comm_.poison(FLATMEM_STATUS_PEER_FAILURE, "cyclic handle of rank " + std::to_string(rank_) +
                                                    " destroyed before the end of a relayed run (time step " +
                                                    std::to_string(time_step_) + ")");
      lock.lock();
    }
    const bool busy = std::any_of(in_flight_.begin(), in_flight_.end(),
                                  [](const GradientPtr &g) { return !g->done; });
    if (busy && failure_ == FLATMEM_STATUS_SUCCESS) {
      const Gradient &g = **std::find_if(in_flight_.begin(), in_flight_.end(),
                                         [](const GradientPtr &p) { return !p->done; });
      lock.unlock();
      // The peers cannot finish these reductions without us: tell them, and
      // cancel our transfers so the threads return.
      comm_.poison(FLATMEM_STATUS_PEER_FAILURE,
                   "cyclic handle destroyed with reductions in flight (" + where(g.stage, g.step) + ")");
      lock.lock();
    }
    stopping_ = true;
  }
  changed_.notify_all();
  reducer_.join();
  deliverer_.join();
  if (relay_) relay_->abandon();  // completes at once unless cancelled above
}

void Runtime::record_failure(flatmem_status status, const std::string &message) {
  if (failure_ == FLATMEM_STATUS_SUCCESS) {
    // A communicator poisoned by a peer refuses the next transfer posted on it
    // with COMM_POISONED; the handle's first failure reports the cause's status
    // (PEER_FAILURE, TIMEOUT); later calls give COMM_POISONED.
    if (status == FLATMEM_STATUS_COMM_POISONED)
      if (const flatmem_status cause = comm_.health(nullptr);
          cause != FLATMEM_STATUS_SUCCESS && cause != FLATMEM_STATUS_COMM_POISONED)
        status = cause;
    failure_ = status;
    failure_message_ = message;
  }
  changed_.notify_all();
}

void Runtime::throw_if_failed(std::unique_lock<std::mutex> &) {
  if (failure_ == FLATMEM_STATUS_SUCCESS) return;
  if (!failure_reported_) {
    failure_reported_ = true;
    throw Error(failure_, failure_message_);
  }
  fail(FLATMEM_STATUS_COMM_POISONED, "cyclic handle failed earlier: ", failure_message_);
}

flatmem_cyclic_action Runtime::next() {
  const Schedule &s = settings_.schedule;
  {
    std::unique_lock lock(mutex_);
    throw_if_failed(lock);
  }
  if (current_.kind == FLATMEM_CYCLIC_BACKWARD && !handed_over_)
    invalid("flatmem_cyclic_next: the gradient of ", where(current_.stage, current_.step),
            " (time step ", current_.time_step,
            ") was not handed over; call flatmem_cyclic_reduce first");
  if (relay_ && (current_.kind == FLATMEM_CYCLIC_FORWARD || current_.kind == FLATMEM_CYCLIC_BACKWARD) &&
      !relay_->served(current_.time_step))
    invalid("flatmem_cyclic_next: the parameters of ", where(current_.stage, current_.step), " (time step ",
            current_.time_step, ") were not taken; call flatmem_cyclic_parameters before the ",
            current_.kind == FLATMEM_CYCLIC_FORWARD ? "FORWARD" : "BACKWARD",
            " (the relay goes on to the next rank from there)");
  if (relay_ && time_step_ < 0) relay_->check_registered();
  if (time_step_ + 1 >= s.length()) {
    if (relay_ && time_step_ < s.length()) relay_call([&] { relay_->finish(); });
    std::lock_guard lock(mutex_);
    time_step_ = s.length();
    current_ = s.action(rank_, time_step_);
    changed_.notify_all();
    return current_;
  }
  flatmem_cyclic_action a = s.action(rank_, time_step_ + 1);
  if (relay_) {  // the relay's update times replace the forward slots'
    const auto update = relay_->plan().update_at(a.time_step);
    a.update_stage = update ? update->first : -1;
    a.update_step = update ? update->second : -1;
  }
  const auto begun = Clock::now();
  {
    std::lock_guard lock(mutex_);
    accounting_.begin(a, begun);
    if (relay_)
      accounting_.relay_scheduled(relay_->shard_bytes() + relay_->plan().staged_elements(rank_, a.time_step) *
                                                              std::int64_t(relay_->element()));
    time_step_ = a.time_step;
    changed_.notify_all();  // paced deliveries wait for the clock
  }
  current_ = a;
  handed_over_ = false;
  if (relay_) relay_call([&] { relay_->advance(a.time_step); });
  start_token(a.time_step);
  if (a.update_stage >= 0) wait_for_update(a.update_stage, a.update_step);
  const double waited = std::chrono::duration<double>(Clock::now() - begun).count();
  std::lock_guard lock(mutex_);
  accounting_.waited(waited);
  return a;
}

void Runtime::start_token(std::int64_t time_step) {
  const Schedule &s = settings_.schedule;
  if (!s.staggered() || world_ == 1) return;
  const std::uint64_t tag = link_tag(id_, Link::token, 0, 0);
  // Wait for rank - 1 to reach our offset before our first forward...
  if (rank_ > 0 && time_step == s.offset(rank_)) {
    char received = 0;
    comm::TransferPtr t = comm_.recv(rank_ - 1, &received, 1, comm::Space::cyclic, tag);
    try {
      comm_.wait_all({t}, settings_.timeout, "cyclic start: the start token from rank " +
                                                  std::to_string(rank_ - 1) + " (time step " +
                                                  std::to_string(time_step) + ")");
    } catch (const Error &e) {
      std::lock_guard lock(mutex_);
      record_failure(e.status(), e.what());
      failure_reported_ = true;
      throw;
    }
  }
  // ...and let rank + 1 start once we reach its offset.
  if (rank_ + 1 < world_ && time_step == s.offset(rank_ + 1))
    token_out_ = comm_.send(rank_ + 1, &token_byte, 1, comm::Space::cyclic, tag);
}

void Runtime::wait_for_update(std::int32_t stage, std::int64_t step) {
  std::unique_lock lock(mutex_);
  auto it = std::find_if(in_flight_.begin(), in_flight_.end(), [&](const GradientPtr &g) {
    return g->stage == stage && g->step == step;
  });
  if (it == in_flight_.end())
    fail(FLATMEM_STATUS_INTERNAL, "cyclic: the gradient of ", where(stage, step),
         " is due but was never handed over");
  GradientPtr g = *it;
  const bool arrived = changed_.wait_for(lock, settings_.timeout, [&] {
    return g->done || failure_ != FLATMEM_STATUS_SUCCESS;
  });
  throw_if_failed(lock);
  if (!arrived) {
    std::ostringstream m;
    m << "cyclic: rank " << rank_ << ": the averaged gradient of " << where(stage, step)
      << " did not arrive within " << settings_.timeout.count() << " ms (the chain waits for "
      << stuck_on(*g) << ")";
    const std::string message = m.str();
    record_failure(FLATMEM_STATUS_TIMEOUT, message);
    failure_reported_ = true;
    lock.unlock();
    comm_.poison(FLATMEM_STATUS_TIMEOUT, message);
    throw Error(FLATMEM_STATUS_TIMEOUT, message);
  }
  in_flight_.erase(std::find(in_flight_.begin(), in_flight_.end(), g));
}

void Runtime::check_not_in_flight(const Gradient &g) const {
  for (const GradientPtr &other : in_flight_) {
    const bool disjoint = g.data + g.bytes <= other->data || other->data + other->bytes <= g.data;
    if (!disjoint)
      invalid("gradient: its memory is still in flight as the gradient of ",
              where(other->stage, other->step),
              " (until the update of that step is returned); under DELAY1 / NEWEST give each "
              "stage two buffers and alternate on the step's parity");
  }
}

std::string Runtime::nonfinite_message(std::int32_t stage, std::int64_t step, std::int64_t element) const {
  return "cyclic: rank " + std::to_string(rank_) + ": gradient of " + where(stage, step) + ": element " +
         std::to_string(element) + " is not finite (options.nonfinite = FLATMEM_NONFINITE_ERROR)";
}

void Runtime::check_memory(const DLTensor &gradient, std::int32_t device_type) const {
  const char *expected = settings_.device ? "kDLCUDA" : "kDLCPU";
  if (device_type != (settings_.device ? kDLCUDA : kDLCPU))
    invalid("gradient: device type ", device_type, "; options.memory = ", memory_name(settings_.device ? 1 : 0),
            " takes ", expected, " gradients",
            settings_.device ? "" : " (device gradients need options.memory = FLATMEM_CYCLIC_MEMORY_CUDA)");
  if (!settings_.device) return;
  const int device = comm_.device()->device();
  if (gradient.device.device_id != device)
    invalid("gradient: on CUDA device ", gradient.device.device_id, "; the communicator's device transport is on device ",
            device);
}

void Runtime::reduce(std::int32_t stage, const DLTensor *gradient, void *stream) {
  {
    std::unique_lock lock(mutex_);
    throw_if_failed(lock);
  }
  if (current_.kind != FLATMEM_CYCLIC_BACKWARD)
    invalid("stage: ", stage, "; the current time step (", time_step_,
            ") is not a BACKWARD: hand a gradient over right after its backward");
  if (stage != current_.stage)
    invalid("stage: ", stage, "; the current time step is the backward of stage ", current_.stage);
  if (handed_over_) invalid("stage: the gradient of ", where(stage, current_.step), " was already handed over");
  const comm::Message m = comm::check_message(gradient, "gradient");
  check_memory(*gradient, std::int32_t(m.device.device_type));
  const bool f32 = m.dtype.code == kDLFloat && m.dtype.bits == 32;
  const bool f64 = m.dtype.code == kDLFloat && m.dtype.bits == 64;
  if (!f32 && !f64) invalid("gradient: dtype ", dtype_text(m.dtype), "; expected float32 or float64");
  if (m.count == 0) invalid("gradient: no elements");
  if (relay_) {
    const std::int64_t n = settings_.parameter_count[std::size_t(stage)];
    if (std::int64_t(m.count) != n)
      invalid("gradient: ", m.count, " elements; stage ", stage, " has ", n, " (options.parameter_count)");
    if (m.dtype.bits / 8 != relay_->element())
      invalid("gradient: ", int(m.dtype.bits), "-bit floats; the registered shards are ", 8 * relay_->element(), "-bit");
  }
  // The scan and the chains read it as float / double.
  check_element_aligned(m.data, m.dtype.bits / 8, "gradient");

  auto g = std::make_shared<Gradient>();
  g->stage = stage;
  g->step = current_.step;
  g->handed_over_at = current_.time_step;
  g->data = m.data;
  g->count = m.count;
  g->bytes = m.bytes;
  g->type = f32 ? comm::SumType::f32 : comm::SumType::f64;

  std::unique_lock lock(mutex_);
  check_not_in_flight(*g);
  if (settings_.device) {
    // Device memory of the communicator's device, read after `stream`'s work so far.
    lock.unlock();
    g->ready = device_gradient_ready(m.data, m.bytes, comm_.device()->device(), stream);
    lock.lock();
  } else if (settings_.scan_nonfinite) {
    const std::int64_t bad = f32 ? first_nonfinite<float>(m.data, m.count)
                                 : first_nonfinite<double>(m.data, m.count);
    if (bad >= 0) {
      const std::string message = nonfinite_message(stage, g->step, bad);
      record_failure(FLATMEM_STATUS_NON_FINITE, message);
      failure_reported_ = true;
      lock.unlock();
      comm_.poison(FLATMEM_STATUS_NON_FINITE, message);
      throw Error(FLATMEM_STATUS_NON_FINITE, message);
    }
  }
  in_flight_.push_back(g);
  handed_over_ = true;
  if (settings_.schedule.rule == FLATMEM_CYCLIC_SYNC) {
    if (stage == 0) {  // the step's last backward: all-reduce every stage
      std::vector<GradientPtr> step;
      for (const GradientPtr &p : in_flight_)
        if (p->step == g->step) step.push_back(p);
      sync_queue_.push_back(std::move(step));
    }
  } else if (world_ == 1 && !settings_.device) {
    g->reduced = g->done = true;  // the average of one rank is its gradient
  } else if (world_ == 1) {
    reduce_queue_.push_back(g);  // the chain thread waits for it and scans it
  } else {
    reduce_queue_.push_back(g);
    deliver_pending_[delivery_key(*g)] = g;
  }
  changed_.notify_all();
}

template <typename F>
void Runtime::relay_call(F f) {
  try {
    f();
  } catch (const Error &e) {
    // Argument errors leave the handle usable; anything else is a failure of
    // the relay (the communicator is already poisoned by the failed wait).
    if (e.status() == FLATMEM_STATUS_INVALID_ARGUMENT || e.status() == FLATMEM_STATUS_UNSUPPORTED) throw;
    std::lock_guard lock(mutex_);
    record_failure(e.status(), e.what());  // a chain thread's earlier failure wins
    failure_reported_ = true;
    throw Error(failure_, failure_message_);
  }
}

const Relay &Runtime::relay() const {
  if (!relay_)
    invalid("handle: REPLICATED (options.parameters); the shard and relay calls need "
            "FLATMEM_CYCLIC_PARAMETERS_RELAYED");
  return *relay_;
}

void Runtime::set_shard(std::int32_t stage, const DLTensor *shard, void *stream) {
  relay();
  {
    std::unique_lock lock(mutex_);
    throw_if_failed(lock);
  }
  relay_->set_shard(stage, shard, stream);
}

void Runtime::parameters(const DLTensor *full, void *stream) {
  relay();
  {
    std::unique_lock lock(mutex_);
    throw_if_failed(lock);
  }
  if (time_step_ < 0 || time_step_ >= settings_.schedule.length())
    invalid("flatmem_cyclic_parameters: no current time step (call flatmem_cyclic_next first; after DONE there is none)");
  relay_call([&] { relay_->parameters(current_, full, stream); });
}

std::pair<std::int64_t, std::int64_t> Runtime::shard_range(std::int32_t stage, std::int32_t rank) const {
  const RelayPlan &plan = relay().plan();
  if (stage < 0 || stage >= plan.schedule.stages) invalid("stage: ", stage, "; expected 0 .. ", plan.schedule.stages - 1);
  if (rank < 0 || rank >= world_) invalid("rank: ", rank, "; expected 0 .. ", world_ - 1);
  return plan.shard(stage, rank);
}

std::int64_t Runtime::relay_stats(std::int64_t first, std::int64_t count,
                                  const StructArrayOut<flatmem_cyclic_relay_time_step> &out) const {
  relay();
  std::lock_guard lock(mutex_);
  return accounting_.copy_relay(first, count, out);
}

void Runtime::relay_summary(flatmem_cyclic_relay_summary &out) const {
  const Relay &r = relay();
  std::int64_t replica = 0;
  for (std::int64_t n : settings_.parameter_count) replica += n;
  std::lock_guard lock(mutex_);
  accounting_.relay_totals(out);
  out.shard_bytes = r.shard_bytes();
  out.replicated_bytes = replica * std::int64_t(r.element());
  out.staging_buffers = r.staging_buffers();
  out.staging_bytes = r.staging_bytes();
}

void read_parameter_options(std::int32_t mode, const std::int64_t *parameter_count, Settings &s) {
  if (mode == FLATMEM_CYCLIC_PARAMETERS_REPLICATED) return;
  if (mode != FLATMEM_CYCLIC_PARAMETERS_RELAYED)
    invalid("options.parameters: ", mode,
            "; expected FLATMEM_CYCLIC_PARAMETERS_REPLICATED (0) or FLATMEM_CYCLIC_PARAMETERS_RELAYED (1)");
  if (s.schedule.rule == FLATMEM_CYCLIC_SYNC)
    invalid("options.rule: SYNC with options.parameters = RELAYED; SYNC has no stagger, so every rank needs "
            "stage j in the same time step and the relay would run the ranks one after another: use DELAY1");
  if (s.schedule.rule == FLATMEM_CYCLIC_NEWEST)
    fail(FLATMEM_STATUS_UNSUPPORTED, "options.rule: NEWEST with options.parameters = RELAYED; under NEWEST "
         "ranks use different versions of a stage in one step, which one relayed copy cannot serve: "
         "DELAY1 only in this version");
  if (parameter_count == nullptr)
    invalid("options.parameter_count: NULL; required with options.parameters = "
            "FLATMEM_CYCLIC_PARAMETERS_RELAYED (L entries: the elements of each stage)");
  for (std::int32_t j = 0; j < s.schedule.stages; ++j) {
    const std::int64_t n = parameter_count[j];
    if (n < 1 || n > (std::int64_t(1) << 40))
      invalid("options.parameter_count[", j, "]: ", n, "; expected 1 .. 2^40");
    s.parameter_count.push_back(n);
  }
}

bool read_memory(std::int32_t memory) {
  if (memory == FLATMEM_CYCLIC_MEMORY_HOST) return false;
  if (memory != FLATMEM_CYCLIC_MEMORY_CUDA)
    invalid("options.memory: ", memory, "; expected FLATMEM_CYCLIC_MEMORY_HOST (0) or FLATMEM_CYCLIC_MEMORY_CUDA (1)");
  if (!device_chains_built())
    fail(FLATMEM_STATUS_UNSUPPORTED, "options.memory: CUDA, but this flatmem was built without NCCL "
         "(FLATMEM_WITH_NCCL): device tensors travel over NCCL");
  return true;
}

void read_memory_option(std::int32_t memory, Settings &s) {
  if (!read_memory(memory)) return;
  if (s.relayed() && s.schedule.world > 2 * std::int64_t(s.schedule.stages))
    fail(FLATMEM_STATUS_UNSUPPORTED, "options.memory: CUDA with options.parameters = RELAYED needs N <= 2L ranks "
         "(here N = ", s.schedule.world, ", L = ", s.schedule.stages, "): with N > 2L ranks in lockstep would "
         "pass a stage on within one time step, which the device relay's one group per time step cannot; use "
         "HOST memory for this shape");
  s.device = true;
}

std::int64_t Runtime::stats(std::int64_t first, std::int64_t count,
                            const StructArrayOut<flatmem_cyclic_time_step_stats> &out) const {
  std::lock_guard lock(mutex_);
  return accounting_.copy(first, count, out);
}

flatmem_cyclic_summary Runtime::summary() const {
  std::lock_guard lock(mutex_);
  return accounting_.summary(Clock::now());
}

}  // namespace flatmem::cyclic
