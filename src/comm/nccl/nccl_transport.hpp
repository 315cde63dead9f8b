// The device transport over NCCL (see comm/device_transport.hpp for the
// contract). One non-blocking NCCL communicator (ncclConfig_t.blocking = 0)
// per flatmem communicator, on one CUDA device; NCCL itself is opened at run
// time (nccl_library.hpp).
//
// Waiting: a non-blocking NCCL call may return ncclInProgress (a group whose
// launch NCCL finishes on its own thread, e.g. while it connects peers for
// the first time). NCCL's rule is that nothing else may be called on the
// communicator until ncclCommGetAsyncError leaves ncclInProgress, so every
// such call is followed by a poll of ncclCommGetAsyncError under the call's
// deadline (sleeping 20 us growing to 1 ms between polls), which also watches
// the host communicator: a peer's abort notice or a host failure ends the
// wait at once.
//
// Failure: an NCCL error, a passed deadline or a poisoned host communicator
// ends every open NCCL group of this transport, aborts the NCCL communicator
// (ncclCommAbort, on a thread of its own so that the caller is not held by
// the cudaFree inside it; NCCL kernels still on a stream exit, so the stream
// drains),
// poisons the host communicator (first reason wins; the peers are told) and
// throws TIMEOUT / PEER_FAILURE with a message that names the operation, the
// peers, the bytes, the CUDA device, NCCL's error string and ncclGetLastError.
// Argument errors (INVALID_ARGUMENT: a buffer that is not device memory of
// this device, a peer out of range, overlapping buffers) touch nothing.
#pragma once

#include <nccl.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "comm/device_transport.hpp"
#include "comm/nccl/nccl_library.hpp"

namespace flatmem::comm::nccl {

class NcclTransport final : public DeviceTransport {
 public:
  using Clock = std::chrono::steady_clock;

  // Takes ownership of `comm` (initialised: ncclCommGetAsyncError says
  // ncclSuccess). `finalize_timeout` bounds ncclCommFinalize in the destructor.
  NcclTransport(Communicator &host, const Api &api, int device, ncclComm_t comm,
                Milliseconds finalize_timeout);
  // Healthy: ncclCommFinalize polled for at most finalize_timeout, then
  // ncclCommDestroy; failed, aborted or past that bound: ncclCommAbort. Never
  // touches the host communicator (it may be half destroyed by then).
  ~NcclTransport() override;
  NcclTransport(const NcclTransport &) = delete;
  NcclTransport &operator=(const NcclTransport &) = delete;

  int device() const override { return device_; }
  void send(const void *data, std::size_t bytes, int peer, void *stream,
            Milliseconds timeout) override;
  void recv(void *data, std::size_t bytes, int peer, void *stream, Milliseconds timeout) override;
  void group_start() override;
  void group_end(Milliseconds timeout) override;
  void ring_shift(const void *send, void *recv, std::size_t bytes, void *stream,
                  Milliseconds timeout) override;
  void all_reduce_sum(const void *send, void *recv, std::size_t count, DeviceSumType type,
                      void *stream, Milliseconds timeout) override;
  void synchronize(void *stream, Milliseconds timeout) override;

  // Ends the open groups and aborts the NCCL communicator now, without
  // waiting for anything and without touching the host communicator; later
  // calls fail with COMM_POISONED. For flatmem_comm_abort. Idempotent.
  void abort() noexcept override;

 private:
  // What the group opened by the outermost group_start collected, for the
  // message of group_end.
  struct GroupSummary {
    int sends = 0, receives = 0, collectives = 0;
    std::uint64_t bytes = 0;
  };

  // COMM_POISONED unless the host communicator is healthy and this NCCL
  // communicator has not been aborted or failed asynchronously.
  void check_usable(const std::string &what);
  // Handles the result of an enqueueing NCCL call: success returns, an error
  // fails, ncclInProgress polls until the communicator settles.
  void complete(ncclResult_t result, const std::string &what, Clock::time_point deadline,
                Milliseconds timeout);
  // Polls ncclCommGetAsyncError until it leaves ncclInProgress.
  void settle(const std::string &what, Clock::time_point deadline, Milliseconds timeout);
  // Throws (after aborting NCCL) when the host communicator was poisoned.
  void watch_host();
  // "NCCL <error string> (last error: ...)".
  std::string nccl_text(ncclResult_t result) const;
  // Aborts NCCL, poisons the host communicator, throws.
  [[noreturn]] void die(flatmem_status status, const std::string &message);
  void check_buffer(const void *p, std::size_t bytes, const char *name) const;
  void check_peer(int peer, const char *name) const;
  void begin_group();
  // ncclSend (sending) or ncclRecv of `bytes` bytes, counted in the open group.
  void point_to_point(bool sending, void *data, std::size_t bytes, int peer, void *stream,
                      Milliseconds timeout);
  void end_group(const std::string &what, Clock::time_point deadline, Milliseconds timeout);
  std::string on_device() const;  // " on CUDA device N"

  Communicator &host_;
  const Api &api_;
  int device_;
  int rank_;
  int size_;
  ncclComm_t comm_;
  Milliseconds finalize_timeout_;
  int group_depth_ = 0;
  GroupSummary group_;
};

}  // namespace flatmem::comm::nccl
