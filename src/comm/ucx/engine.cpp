#include "comm/ucx/engine.hpp"

#include <poll.h>
#include <cstdio>
#include <cstdlib>

#include <algorithm>
#include <cstring>

#include "comm/ucx/tags.hpp"
#include "core/error.hpp"

namespace flatmem::comm::ucx {
namespace {

constexpr std::size_t notice_bytes = 1024;

void check_ucs(ucs_status_t status, const char *what) {
  if (status != UCS_OK) fail(FLATMEM_STATUS_PEER_FAILURE, what, ": ", ucs_text(status));
}

}  // namespace

std::string UcxTransfer::describe() const {
  return (is_send ? "send of " : "receive of ") + std::to_string(bytes) + " bytes " +
         (is_send ? "to rank " : "from rank ") + std::to_string(peer);
}

Engine::Engine() : notice_buffer_(notice_bytes) {
  ucp_config_t *config = nullptr;
  check_ucs(ucp_config_read(nullptr, nullptr, &config), "UCX: reading its configuration");
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
  const ucs_status_t status = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  check_ucs(status, "UCX: ucp_init");
  ucp_worker_params_t worker{};
  worker.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  worker.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  const ucs_status_t made = ucp_worker_create(context_, &worker, &worker_);
  if (made != UCS_OK) {
    ucp_cleanup(context_);
    check_ucs(made, "UCX: ucp_worker_create");
  }
}

Engine::~Engine() {
  shutdown();
  if (goodbye_request_) {
    ucp_request_cancel(worker_, goodbye_request_);
    progress_until([&] { return goodbye_request_ == nullptr; },
                   Clock::now() + std::chrono::milliseconds(200));
  }
  if (notice_request_) {
    ucp_request_cancel(worker_, notice_request_);
    progress_until([&] { return ucp_request_check_status(notice_request_) != UCS_INPROGRESS; },
                   Clock::now() + std::chrono::milliseconds(200));
    ucp_request_free(notice_request_);
  }
  ucp_worker_destroy(worker_);
  ucp_cleanup(context_);
}

std::vector<char> Engine::worker_address() const {
  ucp_worker_attr_t attr{};
  attr.field_mask = UCP_WORKER_ATTR_FIELD_ADDRESS;
  check_ucs(ucp_worker_query(worker_, &attr), "UCX: ucp_worker_query");
  const auto *bytes = reinterpret_cast<const char *>(attr.address);
  std::vector<char> address(bytes, bytes + attr.address_length);
  ucp_worker_release_address(worker_, attr.address);
  return address;
}

// --- endpoints ---------------------------------------------------------------

ucp_ep_h Engine::connect_to_address(const std::vector<char> &address, EndpointInfo *info) {
  ucp_ep_params_t p{};
  p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                 UCP_EP_PARAM_FIELD_ERR_HANDLER;
  p.address = reinterpret_cast<const ucp_address_t *>(address.data());
  p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  p.err_handler.cb = on_endpoint_error;
  p.err_handler.arg = info;
  info->engine = this;
  ucp_ep_h ep = nullptr;
  check_ucs(ucp_ep_create(worker_, &p, &ep),
            ("UCX: connecting to rank " + std::to_string(info->peer)).c_str());
  return ep;
}

ucp_ep_h Engine::connect_to_sockaddr(const struct sockaddr *addr, socklen_t length,
                                     EndpointInfo *info) {
  ucp_ep_params_t p{};
  p.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                 UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  p.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
  p.sockaddr.addr = addr;
  p.sockaddr.addrlen = length;
  p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  p.err_handler.cb = on_endpoint_error;
  p.err_handler.arg = info;
  info->engine = this;
  ucp_ep_h ep = nullptr;
  const ucs_status_t status = ucp_ep_create(worker_, &p, &ep);
  if (status != UCS_OK) {
    info->failure = status;
    return nullptr;
  }
  return ep;
}

ucp_ep_h Engine::accept(ucp_conn_request_h request, EndpointInfo *info) {
  ucp_ep_params_t p{};
  p.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                 UCP_EP_PARAM_FIELD_ERR_HANDLER;
  p.conn_request = request;
  p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  p.err_handler.cb = on_endpoint_error;
  p.err_handler.arg = info;
  info->engine = this;
  ucp_ep_h ep = nullptr;
  check_ucs(ucp_ep_create(worker_, &p, &ep), "UCX: accepting a connection");
  return ep;
}

void Engine::close_now(ucp_ep_h ep) {
  if (ep == nullptr) return;
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_EP_CLOSE_FLAG_FORCE;
  void *request = ucp_ep_close_nbx(ep, &p);
  if (request == nullptr || UCS_PTR_IS_ERR(request)) return;
  progress_until([&] { return ucp_request_check_status(request) != UCS_INPROGRESS; },
                 Clock::now() + std::chrono::seconds(1));
  ucp_request_free(request);
}

void Engine::close_all(unsigned flags, std::chrono::milliseconds bound) {
  std::vector<void *> requests;
  for (auto *list : {&endpoints_, &extra_endpoints_}) {
    for (ucp_ep_h &ep : *list) {
      if (ep == nullptr) continue;
      ucp_request_param_t p{};
      p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      p.flags = flags;
      void *request = ucp_ep_close_nbx(ep, &p);
      if (request != nullptr && !UCS_PTR_IS_ERR(request)) requests.push_back(request);
      ep = nullptr;
    }
  }
  progress_until(
      [&] {
        return std::all_of(requests.begin(), requests.end(), [](void *r) {
          return ucp_request_check_status(r) != UCS_INPROGRESS;
        });
      },
      Clock::now() + bound);
  for (void *r : requests) ucp_request_free(r);
}

bool Engine::progress_until(const std::function<bool()> &done, Clock::time_point deadline) {
  while (!done()) {
    if (ucp_worker_progress(worker_) == 0) {
      if (Clock::now() >= deadline) return done();
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  return true;
}

// --- transfers ------------------------------------------------------------------

UcxTransferPtr Engine::post_send(ucp_ep_h ep, int peer, const void *data, std::size_t bytes,
                                 std::uint64_t tag) {
  auto t = make_transfer(true, peer, bytes, tag);
  t->ep = ep;
  t->send_data = data;
  submit(t);
  return t;
}

UcxTransferPtr Engine::post_recv(int peer, void *data, std::size_t bytes, std::uint64_t tag,
                                 std::uint64_t mask) {
  auto t = make_transfer(false, peer, bytes, tag);
  t->mask = mask;
  t->recv_data = data;
  submit(t);
  return t;
}

UcxTransferPtr Engine::make_transfer(bool is_send, int peer, std::size_t bytes, std::uint64_t tag) {
  auto t = std::make_shared<UcxTransfer>();
  t->engine = this;
  t->is_send = is_send;
  t->peer = peer;
  t->bytes = bytes;
  t->tag = tag;
  return t;
}

void Engine::submit(const UcxTransferPtr &t) {
  bool inline_issue;
  {
    std::lock_guard lock(mutex_);
    in_flight_.emplace(t.get(), t);
    inline_issue = !started_;
  }
  if (inline_issue) issue(t);
  else queue([this, t] { issue(t); });
}

void Engine::issue(const UcxTransferPtr &t) {
  {
    std::lock_guard lock(mutex_);
    if (poison_status_ != FLATMEM_STATUS_SUCCESS && started_) {
      t->done = true;
      t->status = UCS_ERR_CANCELED;
      in_flight_.erase(t.get());
      changed_.notify_all();
      return;
    }
  }
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.user_data = t.get();
  ucs_status_ptr_t request;
  if (t->is_send) {
    // After start() only this (the worker) thread reads or clears endpoints_.
    const ucp_ep_h use = started_ ? endpoints_[std::size_t(t->peer)] : t->ep;
    if (use == nullptr) return complete(t.get(), UCS_ERR_NOT_CONNECTED, 0);
    p.cb.send = on_send;
    request = ucp_tag_send_nbx(use, t->send_data, t->bytes, t->tag, &p);
    if (request == nullptr) return complete(t.get(), UCS_OK, t->bytes);
  } else {
    // Always through the callback, which is where UCX reports the length.
    p.op_attr_mask |= UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    p.cb.recv = on_recv;
    request = ucp_tag_recv_nbx(worker_, t->recv_data, t->bytes, t->tag, t->mask, &p);
  }
  if (UCS_PTR_IS_ERR(request)) return complete(t.get(), UCS_PTR_STATUS(request), 0);
  t->request = request;
}

void Engine::complete(UcxTransfer *t, ucs_status_t status, std::size_t received) {
  std::lock_guard lock(mutex_);
  t->done = true;
  t->status = status;
  t->received = received;
  t->request = nullptr;
  changed_.notify_all();
  in_flight_.erase(t);  // may destroy *t: last
}

void Engine::on_send(void *request, ucs_status_t status, void *user) {
  auto *t = static_cast<UcxTransfer *>(user);
  t->engine->complete(t, status, status == UCS_OK ? t->bytes : 0);
  ucp_request_free(request);
}

void Engine::on_recv(void *request, ucs_status_t status, const ucp_tag_recv_info_t *info,
                     void *user) {
  auto *t = static_cast<UcxTransfer *>(user);
  t->engine->complete(t, status, info ? info->length : 0);
  ucp_request_free(request);
}

bool Engine::finished(const UcxTransfer &t) {
  std::lock_guard lock(mutex_);
  return t.done;
}

// --- the progress thread -------------------------------------------------------

void Engine::start(int rank, std::vector<ucp_ep_h> endpoints,
                   std::vector<std::unique_ptr<EndpointInfo>> infos,
                   std::vector<ucp_ep_h> extra_endpoints,
                   std::vector<std::unique_ptr<EndpointInfo>> extra_infos) {
  rank_ = rank;
  endpoints_ = std::move(endpoints);
  infos_ = std::move(infos);
  extra_endpoints_ = std::move(extra_endpoints);
  extra_infos_ = std::move(extra_infos);
  departed_.assign(endpoints_.size(), 0);
  post_abort_receive();
  post_goodbye_receive();
  {
    std::lock_guard lock(mutex_);
    started_ = true;
  }
  thread_ = std::thread([this] { progress_loop(); });
}

void Engine::post_abort_receive() {
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                   UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  p.cb.recv = on_abort_notice;
  p.user_data = this;
  void *request = ucp_tag_recv_nbx(worker_, notice_buffer_.data(), notice_buffer_.size(),
                                   make_tag(Kind::abort_notice, 0, 0), kind_bits, &p);
  if (!UCS_PTR_IS_ERR(request)) notice_request_ = request;
}

void Engine::post_goodbye_receive() {
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                   UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  p.cb.recv = on_goodbye;
  p.user_data = this;
  void *request = ucp_tag_recv_nbx(worker_, &goodbye_buffer_, sizeof goodbye_buffer_,
                                   make_tag(Kind::goodbye, 0, 0), kind_bits, &p);
  goodbye_request_ = UCS_PTR_IS_ERR(request) ? nullptr : request;
}

void Engine::on_goodbye(void *request, ucs_status_t status, const ucp_tag_recv_info_t *info,
                        void *user) {
  auto *engine = static_cast<Engine *>(user);
  ucp_request_free(request);
  engine->goodbye_request_ = nullptr;
  if (status != UCS_OK) return;  // cancelled at the end
  const int peer = tag_source(info->sender_tag);
  {
    std::lock_guard lock(engine->mutex_);
    if (peer >= 0 && std::size_t(peer) < engine->departed_.size()) engine->departed_[std::size_t(peer)] = 1;
  }
  engine->post_goodbye_receive();
}

bool Engine::departed(int peer) const {
  std::lock_guard lock(mutex_);
  return peer >= 0 && std::size_t(peer) < departed_.size() && departed_[std::size_t(peer)];
}

void Engine::say_goodbye() {
  // Flush first: everything this rank sent has reached its peer before the
  // goodbye does, so a peer can still receive it after this rank is gone.
  ucp_request_param_t flush{};
  void *flushed = ucp_worker_flush_nbx(worker_, &flush);
  if (flushed != nullptr && !UCS_PTR_IS_ERR(flushed)) {
    progress_until([&] { return ucp_request_check_status(flushed) != UCS_INPROGRESS; },
                   Clock::now() + std::chrono::milliseconds(2000));
    ucp_request_free(flushed);
  }
  const std::uint64_t word = 0;
  std::vector<void *> sent;
  for (std::size_t peer = 0; peer < endpoints_.size(); ++peer) {
    if (int(peer) == rank_ || endpoints_[peer] == nullptr || departed(int(peer))) continue;
    ucp_request_param_t p{};
    void *r = ucp_tag_send_nbx(endpoints_[peer], &word, sizeof word, make_tag(Kind::goodbye, rank_, 0), &p);
    if (r != nullptr && !UCS_PTR_IS_ERR(r)) sent.push_back(r);
  }
  progress_until(
      [&] {
        return std::all_of(sent.begin(), sent.end(),
                           [](void *r) { return ucp_request_check_status(r) != UCS_INPROGRESS; });
      },
      Clock::now() + std::chrono::milliseconds(1000));
  for (void *r : sent) ucp_request_free(r);
}

void Engine::on_abort_notice(void *, ucs_status_t status, const ucp_tag_recv_info_t *info,
                             void *user) {
  if (status != UCS_OK && status != UCS_ERR_MESSAGE_TRUNCATED) return;  // cancelled at the end
  auto *engine = static_cast<Engine *>(user);
  const std::size_t length = std::min(info->length, engine->notice_buffer_.size());
  const std::string text(engine->notice_buffer_.data(), length);
  engine->poison(FLATMEM_STATUS_PEER_FAILURE,
                 "rank " + std::to_string(tag_source(info->sender_tag)) + " gave up: " + text,
                 false);
}

void Engine::on_endpoint_error(void *arg, ucp_ep_h, ucs_status_t status) {
  auto *info = static_cast<EndpointInfo *>(arg);
  info->failure = status;
  Engine *engine = info->engine;
  if (!engine->started_ || info->peer < 0 || engine->departed(info->peer)) return;
  engine->suspects_.push_back({info->peer, status, Clock::now()});
}

// How long a failed connection waits for its peer's goodbye.
constexpr auto goodbye_grace = std::chrono::milliseconds(300);

void Engine::judge_suspects() {
  for (auto it = suspects_.begin(); it != suspects_.end();) {
    if (departed(it->peer)) {
      it = suspects_.erase(it);
    } else if (Clock::now() - it->since >= goodbye_grace) {
      poison(FLATMEM_STATUS_PEER_FAILURE,
             "the connection to rank " + std::to_string(it->peer) + " failed: " + ucs_text(it->status) +
                 " (the rank died, or its process ended without destroying its communicator)",
             true);
      it = suspects_.erase(it);
    } else {
      ++it;
    }
  }
}

void Engine::queue(std::function<void()> command) {
  {
    std::lock_guard lock(mutex_);
    commands_.push_back(std::move(command));
  }
  ucp_worker_signal(worker_);
}

void Engine::run_commands() {
  std::deque<std::function<void()>> now;
  {
    std::lock_guard lock(mutex_);
    now.swap(commands_);
  }
  for (auto &command : now) command();
}

void Engine::progress_loop() {
  int fd = -1;
  if (ucp_worker_get_efd(worker_, &fd) != UCS_OK) fd = -1;
  for (;;) {
    run_commands();
    bool do_teardown, stop, busy;
    {
      std::lock_guard lock(mutex_);
      do_teardown = teardown_pending_;
      teardown_pending_ = false;
      stop = stopping_;
    }
    if (do_teardown) teardown();
    if (stop) break;
    while (ucp_worker_progress(worker_) != 0) {
    }
    judge_suspects();
    if (fd >= 0 && ucp_worker_arm(worker_) == UCS_ERR_BUSY) continue;
    {
      std::lock_guard lock(mutex_);
      if (!commands_.empty() || teardown_pending_ || stopping_) continue;
      busy = !in_flight_.empty() || !suspects_.empty();
    }
    if (fd >= 0) {
      // Woken by UCX events and by queue() (ucp_worker_signal); the timeout
      // is only a safety net.
      pollfd p{fd, POLLIN, 0};
      ::poll(&p, 1, busy ? 2 : 50);
    } else {
      std::this_thread::sleep_for(busy ? std::chrono::microseconds(20) : std::chrono::microseconds(1000));
    }
  }
  // Orderly end: let the peers receive what was sent (bounded), then close;
  // receives nobody waited for are cancelled before the worker goes away.
  const bool healthy = health(nullptr) == FLATMEM_STATUS_SUCCESS;
  if (healthy) say_goodbye();
  close_all(healthy ? 0u : unsigned(UCP_EP_CLOSE_FLAG_FORCE), std::chrono::milliseconds(2000));
  cancel_receives();
}

void Engine::cancel_receives() {
  std::vector<void *> receives;
  {
    std::lock_guard lock(mutex_);
    for (auto &[t, owner] : in_flight_)
      if (!t->is_send && t->request) receives.push_back(t->request);
  }
  for (void *r : receives) ucp_request_cancel(worker_, r);
  progress_until(
      [&] {
        std::lock_guard lock(mutex_);
        return std::none_of(in_flight_.begin(), in_flight_.end(),
                            [](const auto &entry) { return !entry.first->is_send; });
      },
      Clock::now() + std::chrono::milliseconds(500));
}

void Engine::teardown() {
  std::string text;
  bool notify;
  {
    std::lock_guard lock(mutex_);
    text = poison_message_.substr(0, notice_bytes);
    notify = notify_peers_;
  }
  std::vector<void *> notices;
  if (notify) {
    for (std::size_t peer = 0; peer < endpoints_.size(); ++peer) {
      if (int(peer) == rank_ || endpoints_[peer] == nullptr) continue;
      ucp_request_param_t p{};
      void *r = ucp_tag_send_nbx(endpoints_[peer], text.data(), text.size(),
                                 make_tag(Kind::abort_notice, rank_, 0), &p);
      if (r != nullptr && !UCS_PTR_IS_ERR(r)) notices.push_back(r);
    }
    progress_until(
        [&] {
          return std::all_of(notices.begin(), notices.end(), [](void *r) {
            return ucp_request_check_status(r) != UCS_INPROGRESS;
          });
        },
        Clock::now() + std::chrono::milliseconds(200));
    for (void *r : notices) ucp_request_free(r);
  }
  // Cancel the receives (they are the worker's), then close the endpoints,
  // which fails the sends still on them.
  cancel_receives();
  close_all(UCP_EP_CLOSE_FLAG_FORCE, std::chrono::milliseconds(1000));
  progress_until(
      [&] {
        std::lock_guard lock(mutex_);
        return in_flight_.empty();
      },
      Clock::now() + std::chrono::milliseconds(1000));
}

// --- API side --------------------------------------------------------------------

Engine::Waited Engine::wait(const UcxTransfer &t, Clock::time_point deadline) {
  std::unique_lock lock(mutex_);
  changed_.wait_until(lock, deadline,
                      [&] { return t.done || poison_status_ != FLATMEM_STATUS_SUCCESS; });
  if (t.done) return Waited::done;
  return poison_status_ != FLATMEM_STATUS_SUCCESS ? Waited::poisoned : Waited::timed_out;
}

bool Engine::test(const UcxTransfer &t) {
  std::lock_guard lock(mutex_);
  return t.done;
}

void Engine::poison(flatmem_status status, const std::string &message, bool notify) {
  {
    std::lock_guard lock(mutex_);
    if (poison_status_ != FLATMEM_STATUS_SUCCESS) return;
    poison_status_ = status;
    poison_message_ = message;
    teardown_pending_ = true;
    notify_peers_ = notify;
    changed_.notify_all();
  }
  if (started_) ucp_worker_signal(worker_);
}

flatmem_status Engine::health(std::string *message) const {
  std::lock_guard lock(mutex_);
  if (message) *message = poison_message_;
  return poison_status_;
}

void Engine::drain(std::chrono::milliseconds bound) {
  std::unique_lock lock(mutex_);
  changed_.wait_for(lock, bound, [&] { return in_flight_.empty(); });
}

void Engine::shutdown() {
  if (thread_.joinable()) {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    ucp_worker_signal(worker_);
    thread_.join();
  } else {
    close_all(UCP_EP_CLOSE_FLAG_FORCE, std::chrono::milliseconds(1000));
    cancel_receives();
  }
}

}  // namespace flatmem::comm::ucx
