#include "cyclic/relay.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <new>

#include "comm/message.hpp"
#include "core/error.hpp"
#include "core/tensor.hpp"
#include "cyclic/chain_io.hpp"
#include "cyclic/tags.hpp"

namespace flatmem::cyclic {
namespace {

using Clock = std::chrono::steady_clock;

RelayLink full_link(const RelayItem &item) { return item.forward ? RelayLink::forward : RelayLink::backward; }
RelayLink shard_link(const RelayItem &item) {
  return item.forward ? RelayLink::shard_forward : RelayLink::shard_backward;
}

// Shard copies an owner keeps in flight to rank 0 (normally 1 or 2: the
// gathers of the next two time steps).
constexpr std::size_t max_copies = 3;

// What remains of a deadline, at least 1 ms (a wait of 0 would not test).
comm::Milliseconds left(Clock::time_point deadline) {
  const auto ms = std::chrono::duration_cast<comm::Milliseconds>(deadline - Clock::now());
  return std::max(ms, comm::Milliseconds(1));
}

}  // namespace

Relay::Relay(comm::Communicator &comm, RelayPlan plan, std::uint32_t id, comm::Milliseconds timeout,
             std::function<void(std::int64_t)> account_sent, std::function<void(std::int64_t)> account_held,
             bool device)
    : comm_(comm), plan_(std::move(plan)), id_(id), timeout_(timeout),
      account_sent_(std::move(account_sent)), account_held_(std::move(account_held)),
      rank_(comm.rank()), world_(comm.size()),
      shards_(std::size_t(plan_.schedule.stages), nullptr),
      registered_(std::size_t(plan_.schedule.stages), false) {
  if (device) {
    device_shards_.resize(std::size_t(plan_.schedule.stages));
    links_ = relay_links(comm_, plan_, timeout_, account_sent_);  // collective
  }
}

void Relay::check_memory(const comm::Message &m, const char *name) const {
  const bool device = links_ != nullptr;
  if (m.device.device_type != (device ? kDLCUDA : kDLCPU))
    invalid(name, ": device type ", int(m.device.device_type), "; options.memory = ", device ? "CUDA" : "HOST",
            " takes ", device ? "kDLCUDA" : "kDLCPU", " tensors");
  if (!device) return;
  if (m.device.device_id != links_->device())
    invalid(name, ": on CUDA device ", m.device.device_id, "; the communicator's device transport is on device ",
            links_->device());
  if (m.bytes > 0) check_device_memory(m.data, links_->device(), name);
}

std::string Relay::label(const RelayItem &item) const {
  return "cyclic parameter relay, stage " + std::to_string(item.stage) + ", step " +
         std::to_string(item.step) + (item.forward ? " (FORWARD)" : " (BACKWARD)");
}

std::int64_t Relay::shard_bytes() const {
  std::int64_t total = 0;
  for (std::int32_t j = 0; j < plan_.schedule.stages; ++j) {
    const auto [begin, end] = plan_.shard(j, rank_);
    total += (end - begin) * std::int64_t(element_);
  }
  return total;
}

void Relay::set_shard(std::int32_t stage, const DLTensor *shard, void *stream) {
  if (stage < 0 || stage >= plan_.schedule.stages)
    invalid("stage: ", stage, "; expected 0 .. ", plan_.schedule.stages - 1);
  const comm::Message m = comm::check_message(shard, "shard");
  check_memory(m, "shard");
  const bool f32 = m.dtype.code == kDLFloat && m.dtype.bits == 32;
  const bool f64 = m.dtype.code == kDLFloat && m.dtype.bits == 64;
  if (!f32 && !f64) invalid("shard: dtype ", dtype_text(m.dtype), "; expected float32 or float64");
  const std::size_t element = m.dtype.bits / 8;
  if (element_ != 0 && element != element_)
    invalid("shard: ", int(m.dtype.bits), "-bit floats, but the shards registered before are ", 8 * element_,
            "-bit; every stage's shard (and gradient, and full stage) has one dtype");
  const auto [begin, end] = plan_.shard(stage, rank_);
  if (std::int64_t(m.count) != end - begin)
    invalid("shard: ", m.count, " elements, but rank ", rank_, " owns elements [", begin, ", ", end,
            ") of stage ", stage, " (", end - begin, "; n = ", plan_.count[std::size_t(stage)],
            ", ceil(n / ", world_, ") per rank)");
  if (reinterpret_cast<std::uintptr_t>(m.data) % element != 0)
    invalid("shard: data + byte_offset is not aligned to the ", element, "-byte element size");
  if (element_ == 0 && !links_) {
    // The staging (K full stages of the largest one) is allocated here, once: on failure
    // OUT_OF_MEMORY and nothing changes (a later call tries again). A probe without
    // exceptions first, so that a size the system cannot back fails cleanly under the
    // sanitizers too (their throwing operator new aborts instead of throwing).
    const std::size_t buffers = std::size_t(plan_.staging_buffers());
    const std::size_t each = std::size_t(plan_.largest()) * element;
    const auto out_of_memory = [&] {
      fail(FLATMEM_STATUS_OUT_OF_MEMORY, "shard: the relay's staging, ", buffers, " buffers of ", each,
           " bytes (the largest stage of options.parameter_count), could not be allocated");
    };
    if (each != 0 && std::unique_ptr<char[]>(new (std::nothrow) char[buffers * each]) == nullptr) out_of_memory();
    std::vector<Slot> slots(buffers);
    try {
      for (Slot &s : slots) s.data.resize(each);
    } catch (const std::bad_alloc &) {
      out_of_memory();
    }
    slots_ = std::move(slots);
  }
  if (links_) check_device_stream(stream, links_->device(), "stream");
  element_ = element;
  shards_[std::size_t(stage)] = m.data;
  if (links_) device_shards_[std::size_t(stage)] = DeviceShard{m.data, stream};
  registered_[std::size_t(stage)] = true;
}

void Relay::check_registered() const {
  for (std::size_t j = 0; j < registered_.size(); ++j)
    if (!registered_[j])
      invalid("flatmem_cyclic_next: stage ", j, " has no shard; a relayed handle needs "
              "flatmem_cyclic_set_shard for every stage before its first time step");
}

comm::TransferPtr Relay::send(int peer, const char *data, std::size_t n, std::uint64_t tag) {
  comm::TransferPtr t = comm_.send(peer, data, n, comm::Space::cyclic, tag);
  account_sent_(std::int64_t(n));
  return t;
}

Relay::Slot *Relay::find(std::int64_t tau) {
  for (Slot &s : slots_)
    if (s.used && s.item.time == tau && !s.send) return &s;
  return nullptr;
}

void Relay::reap() {
  for (Slot &s : slots_)
    if (s.used && s.send && comm_.test(s.send)) {
      // Completion with an error is thrown by the wait (and poisons).
      comm_.wait_all({s.send}, timeout_, label(s.item) + ": send on to rank " + std::to_string(rank_ + 1));
      s.used = false;
      s.send.reset();
    }
  while (!copies_.empty() && comm_.test(copies_.front().send)) {
    comm_.wait_all({copies_.front().send}, timeout_, copies_.front().what);
    copies_.pop_front();
  }
}

Relay::Slot *Relay::free_slot(bool wait) {
  for (Slot &s : slots_)
    if (!s.used) return &s;
  if (!wait) return nullptr;
  // Every slot waits for rank + 1 to take its relay: wait for the oldest.
  Slot *oldest = nullptr;
  for (Slot &s : slots_)
    if (s.send && (oldest == nullptr || s.item.time < oldest->item.time)) oldest = &s;
  if (oldest == nullptr) fail(FLATMEM_STATUS_INTERNAL, "cyclic parameter relay: no staging slot is free or being sent");
  comm_.wait_all({oldest->send}, timeout_,
                 label(oldest->item) + ": rank " + std::to_string(rank_ + 1) + " to take the relay (all " +
                     std::to_string(slots_.size()) + " staging buffers wait for it)");
  oldest->send.reset();
  oldest->used = false;
  return oldest;
}

void Relay::post(const RelayItem &item, Slot &slot) {
  slot.used = true;
  slot.item = item;
  slot.receives.clear();
  slot.from.clear();
  const std::size_t e = element_;
  if (rank_ > 0) {
    slot.receives.push_back(comm_.recv(rank_ - 1, slot.data.data(), bytes(item.stage), comm::Space::cyclic,
                                       relay_tag(id_, full_link(item), item.step, item.stage)));
    slot.from.push_back(rank_ - 1);
    return;
  }
  for (std::int32_t k = 1; k < world_; ++k) {
    const auto [begin, end] = plan_.shard(item.stage, k);
    if (end == begin) continue;
    slot.receives.push_back(comm_.recv(k, slot.data.data() + std::size_t(begin) * e, std::size_t(end - begin) * e,
                                       comm::Space::cyclic, relay_tag(id_, shard_link(item), item.step, item.stage)));
    slot.from.push_back(k);
  }
}

void Relay::contribute(const RelayItem &gather) {
  const auto [begin, end] = plan_.shard(gather.stage, rank_);
  if (end == begin) return;
  const std::size_t n = std::size_t(end - begin) * element_;
  if (rank_ == 0) {  // into the gather's own slot (posted in this next())
    Slot *slot = find(gather.time);
    if (slot == nullptr) fail(FLATMEM_STATUS_INTERNAL, label(gather), ": rank 0's gather was not posted");
    std::memcpy(slot->data.data() + std::size_t(begin) * element_, shards_[std::size_t(gather.stage)], n);
    return;
  }
  // At most max_copies shard copies wait for rank 0 (it takes them one
  // time step before each gather): a rank ahead of rank 0 waits here.
  if (copies_.size() >= max_copies) {
    comm_.wait_all({copies_.front().send}, timeout_, copies_.front().what + " (" +
                                                         std::to_string(max_copies) + " copies in flight)");
    copies_.pop_front();
  }
  ShardCopy &c = copies_.emplace_back();
  c.data.assign(shards_[std::size_t(gather.stage)], shards_[std::size_t(gather.stage)] + n);
  c.what = label(gather) + ": send shard " + std::to_string(rank_) + " to rank 0";
  c.send = send(0, c.data.data(), n, relay_tag(id_, shard_link(gather), gather.step, gather.stage));
}

void Relay::report_held() {
  std::int64_t held = shard_bytes();
  if (links_) {  // by the protocol: the device staging is not tracked slot by slot
    const std::int64_t tau = std::max<std::int64_t>(posted_through_, 0);
    account_held_(held + plan_.staged_elements(rank_, tau) * std::int64_t(element_));
    return;
  }
  for (const Slot &s : slots_)
    if (s.used) held += std::int64_t(bytes(s.item.stage));
  for (const ShardCopy &c : copies_) held += std::int64_t(c.data.size());
  account_held_(held);
}

void Relay::advance(std::int64_t tau) {
  if (links_) {
    links_->advance(tau, device_shards_, element_);
    posted_through_ = tau;
    report_held();
    return;
  }
  reap();
  // This rank's relays of tau (must be posted now) and tau + 1 (if a slot is free).
  for (std::int64_t t = posted_through_ + 1; t <= tau + 1; ++t) {
    if (const auto item = plan_.item(rank_, t)) {
      Slot *slot = free_slot(t <= tau);
      if (slot == nullptr) break;
      post(*item, *slot);
    }
    posted_through_ = t;
  }
  // Shards for rank 0's gathers: rank 0 copies its own at the gather's time
  // step, the owners send when the version they hold is the gather's.
  for (std::int64_t g = contributed_through_ + 1; g <= tau + 1; ++g) {
    if (const auto gather = plan_.item(0, g)) {
      const std::int64_t when = rank_ == 0 ? g : plan_.contribution_time(*gather);
      if (when > tau) break;
      if (plan_.version_held(gather->stage, tau) != gather->version())
        fail(FLATMEM_STATUS_INTERNAL, label(*gather), ": rank ", rank_, " holds version ",
             plan_.version_held(gather->stage, tau), " at time step ", tau, ", the gather needs ",
             gather->version());
      contribute(*gather);
    }
    contributed_through_ = g;
  }
  report_held();
}

void Relay::parameters(const flatmem_cyclic_action &current, const DLTensor *full, void *stream) {
  if (current.kind != FLATMEM_CYCLIC_FORWARD && current.kind != FLATMEM_CYCLIC_BACKWARD)
    invalid("flatmem_cyclic_parameters: the current time step (", current.time_step,
            ") is not a FORWARD or BACKWARD; the stage parameters are relayed for those only");
  if (served(current.time_step))
    invalid("flatmem_cyclic_parameters: already called for this time step (", current.time_step,
            "); the relay has moved on: keep the copy");
  const comm::Message m = comm::check_message(full, "full");
  check_memory(m, "full");
  if (m.dtype.code != kDLFloat || m.dtype.bits != 8 * element_)
    invalid("full: dtype ", dtype_text(m.dtype), "; the shards are float", 8 * element_);
  const std::int64_t n = plan_.count[std::size_t(current.stage)];
  if (std::int64_t(m.count) != n)
    invalid("full: ", m.count, " elements; stage ", current.stage, " has ", n, " (options.parameter_count)");
  if (links_) {
    check_device_stream(stream, links_->device(), "stream");
    const auto item = plan_.item(rank_, current.time_step);
    if (!item) fail(FLATMEM_STATUS_INTERNAL, "cyclic parameter relay: no relay at time step ", current.time_step);
    try {
      links_->take(current.time_step, m.data, bytes(item->stage), stream, timeout_);
    } catch (const Error &e) {
      throw Error(e.status(), label(*item) + ": " + e.what());  // the message names the peers
    }
    served_through_ = current.time_step;
    report_held();
    return;
  }
  Slot *slot = find(current.time_step);
  if (slot == nullptr)
    fail(FLATMEM_STATUS_INTERNAL, "cyclic parameter relay: no relay posted for time step ", current.time_step);
  const RelayItem item = slot->item;
  const auto deadline = Clock::now() + timeout_;
  for (std::size_t i = 0; i < slot->receives.size(); ++i)
    comm_.wait_all({slot->receives[i]}, left(deadline),
                   label(item) + ", from rank " + std::to_string(slot->from[i]));
  slot->receives.clear();
  std::memcpy(m.data, slot->data.data(), bytes(item.stage));
  served_through_ = current.time_step;
  if (rank_ + 1 < world_)
    slot->send = send(rank_ + 1, slot->data.data(), bytes(item.stage),
                      relay_tag(id_, full_link(item), item.step, item.stage));
  else
    slot->used = false;
  report_held();
}

void Relay::finish() {
  if (links_) return links_->finish(timeout_);
  const auto deadline = Clock::now() + timeout_;
  for (Slot &s : slots_)
    if (s.send) {
      comm_.wait_all({s.send}, left(deadline), label(s.item) + ": rank " + std::to_string(rank_ + 1) +
                                                    " to take the last relays (before DONE)");
      s.send.reset();
      s.used = false;
    }
  for (ShardCopy &c : copies_) comm_.wait_all({c.send}, left(deadline), c.what + " (before DONE)");
  copies_.clear();
}

bool Relay::busy() {
  // Device: the destructor's clock test covers it (before DONE the peers need us).
  for (Slot &s : slots_) {
    for (const auto &t : s.receives)
      if (!comm_.test(t)) return true;
    if (s.send && !comm_.test(s.send)) return true;
  }
  for (ShardCopy &c : copies_)
    if (!comm_.test(c.send)) return true;
  return false;
}

void Relay::abandon() {
  const auto wait = [&](const comm::TransferPtr &t) {
    try {
      comm_.wait(t, comm::Milliseconds(2000), "cyclic parameter relay: abandoned at destroy");
    } catch (const Error &) {
    }
  };
  for (Slot &s : slots_) {
    for (const auto &t : s.receives) wait(t);
    if (s.send) wait(s.send);
  }
  for (ShardCopy &c : copies_) wait(c.send);
}

}  // namespace flatmem::cyclic
