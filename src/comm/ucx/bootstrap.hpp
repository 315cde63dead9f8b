// Joining the ranks of a UCX communicator (see flatmem/comm.h, "What a
// communicator is"): members connect to rank 0's listener and say hello;
// rank 0 answers every member with the roster of worker addresses (or a
// rejection); every rank then connects to every rank and exchanges a
// "ready" with each, which proves the mesh works before create returns.
#pragma once

#include <memory>

#include "comm/options.hpp"
#include "comm/ucx/address.hpp"
#include "comm/ucx/coordinator.hpp"
#include "comm/ucx/ucx_communicator.hpp"

namespace flatmem::comm::ucx {

// Rank 0 with its listener; session 0 accepts members of any session.
std::unique_ptr<UcxCommunicator> bootstrap_root(std::unique_ptr<Coordinator> coordinator, int world,
                                                std::uint64_t session, const Config &config);

// Rank `rank` > 0: dials `coordinator` (retrying until the connect timeout).
std::unique_ptr<UcxCommunicator> bootstrap_member(const SocketAddress &coordinator, int rank,
                                                  int world, std::uint64_t session,
                                                  const Config &config);

}  // namespace flatmem::comm::ucx
