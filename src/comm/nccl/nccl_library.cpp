#include "comm/nccl/nccl_library.hpp"

#include <dlfcn.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "core/error.hpp"

#ifndef FLATMEM_NCCL_CONFIGURED_PATH
#define FLATMEM_NCCL_CONFIGURED_PATH ""
#endif

namespace flatmem::comm::nccl {
namespace {

// The oldest NCCL accepted at run time (see nccl_library.hpp).
constexpr int minimum_version = 21900;

struct Loaded {
  Api api{};
  flatmem_status status = FLATMEM_STATUS_SUCCESS;
  std::string message;  // why it cannot be used (status != SUCCESS)
};

template <typename F>
bool bind(void *handle, const char *name, F &slot, std::string &missing) {
  slot = reinterpret_cast<F>(dlsym(handle, name));
  if (slot == nullptr) missing += std::string(missing.empty() ? "" : ", ") + name;
  return slot != nullptr;
}

Loaded load() {
  Loaded out;
  std::vector<std::string> candidates;
  if (const char *env = std::getenv("FLATMEM_NCCL_LIBRARY"); env != nullptr && *env != '\0')
    candidates.emplace_back(env);
  candidates.emplace_back("libnccl.so.2");
  if (*FLATMEM_NCCL_CONFIGURED_PATH != '\0') candidates.emplace_back(FLATMEM_NCCL_CONFIGURED_PATH);

  std::string tried;
  void *handle = nullptr;
  for (const std::string &name : candidates) {
    dlerror();
    handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle != nullptr) {
      out.api.where = name;
      break;
    }
    const char *why = dlerror();
    tried += (tried.empty() ? "" : "; ") + name + " (" + (why ? why : "not found") + ")";
  }
  if (handle == nullptr) {
    out.status = FLATMEM_STATUS_UNSUPPORTED;
    out.message = "the NCCL library cannot be loaded (tried " + tried +
                  "); install NCCL 2 or set FLATMEM_NCCL_LIBRARY to libnccl.so.2";
    return out;
  }

  Api &a = out.api;
  std::string missing;
  bind(handle, "ncclGetVersion", a.GetVersion, missing);
  bind(handle, "ncclGetUniqueId", a.GetUniqueId, missing);
  bind(handle, "ncclCommInitRankConfig", a.CommInitRankConfig, missing);
  bind(handle, "ncclCommGetAsyncError", a.CommGetAsyncError, missing);
  bind(handle, "ncclCommFinalize", a.CommFinalize, missing);
  bind(handle, "ncclCommDestroy", a.CommDestroy, missing);
  bind(handle, "ncclCommAbort", a.CommAbort, missing);
  bind(handle, "ncclGetErrorString", a.GetErrorString, missing);
  bind(handle, "ncclGetLastError", a.GetLastError, missing);
  bind(handle, "ncclSend", a.Send, missing);
  bind(handle, "ncclRecv", a.Recv, missing);
  bind(handle, "ncclAllReduce", a.AllReduce, missing);
  bind(handle, "ncclGroupStart", a.GroupStart, missing);
  bind(handle, "ncclGroupEnd", a.GroupEnd, missing);
  // The handle stays open for the life of the process (NCCL keeps threads
  // and CUDA state that outlive any one communicator).
  if (!missing.empty()) {
    out.status = FLATMEM_STATUS_UNSUPPORTED;
    out.message = a.where + " is not a usable NCCL 2 (missing: " + missing + ")";
    return out;
  }
  if (a.GetVersion(&a.version) != ncclSuccess || a.version < minimum_version) {
    out.status = FLATMEM_STATUS_UNSUPPORTED;
    out.message = a.where + " is NCCL " + version_text(a.version) + "; flatmem needs NCCL >= " +
                  version_text(minimum_version);
  }
  return out;
}

}  // namespace

std::string version_text(int version) {
  if (version <= 0) return "(unknown version)";
  // NCCL >= 2.9: major * 10000 + minor * 100 + patch.
  return std::to_string(version / 10000) + "." + std::to_string(version / 100 % 100) + "." +
         std::to_string(version % 100);
}

const Api &api() {
  static const Loaded loaded = load();
  if (loaded.status != FLATMEM_STATUS_SUCCESS) fail(loaded.status, loaded.message);
  return loaded.api;
}

}  // namespace flatmem::comm::nccl
