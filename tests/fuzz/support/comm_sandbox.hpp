// The communicator targets dial whatever address a fuzzed id or variable names. They run
// only inside a network namespace whose one interface is the loopback (scripts/fuzz.sh
// and scripts/test-fuzz.sh start them under `unshare --net`): there, every address but
// 127.0.0.1 / ::1 is unreachable and no other program's listener can be reached.
#pragma once

#include <cstdint>

namespace flatmem_fuzz {

// Aborts with a message unless the process sees no network interface but "lo"; sets the
// UCX variables the communicators need on loopback (tcp, lo, quiet, no memory hooks).
void enter_comm_sandbox();

// Connect timeouts small enough for thousands of runs (ms).
inline constexpr std::int64_t kConnectTimeoutsMs[] = {1, 5, 20};

}  // namespace flatmem_fuzz
