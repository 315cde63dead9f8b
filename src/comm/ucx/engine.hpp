// One UCX context + worker, its endpoints to the other ranks, and the thread
// that progresses them. Before start() the creating thread drives the worker
// itself (the bootstrap); after start() only the progress thread touches UCX
// (other threads queue commands and wake it with ucp_worker_signal), which
// sleeps on the worker's wake-up descriptor when nothing happens.
//
// Poisoning (first reason wins): the progress thread tells the peers (abort
// notices), cancels every outstanding transfer and force-closes the
// endpoints; drain() lets the API thread wait until no transfer can touch a
// caller buffer any more.
#pragma once

#include <ucp/api/ucp.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "comm/communicator.hpp"

namespace flatmem::comm::ucx {

using Clock = std::chrono::steady_clock;

class Engine;

struct UcxTransfer : Transfer {
  Engine *engine = nullptr;
  bool is_send = true;
  int peer = 0;
  std::size_t bytes = 0;
  std::uint64_t tag = 0, mask = ~std::uint64_t(0);  // receives match (tag & mask)
  ucp_ep_h ep = nullptr;  // sends before start(); after it, the mesh endpoint of `peer`
  const void *send_data = nullptr;
  void *recv_data = nullptr;
  // Guarded by the engine's mutex once posted.
  bool done = false;
  ucs_status_t status = UCS_INPROGRESS;
  std::size_t received = 0;  // receives: the message's length
  void *request = nullptr;   // UCX request while in flight (worker thread only)
  std::string describe() const;  // "receive of 64 bytes from rank 1"
};
using UcxTransferPtr = std::shared_ptr<UcxTransfer>;

// What an endpoint's error handler needs to know.
struct EndpointInfo {
  Engine *engine = nullptr;
  int peer = -1;                  // -1: a bootstrap endpoint of unknown rank
  ucs_status_t failure = UCS_OK;  // set by the error handler
};

class Engine {
 public:
  // Context (TAG + WAKEUP features) and worker (serialized thread mode).
  Engine();
  ~Engine();
  Engine(const Engine &) = delete;
  Engine &operator=(const Engine &) = delete;

  ucp_worker_h worker() const { return worker_; }
  std::vector<char> worker_address() const;

  // --- bootstrap (creating thread, before start) ---
  // Endpoints report failures into their EndpointInfo (and poison after start).
  ucp_ep_h connect_to_address(const std::vector<char> &address, EndpointInfo *info);
  ucp_ep_h connect_to_sockaddr(const struct sockaddr *addr, socklen_t length, EndpointInfo *info);
  ucp_ep_h accept(ucp_conn_request_h request, EndpointInfo *info);
  // Force-closes an endpoint (progressing until done, at most 1 s).
  void close_now(ucp_ep_h ep);
  // Progresses the worker until done() or the deadline; true if done().
  bool progress_until(const std::function<bool()> &done, Clock::time_point deadline);

  // --- transfers (any thread; issued inline before start) ---
  // ep: before start(), the endpoint to send on; after it, nullptr (the mesh
  // endpoint of `peer` is used).
  UcxTransferPtr post_send(ucp_ep_h ep, int peer, const void *data, std::size_t bytes,
                           std::uint64_t tag);
  UcxTransferPtr post_recv(int peer, void *data, std::size_t bytes, std::uint64_t tag,
                           std::uint64_t mask = ~std::uint64_t(0));
  // Bootstrap only: the transfer's state without locking.
  bool finished(const UcxTransfer &t);

  // --- after bootstrap ---
  // The mesh: endpoints[r] reaches rank r (this rank's own entry included).
  void start(int rank, std::vector<ucp_ep_h> endpoints, std::vector<std::unique_ptr<EndpointInfo>> infos,
             std::vector<ucp_ep_h> extra_endpoints, std::vector<std::unique_ptr<EndpointInfo>> extra_infos);
  ucp_ep_h endpoint(int peer) const { return endpoints_[std::size_t(peer)]; }

  enum class Waited { done, poisoned, timed_out };
  Waited wait(const UcxTransfer &t, Clock::time_point deadline);
  bool test(const UcxTransfer &t);

  // Whether `peer` destroyed its communicator (said goodbye). Any thread.
  bool departed(int peer) const;

  // First reason wins. notify: send abort notices to the peers.
  void poison(flatmem_status status, const std::string &message, bool notify);
  flatmem_status health(std::string *message) const;
  // After poisoning: waits (at most `bound`) until no transfer is in flight.
  void drain(std::chrono::milliseconds bound);
  // Orderly end: flush and close the endpoints (bounded), stop the thread.
  void shutdown();

 private:
  UcxTransferPtr make_transfer(bool is_send, int peer, std::size_t bytes, std::uint64_t tag);
  void submit(const UcxTransferPtr &t);  // registers, then issues or queues
  void issue(const UcxTransferPtr &t);
  void complete(UcxTransfer *t, ucs_status_t status, std::size_t received);
  void run_commands();
  void progress_loop();
  void teardown();  // worker thread: notices, cancel, force close
  void cancel_receives();
  void post_abort_receive();
  void post_goodbye_receive();
  void say_goodbye();  // worker thread, healthy shutdown: flush, then tell every peer
  void queue(std::function<void()> command);
  void close_all(unsigned flags, std::chrono::milliseconds bound);

  static void on_send(void *request, ucs_status_t status, void *user);
  static void on_recv(void *request, ucs_status_t status, const ucp_tag_recv_info_t *info, void *user);
  static void on_abort_notice(void *request, ucs_status_t status, const ucp_tag_recv_info_t *info,
                              void *user);
  static void on_goodbye(void *request, ucs_status_t status, const ucp_tag_recv_info_t *info,
                         void *user);
  static void on_endpoint_error(void *arg, ucp_ep_h ep, ucs_status_t status);

  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int rank_ = -1;
  std::vector<ucp_ep_h> endpoints_, extra_endpoints_;
  std::vector<std::unique_ptr<EndpointInfo>> infos_, extra_infos_;

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::unordered_map<UcxTransfer *, UcxTransferPtr> in_flight_;
  std::deque<std::function<void()>> commands_;
  bool started_ = false, stopping_ = false, teardown_pending_ = false, notify_peers_ = false;
  flatmem_status poison_status_ = FLATMEM_STATUS_SUCCESS;
  std::string poison_message_;
  std::thread thread_;

  // The standing receive of abort notices from any rank.
  std::vector<char> notice_buffer_;
  void *notice_request_ = nullptr;
  // Peers that destroyed their communicator in an orderly way: their
  // connections closing is not a failure (worker thread only).
  std::vector<char> departed_;
  // A peer's connection failed at `since`: poisoned unless its goodbye
  // arrives within the grace period (goodbye and the connection closing
  // travel on different connections, in either order). Worker thread only.
  struct Suspect {
    int peer;
    ucs_status_t status;
    Clock::time_point since;
  };
  std::vector<Suspect> suspects_;
  void judge_suspects();
  std::uint64_t goodbye_buffer_ = 0;
  void *goodbye_request_ = nullptr;
};

}  // namespace flatmem::comm::ucx
