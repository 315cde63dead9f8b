#include "support/comm_sandbox.hpp"

#include <ifaddrs.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace flatmem_fuzz {

void enter_comm_sandbox() {
  ifaddrs *list = nullptr;
  if (getifaddrs(&list) != 0) {
    std::perror("flatmem fuzz: getifaddrs");
    std::abort();
  }
  for (const ifaddrs *a = list; a != nullptr; a = a->ifa_next) {
    if (std::strcmp(a->ifa_name, "lo") != 0) {
      std::fprintf(stderr,
                   "flatmem fuzz: network interface \"%s\" is visible; the communicator targets "
                   "dial fuzzed addresses and run only in a loopback-only network namespace: "
                   "unshare --net sh -c 'ip link set lo up && exec %s ...' "
                   "(scripts/fuzz.sh does this)\n",
                   a->ifa_name, "TARGET");
      std::abort();
    }
  }
  freeifaddrs(list);
  // Also set by the scripts before the process starts (UCX reads some at load time).
  setenv("UCX_TLS", "tcp,self", 0);
  setenv("UCX_NET_DEVICES", "lo", 0);
  setenv("UCX_WARN_UNUSED_ENV_VARS", "n", 0);
  // UCX_ERROR_SIGNALS / UCX_HANDLE_ERRORS stay at UCX's defaults (libflatmem restores the
  // crash handlers anyway): with UCX_ERROR_SIGNALS= or UCX_HANDLE_ERRORS=none, UCX 1.13
  // under ASan SEGVs in ucp_cm_server_conn_request_cb after a member gave up on a
  // listener of this process (an open finding, see the fuzz report).
  setenv("UCX_MEM_EVENTS", "no", 0);
}

}  // namespace flatmem_fuzz
