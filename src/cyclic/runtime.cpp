#include "cyclic/runtime.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "comm/message.hpp"
#include "core/error.hpp"
#include "cyclic/tags.hpp"

namespace flatmem::cyclic {
namespace {

using Clock = std::chrono::steady_clock;

// What every rank must agree on, as exchanged at create.
struct Agreement {
  std::int64_t stages, steps, rule, world;
};

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
  const Agreement mine{s.stages, s.steps, std::int64_t(s.rule), world_};
  std::vector<Agreement> all(static_cast<std::size_t>(world_));
  comm_.all_gather(&mine, all.data(), sizeof mine, settings_.timeout, "cyclic create: agreement");
  for (std::int32_t r = 1; r < world_; ++r) {
    const Agreement &a = all[std::size_t(r)], &z = all[0];
    if (a.stages != z.stages || a.steps != z.steps || a.rule != z.rule)
      invalid("options: rank ", r, " has stages ", a.stages, ", steps ", a.steps, ", rule ",
              rule_name(flatmem_cyclic_rule(a.rule)), " but rank 0 has stages ", z.stages,
              ", steps ", z.steps, ", rule ", rule_name(flatmem_cyclic_rule(z.rule)),
              "; every rank must pass the same");
  }
  id_ = std::uint32_t(comm_.next_sequence());
  reducer_ = std::thread([this] { reducer_loop(); });
  deliverer_ = std::thread([this] { deliverer_loop(); });
}

Runtime::~Runtime() {
  {
    std::unique_lock lock(mutex_);
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
}

void Runtime::record_failure(flatmem_status status, const std::string &message) {
  if (failure_ == FLATMEM_STATUS_SUCCESS) {
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
  if (time_step_ + 1 >= s.length()) {
    std::lock_guard lock(mutex_);
    time_step_ = s.length();
    current_ = s.action(rank_, time_step_);
    changed_.notify_all();
    return current_;
  }
  const flatmem_cyclic_action a = s.action(rank_, time_step_ + 1);
  const auto begun = Clock::now();
  {
    std::lock_guard lock(mutex_);
    accounting_.begin(a, begun);
    time_step_ = a.time_step;
    changed_.notify_all();  // paced deliveries wait for the clock
  }
  current_ = a;
  handed_over_ = false;
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

void Runtime::reduce(std::int32_t stage, const DLTensor *gradient) {
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
  if (m.device.device_type != kDLCPU)
    fail(FLATMEM_STATUS_UNSUPPORTED, "gradient: device type ", int(m.device.device_type),
         "; the cyclic runtime reduces host (kDLCPU) gradients only in this version");
  const bool f32 = m.dtype.code == kDLFloat && m.dtype.bits == 32;
  const bool f64 = m.dtype.code == kDLFloat && m.dtype.bits == 64;
  if (!f32 && !f64) invalid("gradient: dtype code ", int(m.dtype.code), " bits ", int(m.dtype.bits), "; expected float32 or float64");
  if (m.count == 0) invalid("gradient: no elements");
  // The scan and the chains read it as float / double: data + byte_offset must be aligned.
  const std::size_t element = m.dtype.bits / 8;
  if (reinterpret_cast<std::uintptr_t>(m.data) % element != 0)
    invalid("gradient: data + byte_offset (", reinterpret_cast<std::uintptr_t>(m.data), ") is not aligned to the ",
            element, "-byte element size");

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
  if (settings_.scan_nonfinite) {
    const std::int64_t bad = f32 ? first_nonfinite<float>(m.data, m.count)
                                 : first_nonfinite<double>(m.data, m.count);
    if (bad >= 0) {
      const std::string message = "cyclic: rank " + std::to_string(rank_) + ": gradient of " +
                                  where(stage, g->step) + ": element " + std::to_string(bad) +
                                  " is not finite (options.nonfinite = FLATMEM_NONFINITE_ERROR)";
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
  } else if (world_ == 1) {
    g->reduced = g->done = true;  // the average of one rank is its gradient
  } else {
    reduce_queue_.push_back(g);
    deliver_pending_[delivery_key(*g)] = g;
  }
  changed_.notify_all();
}

std::int64_t Runtime::stats(std::int64_t first, std::int64_t count,
                            flatmem_cyclic_time_step_stats *out) const {
  std::lock_guard lock(mutex_);
  return accounting_.copy(first, count, out);
}

flatmem_cyclic_summary Runtime::summary() const {
  std::lock_guard lock(mutex_);
  return accounting_.summary(Clock::now());
}

}  // namespace flatmem::cyclic
