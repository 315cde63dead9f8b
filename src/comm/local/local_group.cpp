#include "comm/local/local_group.hpp"

#include <chrono>
#include <cstring>
#include <sstream>

#include "core/error.hpp"

namespace flatmem::comm::local {
namespace {

using State = LocalTransfer::State;
using Clock = std::chrono::steady_clock;

std::string tag_text(Space space, std::uint64_t tag) {
  std::ostringstream s;
  if (space == Space::internal)
    s << "internal tag 0x" << std::hex << tag;
  else if (space == Space::cyclic)
    s << "cyclic tag 0x" << std::hex << tag;
  else
    s << "tag " << tag;
  return s.str();
}

// "receive of 200 bytes from rank 1 with tag 5"
std::string describe(const LocalTransfer &t) {
  std::ostringstream s;
  s << (t.is_send ? "send of " : "receive of ") << t.bytes << " bytes "
    << (t.is_send ? "to" : "from") << " rank " << t.peer << " with " << tag_text(t.space, t.tag);
  return s.str();
}

bool finished(State s) { return s == State::done || s == State::failed || s == State::cancelled; }

}  // namespace

LocalGroup::LocalGroup(int size, Milliseconds default_timeout)
    : size_(size), default_timeout_(default_timeout), departed_(std::size_t(size), false) {}

std::shared_ptr<LocalTransfer> LocalGroup::post(int rank, bool is_send, int peer,
                                                const void *source, void *destination,
                                                std::size_t bytes, Space space,
                                                std::uint64_t tag) {
  auto t = std::make_shared<LocalTransfer>();
  t->is_send = is_send;
  t->rank = rank;
  t->peer = peer;
  t->space = space;
  t->tag = tag;
  t->source = source;
  t->destination = destination;
  t->bytes = bytes;

  std::unique_lock lock(mutex_);
  if (poisoned_) {
    const auto [status, message] = failure_seen_by(rank);
    fail(FLATMEM_STATUS_COMM_POISONED, "communicator poisoned by an earlier error: ", message);
  }
  const Key key = is_send ? Key{rank, peer, space, tag} : Key{peer, rank, space, tag};
  Mailbox &box = mailboxes_[key];
  auto &partners = is_send ? box.receives : box.sends;
  if (partners.empty()) {
    (is_send ? box.sends : box.receives).push_back(t);
    return t;
  }
  const std::shared_ptr<LocalTransfer> partner = partners.front();
  partners.pop_front();
  if (box.sends.empty() && box.receives.empty()) mailboxes_.erase(key);
  copy_pair(lock, is_send ? *t : *partner, is_send ? *partner : *t);
  return t;
}

// Called with the lock held; copies with it released.
void LocalGroup::copy_pair(std::unique_lock<std::mutex> &lock, LocalTransfer &send,
                           LocalTransfer &receive) {
  if (send.bytes != receive.bytes) {
    std::ostringstream text;
    text << "rank " << send.rank << " sent " << send.bytes << " bytes with "
         << tag_text(send.space, send.tag) << ", this receive expects " << receive.bytes;
    receive.failure = text.str();
    receive.state = State::failed;
    send.state = State::done;  // delivered; the receiver reports the mismatch
    changed_.notify_all();
    return;
  }
  send.state = receive.state = State::copying;
  ++copies_in_flight_;
  lock.unlock();
  if (send.bytes != 0 && receive.destination != send.source)
    std::memcpy(receive.destination, send.source, send.bytes);
  lock.lock();
  send.state = receive.state = State::done;
  --copies_in_flight_;
  changed_.notify_all();
}

void LocalGroup::wait(int rank, LocalTransfer &t, Milliseconds timeout, const std::string &what) {
  const auto deadline = Clock::now() + timeout;
  std::unique_lock lock(mutex_);
  for (;;) {
    if (t.state == State::done) return;
    if (t.state == State::failed) invalid(what, ": ", t.failure);
    if (poisoned_ || t.state == State::cancelled) {
      wait_for_copies(lock);
      const auto [status, message] = failure_seen_by(rank);
      if (rank == poison_origin_)
        fail(FLATMEM_STATUS_COMM_POISONED, what, ": communicator poisoned by an earlier error: ",
             message);
      fail(status, what, ": ", message);
    }
    if (t.state == State::copying) {  // finishes without blocking on anyone
      changed_.wait(lock);
      continue;
    }
    if (departed_[std::size_t(t.peer)] && t.peer != rank) {
      std::ostringstream text;
      text << what << ": rank " << t.peer << " left the group (its communicator was destroyed) "
           << "before the " << describe(t) << " completed";
      poison_locked(rank, FLATMEM_STATUS_PEER_FAILURE, text.str());
      wait_for_copies(lock);
      fail(FLATMEM_STATUS_PEER_FAILURE, text.str());
    }
    if (Clock::now() >= deadline) {
      std::ostringstream text;
      text << what << ": timed out after " << timeout.count() << " ms waiting for rank " << t.peer
           << " (" << describe(t) << ")";
      poison_locked(rank, FLATMEM_STATUS_TIMEOUT, text.str());
      wait_for_copies(lock);
      fail(FLATMEM_STATUS_TIMEOUT, text.str());
    }
    changed_.wait_until(lock, deadline);
  }
}

bool LocalGroup::test(const LocalTransfer &t) const {
  std::lock_guard lock(mutex_);
  return finished(t.state) || poisoned_;
}

void LocalGroup::poison(int origin, flatmem_status status, const std::string &message) {
  std::unique_lock lock(mutex_);
  poison_locked(origin, status, message);
  wait_for_copies(lock);
}

void LocalGroup::poison_locked(int origin, flatmem_status status, const std::string &message) {
  if (poisoned_) return;  // the first reason wins
  poisoned_ = true;
  poison_origin_ = origin;
  poison_status_ = status;
  poison_message_ = message;
  cancel_pending_locked(-1);
  changed_.notify_all();
}

void LocalGroup::cancel_pending_locked(int rank) {
  for (auto it = mailboxes_.begin(); it != mailboxes_.end();) {
    for (auto *queue : {&it->second.sends, &it->second.receives})
      for (auto q = queue->begin(); q != queue->end();) {
        if (rank < 0 || (*q)->rank == rank) {
          (*q)->state = State::cancelled;
          q = queue->erase(q);
        } else {
          ++q;
        }
      }
    it = it->second.sends.empty() && it->second.receives.empty() ? mailboxes_.erase(it)
                                                                 : std::next(it);
  }
}

void LocalGroup::wait_for_copies(std::unique_lock<std::mutex> &lock) {
  changed_.wait(lock, [&] { return copies_in_flight_ == 0; });
}

std::pair<flatmem_status, std::string> LocalGroup::failure_seen_by(int rank) const {
  if (rank == poison_origin_) return {poison_status_, poison_message_};
  return {FLATMEM_STATUS_PEER_FAILURE,
          "rank " + std::to_string(poison_origin_) + " aborted: " + poison_message_};
}

void LocalGroup::check_healthy(int rank) const {
  std::lock_guard lock(mutex_);
  if (!poisoned_) return;
  fail(FLATMEM_STATUS_COMM_POISONED, "communicator poisoned by an earlier error: ",
       failure_seen_by(rank).second);
}

flatmem_status LocalGroup::health(int rank, std::string *message) const {
  std::lock_guard lock(mutex_);
  if (!poisoned_) {
    if (message) message->clear();
    return FLATMEM_STATUS_SUCCESS;
  }
  const auto [status, text] = failure_seen_by(rank);
  if (message) *message = text;
  return status;
}

void LocalGroup::leave(int rank) {
  std::unique_lock lock(mutex_);
  departed_[std::size_t(rank)] = true;
  cancel_pending_locked(rank);
  changed_.notify_all();
  wait_for_copies(lock);  // a peer may be copying into this rank's buffers
}

}  // namespace flatmem::comm::local
