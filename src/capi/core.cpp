// extern "C" entry points that belong to no handle: versions and statuses.
#include "core/error.hpp"

#define FLATMEM_STRINGIFY2(x) #x
#define FLATMEM_STRINGIFY(x) FLATMEM_STRINGIFY2(x)

extern "C" {

int flatmem_version(void) { return FLATMEM_VERSION; }

const char *flatmem_version_string(void) {
  return FLATMEM_STRINGIFY(FLATMEM_VERSION_MAJOR) "." FLATMEM_STRINGIFY(
      FLATMEM_VERSION_MINOR) "." FLATMEM_STRINGIFY(FLATMEM_VERSION_PATCH);
}

const char *flatmem_last_error(void) { return flatmem::last_error(); }

const char *flatmem_status_string(flatmem_status status) {
  switch (status) {
    case FLATMEM_STATUS_SUCCESS: return "FLATMEM_STATUS_SUCCESS";
    case FLATMEM_STATUS_INVALID_ARGUMENT: return "FLATMEM_STATUS_INVALID_ARGUMENT";
    case FLATMEM_STATUS_UNSUPPORTED: return "FLATMEM_STATUS_UNSUPPORTED";
    case FLATMEM_STATUS_OUT_OF_MEMORY: return "FLATMEM_STATUS_OUT_OF_MEMORY";
    case FLATMEM_STATUS_WORKSPACE_TOO_SMALL: return "FLATMEM_STATUS_WORKSPACE_TOO_SMALL";
    case FLATMEM_STATUS_NON_FINITE: return "FLATMEM_STATUS_NON_FINITE";
    case FLATMEM_STATUS_INTERNAL: return "FLATMEM_STATUS_INTERNAL";
    case FLATMEM_STATUS_TIMEOUT: return "FLATMEM_STATUS_TIMEOUT";
    case FLATMEM_STATUS_PEER_FAILURE: return "FLATMEM_STATUS_PEER_FAILURE";
    case FLATMEM_STATUS_COMM_POISONED: return "FLATMEM_STATUS_COMM_POISONED";
    case FLATMEM_STATUS_MAX: break;
  }
  return "FLATMEM_STATUS_UNKNOWN";
}

}  // extern "C"
