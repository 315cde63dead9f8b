// The device transport of a communicator: NCCL on CUDA buffers, created
// collectively by flatmem_comm_init_device over the host transport (the NCCL
// unique id is broadcast from rank 0). Built from src/comm/nccl/ when NCCL is
// found; otherwise src/comm/no_device.cpp makes every entry UNSUPPORTED.
//
// Calls enqueue on the caller's stream and return; waits on the host happen
// only where a function says so (group_end while a non-blocking NCCL call is
// in progress, synchronize), always under a deadline; a timeout or an NCCL
// error aborts the NCCL communicator and poisons the host communicator.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "comm/communicator.hpp"

namespace flatmem::comm {

// What ncclAllReduce sums on the device.
enum class DeviceSumType { f32, f64, i32, i64, bf16, f16 };

class DeviceTransport {
 public:
  virtual ~DeviceTransport() = default;
  // The CUDA device id the NCCL communicator lives on.
  virtual int device() const = 0;

  // ncclSend / ncclRecv of `bytes` bytes (as ncclUint8) to / from `peer`
  // (peer may be this rank). Inside group_start/group_end they are collected.
  virtual void send(const void *data, std::size_t bytes, int peer, void *stream,
                    Milliseconds timeout) = 0;
  virtual void recv(void *data, std::size_t bytes, int peer, void *stream,
                    Milliseconds timeout) = 0;
  virtual void group_start() = 0;
  virtual void group_end(Milliseconds timeout) = 0;

  // One NCCL group: send -> rank + 1, recv <- rank - 1.
  virtual void ring_shift(const void *send, void *recv, std::size_t bytes, void *stream,
                          Milliseconds timeout) = 0;
  virtual void all_reduce_sum(const void *send, void *recv, std::size_t count, DeviceSumType type,
                              void *stream, Milliseconds timeout) = 0;
  // Host wait for `stream`, polling ncclCommGetAsyncError, at most `timeout`.
  virtual void synchronize(void *stream, Milliseconds timeout) = 0;
  // Ends open groups and aborts the NCCL communicator now (flatmem_comm_abort):
  // destruction then does not wait for a finalisation. Idempotent.
  virtual void abort() noexcept = 0;
};

// Whether this library was built with NCCL.
bool device_transport_built();

// Collective over `host`: creates the NCCL communicator of its ranks on CUDA
// device `cuda_device`. Throws UNSUPPORTED without NCCL; TIMEOUT /
// PEER_FAILURE (host poisoned) when initialisation fails or passes `timeout`.
std::unique_ptr<DeviceTransport> create_device_transport(Communicator &host, int cuda_device,
                                                         Milliseconds timeout);

}  // namespace flatmem::comm
