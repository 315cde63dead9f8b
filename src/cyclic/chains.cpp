// The two threads of a cyclic handle: the reduce chain (and SYNC's ring
// all-reduce) and the delivery chain. See runtime.hpp.
#include <algorithm>

#include "core/error.hpp"
#include "cyclic/kept.hpp"
#include "cyclic/runtime.hpp"
#include "cyclic/tags.hpp"

namespace flatmem::cyclic {
namespace {

std::string label(const char *chain, const Gradient &g) {
  return std::string("cyclic ") + chain + ", stage " + std::to_string(g.stage) + ", step " +
         std::to_string(g.step);
}

}  // namespace

void Runtime::sent(std::size_t bytes, std::int64_t scheduled) {
  std::lock_guard lock(mutex_);
  accounting_.sent(std::int64_t(bytes), scheduled);
}

void Runtime::waiting(Gradient &g, std::string &doing, const std::string &what) {
  std::lock_guard lock(mutex_);
  g.stuck_on = what;
  doing = "stage " + std::to_string(g.stage) + ", step " + std::to_string(g.step) + ", waiting for " + what;
}

std::string Runtime::stuck_on(const Gradient &g) const {
  if (!g.stuck_on.empty()) return g.stuck_on;
  if (!g.reduced)
    return "its turn in the reduce chain" +
           (reducer_doing_.empty() ? std::string() : ", which is at " + reducer_doing_);
  return "its turn in the delivery chain" +
         (deliverer_doing_.empty() ? std::string() : ", which is at " + deliverer_doing_);
}

void Runtime::prepare(ChainIo &io, Gradient &g) {
  // Device gradients are scanned here, on the chain's stream (host ones at hand-over).
  const std::int64_t bad = io.prepare(g, settings_.scan_nonfinite && g.ready != nullptr);
  if (bad < 0) return;
  const std::string message = nonfinite_message(g.stage, g.step, bad);
  comm_.poison(FLATMEM_STATUS_NON_FINITE, message);  // the chain cannot go on without us
  throw Error(FLATMEM_STATUS_NON_FINITE, message);
}

void Runtime::reduce_link(Gradient &g) {
  const std::string what = label("reduce chain", g);
  ChainIo &io = *reduce_io_;
  prepare(io, g);
  if (rank_ > 0) {
    const std::string from = "the partial sum from rank " + std::to_string(rank_ - 1);
    waiting(g, reducer_doing_, from);
    io.receive_add(g, rank_ - 1, link_tag(id_, Link::partial, g.step, g.stage), what + ": receive " + from);
  }
  if (rank_ + 1 < world_) {
    waiting(g, reducer_doing_, "rank " + std::to_string(rank_ + 1) + " to take the partial sum");
    sent(g.bytes, g.handed_over_at);
    const ChainIo::Transfer t{true, rank_ + 1, g.data, g.bytes, link_tag(id_, Link::partial, g.step, g.stage),
                              what + ": send the partial sum to rank " + std::to_string(rank_ + 1)};
    io.exchange({&t, 1});
  } else if (world_ > 1) {
    io.average(g, world_);
  }
  io.finish(what);
  std::lock_guard lock(mutex_);
  g.reduced = true;
  g.done = world_ == 1;  // a device gradient of one rank (host ones never come here)
  g.stuck_on.clear();
  reducer_doing_.clear();
  changed_.notify_all();
}

void Runtime::all_reduce_step(const std::vector<GradientPtr> &stages) {
  // Highest stage first, as the backward handed them over.
  ChainIo &io = *reduce_io_;
  for (const GradientPtr &g : stages) {
    prepare(io, *g);
    waiting(*g, reducer_doing_,
            "the ring all-reduce of the step (neighbours: ranks " +
                std::to_string((rank_ + world_ - 1) % world_) + " and " +
                std::to_string((rank_ + 1) % world_) + ")");
    const std::string what = label("all-reduce", *g);
    io.all_reduce(*g, link_tag(id_, Link::all_reduce, g->step, g->stage), what);
    // A ring step sends about 1/N of the buffer each time, 2(N-1) times.
    if (world_ > 1)
      sent(2 * std::size_t(world_ - 1) * g->bytes / std::size_t(world_), stages.back()->handed_over_at);
    io.average(*g, world_);
    io.finish(what);
    std::lock_guard lock(mutex_);
    g->reduced = g->done = true;
    reducer_doing_.clear();
    changed_.notify_all();
  }
}

int Runtime::deliver_from() const {
  if (rank_ == world_ - 1) return -1;
  if (!paced()) return rank_ + 1;
  return rank_ == 0 ? world_ - 1 : rank_ - 1;
}

int Runtime::deliver_to() const {
  if (!paced()) return rank_ > 0 ? rank_ - 1 : -1;
  if (rank_ == world_ - 1) return 0;
  return rank_ + 1 <= world_ - 2 ? rank_ + 1 : -1;
}

std::int64_t Runtime::delivery_key(const Gradient &g) {
  // Paced: the order the ranks need the averages in (step, then stage), the
  // same on every rank. At once, and the relay's scatter (whose updates come
  // in hand-over order: stage L-1 first): hand-over order, the same on every rank.
  if (paced() && !relay_) return g.step * settings_.schedule.stages + g.stage;
  return handed_over_count_++;
}

std::int64_t Runtime::release_time(const Gradient &g) const {
  // DELAY1: a rank applies the average of step s before its forward of the
  // stage in step s + 2. Pass it on one time step before the receiver needs
  // it, but no later than this rank needs it itself (its update waits for the
  // hand-on: the buffer is the caller's again only after it). Around the ring
  // the receiver is the later rank, so this is mostly the rank's own forward
  // slot: in steady state half the ranks pass averages on (forward half of
  // their step) while the other half send partial sums (backward half).
  const Schedule &s = settings_.schedule;
  const std::int64_t due = (g.step + 2) * s.period() + g.stage;
  return std::min(s.offset(deliver_to()) + due - 1, s.offset(rank_) + due);
}

void Runtime::scatter_link(Gradient &g) {
  const std::string what = label("gradient scatter", g);
  const RelayPlan &plan = relay_->plan();  // immutable: safe from this thread
  const std::size_t element = g.bytes / g.count;
  const int last = world_ - 1;
  const std::uint64_t tag = relay_tag(id_, RelayLink::gradient, g.step, g.stage);
  std::vector<ChainIo::Transfer> transfers;
  if (rank_ == last) {
    for (int k = 0; k < last; ++k) {
      const auto [begin, end] = plan.shard(g.stage, k);
      if (end == begin) continue;
      const std::size_t n = std::size_t(end - begin) * element;
      transfers.push_back({true, k, g.data + std::size_t(begin) * element, n, tag,
                           what + ": send shard " + std::to_string(k) + " of the average to rank " + std::to_string(k)});
      sent(n, g.handed_over_at);
    }
    waiting(g, deliverer_doing_, "the owners to take their shards of the average");
  } else if (const auto [begin, end] = plan.shard(g.stage, rank_); end > begin) {
    const std::string from = "shard " + std::to_string(rank_) + " of the average from rank " + std::to_string(last);
    transfers.push_back({false, last, g.data + std::size_t(begin) * element, std::size_t(end - begin) * element, tag,
                         what + ": receive " + from});
    waiting(g, deliverer_doing_, from);
  }
  deliver_io_->exchange(transfers);
  deliver_io_->finish(what);
  std::lock_guard lock(mutex_);
  g.done = true;
  g.stuck_on.clear();
  deliverer_doing_.clear();
  changed_.notify_all();
}

void Runtime::deliver_link(Gradient &g) {
  if (relay_) return scatter_link(g);
  const std::string what = label("delivery chain", g);
  ChainIo &io = *deliver_io_;
  const int from = deliver_from(), to = deliver_to();
  if (from >= 0) {
    waiting(g, deliverer_doing_, "the average from rank " + std::to_string(from));
    const ChainIo::Transfer t{false, from, g.data, g.bytes, link_tag(id_, Link::average, g.step, g.stage),
                              what + ": receive the average from rank " + std::to_string(from)};
    io.exchange({&t, 1});
  }
  if (to >= 0) {
    if (paced()) {
      const std::int64_t release = release_time(g);
      std::unique_lock lock(mutex_);
      g.stuck_on = "this rank's clock to reach time step " + std::to_string(release);
      changed_.wait(lock, [&] {
        return time_step_ >= release || stopping_ || failure_ != FLATMEM_STATUS_SUCCESS;
      });
      if (stopping_ || failure_ != FLATMEM_STATUS_SUCCESS) return;
    }
    waiting(g, deliverer_doing_, "rank " + std::to_string(to) + " to take the average");
    const Schedule &s = settings_.schedule;
    sent(g.bytes, paced() ? release_time(g)
                          : s.offset(world_ - 1) + (g.step + 1) * s.period() - 1 - g.stage);
    const ChainIo::Transfer t{true, to, g.data, g.bytes, link_tag(id_, Link::average, g.step, g.stage),
                              what + ": send the average to rank " + std::to_string(to)};
    io.exchange({&t, 1});
  }
  io.finish(what);
  std::lock_guard lock(mutex_);
  g.done = true;
  g.stuck_on.clear();
  deliverer_doing_.clear();
  changed_.notify_all();
}

void Runtime::reducer_loop() {
  for (;;) {
    GradientPtr job;
    std::vector<GradientPtr> step;
    {
      std::unique_lock lock(mutex_);
      changed_.wait(lock, [&] {
        return stopping_ || failure_ != FLATMEM_STATUS_SUCCESS || !reduce_queue_.empty() ||
               !sync_queue_.empty();
      });
      if (stopping_ || failure_ != FLATMEM_STATUS_SUCCESS) return;
      if (!reduce_queue_.empty()) {
        job = reduce_queue_.front();
        reduce_queue_.pop_front();
      } else {
        step = std::move(sync_queue_.front());
        sync_queue_.pop_front();
      }
    }
    try {
      if (job)
        reduce_link(*job);
      else
        all_reduce_step(step);
    } catch (const Error &e) {
      std::lock_guard lock(mutex_);
      record_failure(e.status(), e.what());
      return;
    }
  }
}

void Runtime::deliverer_loop() {
  for (;;) {
    GradientPtr job;
    {
      std::unique_lock lock(mutex_);
      changed_.wait(lock, [&] {
        if (stopping_ || failure_ != FLATMEM_STATUS_SUCCESS) return true;
        const auto it = deliver_pending_.find(deliver_next_);
        return it != deliver_pending_.end() && it->second->reduced;
      });
      if (stopping_ || failure_ != FLATMEM_STATUS_SUCCESS) return;
      const auto it = deliver_pending_.find(deliver_next_++);
      job = it->second;
      deliver_pending_.erase(it);
    }
    try {
      deliver_link(*job);
    } catch (const Error &e) {
      std::lock_guard lock(mutex_);
      record_failure(e.status(), e.what());
      return;
    }
  }
}

}  // namespace flatmem::cyclic
