#include "comm/ucx/ucx_communicator.hpp"

#include "comm/ucx/tags.hpp"
#include "core/error.hpp"

namespace flatmem::comm::ucx {
namespace {

// How long a failing call waits for the progress thread to release every
// buffer it was given (cancelled receives, force-closed sends).
constexpr Milliseconds drain_bound{5000};

const UcxTransfer &as_ucx(const TransferPtr &t) {
  if (!t) invalid("request: NULL");
  return static_cast<const UcxTransfer &>(*t);
}

}  // namespace

UcxCommunicator::UcxCommunicator(int rank, int size, Config config, std::unique_ptr<Engine> engine)
    : rank_(rank), size_(size), config_(config), engine_(std::move(engine)) {}

UcxCommunicator::~UcxCommunicator() { engine_->shutdown(); }

void UcxCommunicator::check_healthy() const {
  std::string message;
  if (engine_->health(&message) != FLATMEM_STATUS_SUCCESS)
    fail(FLATMEM_STATUS_COMM_POISONED, "the communicator failed earlier (release it with "
                                       "flatmem_comm_abort): ", message);
}

flatmem_status UcxCommunicator::health(std::string *message) const {
  return engine_->health(message);
}

void UcxCommunicator::poison(flatmem_status status, const std::string &message) {
  engine_->poison(status, "rank " + std::to_string(rank_) + ": " + message, true);
  engine_->drain(drain_bound);
}

std::uint64_t UcxCommunicator::wire_tag(Space space, int source, std::uint64_t tag) const {
  const Kind kind = space == Space::user     ? Kind::user
                    : space == Space::cyclic ? Kind::cyclic
                                             : Kind::internal;
  return make_tag(kind, source, tag);
}

TransferPtr UcxCommunicator::send(int peer, const void *data, std::size_t bytes, Space space,
                                  std::uint64_t tag) {
  check_healthy();
  return engine_->post_send(nullptr, peer, data, bytes, wire_tag(space, rank_, tag));
}

TransferPtr UcxCommunicator::recv(int peer, void *data, std::size_t bytes, Space space,
                                  std::uint64_t tag) {
  check_healthy();
  return engine_->post_recv(peer, data, bytes, wire_tag(space, peer, tag));
}

bool UcxCommunicator::test(const TransferPtr &transfer) {
  return engine_->test(as_ucx(transfer));
}

void UcxCommunicator::fail_after_poison(const UcxTransfer &t, const std::string &what) {
  engine_->drain(drain_bound);
  std::string reason;
  const flatmem_status status = engine_->health(&reason);
  fail(status, what, ": ", t.describe(), ": the communicator failed: ", reason);
}

void UcxCommunicator::wait(const TransferPtr &transfer, Milliseconds timeout,
                           const std::string &what) {
  const UcxTransfer &t = as_ucx(transfer);
  switch (engine_->wait(t, Clock::now() + timeout)) {
    case Engine::Waited::timed_out: {
      const std::string message = what + ": " + t.describe() + ": timed out after " +
                                  std::to_string(timeout.count()) + " ms (rank " +
                                  std::to_string(t.peer) +
                                  (engine_->departed(t.peer)
                                       ? " destroyed its communicator)"
                                       : " dead, wedged, or not making the matching call)");
      engine_->poison(FLATMEM_STATUS_TIMEOUT, "rank " + std::to_string(rank_) + ": " + message, true);
      engine_->drain(drain_bound);
      fail(FLATMEM_STATUS_TIMEOUT, message);
    }
    case Engine::Waited::poisoned: fail_after_poison(t, what);
    case Engine::Waited::done: break;
  }
  if (t.status == UCS_ERR_MESSAGE_TRUNCATED)
    invalid(what, ": rank ", t.peer, " sent more than the ", t.bytes,
            " bytes this receive expects (sizes of a send and its receive must match)");
  if (t.status != UCS_OK) {
    std::string reason;
    if (engine_->health(&reason) != FLATMEM_STATUS_SUCCESS) fail_after_poison(t, what);
    poison(FLATMEM_STATUS_PEER_FAILURE, what + ": " + t.describe() + ": " + ucs_text(t.status));
    fail_after_poison(t, what);
  }
  if (!t.is_send && t.received != t.bytes)
    invalid(what, ": rank ", t.peer, " sent ", t.received, " bytes, this receive expects ", t.bytes,
            " (sizes of a send and its receive must match)");
}

}  // namespace flatmem::comm::ucx
