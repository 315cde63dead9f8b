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
  setenv("UCX_ERROR_SIGNALS", "", 0);
  setenv("UCX_HANDLE_ERRORS", "none", 0);
  setenv("UCX_MEM_EVENTS", "no", 0);
}

}  // namespace flatmem_fuzz
