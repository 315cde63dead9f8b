// How the cyclic runtimes' device code fails: a transfer left behind on an
// NCCL communicator (an open group, a send no peer will match) cannot be
// recovered, so any failure poisons the host communicator (first reason
// wins: the transport's own when it failed; the peers then fail at once),
// aborts the private NCCL communicator and is rethrown prefixed with what was
// being done. COMM_POISONED (this wait ended by someone else's failure) is passed
// on as PEER_FAILURE to the peers.
#pragma once

#include <string>

#include "comm/communicator.hpp"
#include "comm/device_transport.hpp"
#include "core/error.hpp"

namespace flatmem::cyclic {

template <typename F>
void abort_on_failure(comm::Communicator &host, comm::DeviceTransport *nccl, const std::string &what, F f) {
  try {
    f();
  } catch (const Error &e) {
    const std::string message = what + ": " + e.what();
    // Tell the peers first: the abort may wait for the device.
    host.poison(e.status() == FLATMEM_STATUS_COMM_POISONED ? FLATMEM_STATUS_PEER_FAILURE : e.status(), message);
    if (nccl != nullptr) nccl->abort();
    throw Error(e.status(), message);
  }
}

}  // namespace flatmem::cyclic
