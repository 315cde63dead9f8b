// flatmem_comm_options resolved: the deadlines every communicator uses.
#pragma once

#include <flatmem/flatmem.h>

#include "comm/communicator.hpp"

namespace flatmem::comm {

struct Config {
  Milliseconds timeout{60000};          // default deadline of every wait
  Milliseconds connect_timeout{120000};  // how long creation waits for all ranks
};

// Reads the caller's struct under the ABI rules (NULL = defaults); 0 fields
// take FLATMEM_COMM_TIMEOUT_MS from the environment or the defaults above.
// Negative values and values above a day are INVALID_ARGUMENT.
Config resolve_config(const flatmem_comm_options *options);

// A per-call timeout_ms argument: 0 = `fallback`, 1 .. a day, else INVALID_ARGUMENT.
Milliseconds resolve_timeout(std::int64_t timeout_ms, Milliseconds fallback, const char *name);

}  // namespace flatmem::comm
