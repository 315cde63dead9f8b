// The shared state of an in-process communicator group (flatmem_comm_create_local):
// one mailbox per (source, destination, tag space, tag) holding the posted
// sends and receives in FIFO order, the group's poison state, and the one
// condition variable every wait sleeps on.
//
// Transfers are rendezvous-by-copy: a send completes when a matching receive
// exists and the sender's bytes have been copied into it (the thread that
// posts the second half of a pair does the copy, outside the lock). A
// wrongly ordered program therefore deadlocks into a timeout, as over a real
// transport, instead of passing through an eager buffer.
//
// Poisoning: the first failure (a timeout, an abort, a rank that left while a
// peer waited on it) wins; pending transfers are cancelled and, before any
// failing call returns, copies already in flight are allowed to finish, so no
// caller buffer is written after a failing call returned.
#pragma once

#include <flatmem/flatmem.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "comm/communicator.hpp"

namespace flatmem::comm::local {

class LocalTransfer final : public Transfer {
 public:
  enum class State { posted, copying, done, failed, cancelled };

  bool is_send = false;
  int rank = 0, peer = 0;  // the posting rank and the other end
  Space space = Space::user;
  std::uint64_t tag = 0;
  const void *source = nullptr;  // sends
  void *destination = nullptr;   // receives
  std::size_t bytes = 0;
  // Guarded by the group's mutex.
  State state = State::posted;
  std::string failure;  // a receive of the wrong size (INVALID_ARGUMENT)
};

class LocalGroup {
 public:
  LocalGroup(int size, Milliseconds default_timeout);

  int size() const { return size_; }
  Milliseconds default_timeout() const { return default_timeout_; }

  std::shared_ptr<LocalTransfer> post(int rank, bool is_send, int peer, const void *source,
                                      void *destination, std::size_t bytes, Space space,
                                      std::uint64_t tag);
  // Throws as Communicator::wait documents; `rank` is the waiting rank.
  void wait(int rank, LocalTransfer &transfer, Milliseconds timeout, const std::string &what);
  bool test(const LocalTransfer &transfer) const;

  void poison(int origin, flatmem_status status, const std::string &message);
  void check_healthy(int rank) const;
  flatmem_status health(int rank, std::string *message) const;
  // `rank`'s communicator is destroyed: its pending transfers are cancelled;
  // peers waiting on it fail with PEER_FAILURE.
  void leave(int rank);

 private:
  using Key = std::tuple<int, int, Space, std::uint64_t>;  // source, destination, space, tag
  struct Mailbox {
    std::deque<std::shared_ptr<LocalTransfer>> sends, receives;
  };

  void copy_pair(std::unique_lock<std::mutex> &lock, LocalTransfer &send, LocalTransfer &receive);
  void poison_locked(int origin, flatmem_status status, const std::string &message);
  void cancel_pending_locked(int rank);  // rank < 0: every rank
  void wait_for_copies(std::unique_lock<std::mutex> &lock);
  // What `rank` sees of the poison: the origin's own status and text, or
  // PEER_FAILURE "rank o aborted: ..." for the others.
  std::pair<flatmem_status, std::string> failure_seen_by(int rank) const;

  const int size_;
  const Milliseconds default_timeout_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::map<Key, Mailbox> mailboxes_;
  int copies_in_flight_ = 0;
  std::vector<bool> departed_;
  bool poisoned_ = false;
  int poison_origin_ = -1;
  flatmem_status poison_status_ = FLATMEM_STATUS_SUCCESS;
  std::string poison_message_;
};

}  // namespace flatmem::comm::local
