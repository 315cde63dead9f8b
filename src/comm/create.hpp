// Making communicators: over UCX (src/comm/ucx/create.cpp, or
// src/comm/no_ucx.cpp when UCX is absent: UNSUPPORTED) and in-process
// (src/comm/local/).
#pragma once

#include <flatmem/flatmem.h>

#include <memory>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/options.hpp"

namespace flatmem::comm {

// flatmem_comm_unique_id_create.
flatmem_comm_unique_id make_unique_id(const char *address);

// flatmem_comm_create / flatmem_comm_create_from_env (arguments checked by the caller).
std::unique_ptr<Communicator> create_ucx(int rank, int world, const flatmem_comm_unique_id &id,
                                         const Config &config);
std::unique_ptr<Communicator> create_ucx_from_env(const Config &config);

}  // namespace flatmem::comm
