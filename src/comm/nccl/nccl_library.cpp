#include "comm/nccl/nccl_library.hpp"

#include <string>

#include "core/dynamic_library.hpp"
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

Loaded load() {
  Loaded out;
  const OpenedLibrary library =
      open_first_library("FLATMEM_NCCL_LIBRARY", {"libnccl.so.2", FLATMEM_NCCL_CONFIGURED_PATH});
  void *handle = library.handle;
  if (handle == nullptr) {
    out.status = FLATMEM_STATUS_UNSUPPORTED;
    out.message = "the NCCL library cannot be loaded (tried " + library.tried +
                  "); install NCCL 2 or set FLATMEM_NCCL_LIBRARY to libnccl.so.2";
    return out;
  }
  out.api.where = library.where;

  Api &a = out.api;
  std::string missing;
  bind_symbol(handle, "ncclGetVersion", a.GetVersion, missing);
  bind_symbol(handle, "ncclGetUniqueId", a.GetUniqueId, missing);
  bind_symbol(handle, "ncclCommInitRankConfig", a.CommInitRankConfig, missing);
  bind_symbol(handle, "ncclCommGetAsyncError", a.CommGetAsyncError, missing);
  bind_symbol(handle, "ncclCommFinalize", a.CommFinalize, missing);
  bind_symbol(handle, "ncclCommDestroy", a.CommDestroy, missing);
  bind_symbol(handle, "ncclCommAbort", a.CommAbort, missing);
  bind_symbol(handle, "ncclGetErrorString", a.GetErrorString, missing);
  bind_symbol(handle, "ncclGetLastError", a.GetLastError, missing);
  bind_symbol(handle, "ncclSend", a.Send, missing);
  bind_symbol(handle, "ncclRecv", a.Recv, missing);
  bind_symbol(handle, "ncclAllReduce", a.AllReduce, missing);
  bind_symbol(handle, "ncclGroupStart", a.GroupStart, missing);
  bind_symbol(handle, "ncclGroupEnd", a.GroupEnd, missing);
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
