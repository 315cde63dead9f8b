// NCCL, opened at run time. libflatmem is not linked against libnccl: a
// library built with NCCL still loads (and runs everything but the device
// transport) on machines without it, the same rule as for the CUDA runtime
// (linked statically, the driver opened at the first CUDA call). The first
// flatmem_comm_init_device opens it, in this order:
//   1. $FLATMEM_NCCL_LIBRARY (a path or a file name), when set and non-empty;
//   2. "libnccl.so.2" through the dynamic loader's search (LD_LIBRARY_PATH,
//      ld.so.cache, ...);
//   3. the libnccl.so.2 next to the NCCL found when flatmem was configured
//      (FLATMEM_NCCL_CONFIGURED_PATH, e.g. /usr/local/cuda/lib/libnccl.so.2).
// The library must be NCCL 2.x with x >= 19 (non-blocking communicators with
// ncclCommFinalize and ncclGetLastError; ncclConfig_t as of nccl.h 2.28 is
// read by NCCL through its size/version fields).
#pragma once

#include <nccl.h>

#include <string>

namespace flatmem::comm::nccl {

// The NCCL entry points the device transport calls.
struct Api {
  ncclResult_t (*GetVersion)(int *version);
  ncclResult_t (*GetUniqueId)(ncclUniqueId *id);
  ncclResult_t (*CommInitRankConfig)(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank,
                                     ncclConfig_t *config);
  ncclResult_t (*CommGetAsyncError)(ncclComm_t comm, ncclResult_t *state);
  ncclResult_t (*CommFinalize)(ncclComm_t comm);
  ncclResult_t (*CommDestroy)(ncclComm_t comm);
  ncclResult_t (*CommAbort)(ncclComm_t comm);
  const char *(*GetErrorString)(ncclResult_t result);
  const char *(*GetLastError)(ncclComm_t comm);
  ncclResult_t (*Send)(const void *data, size_t count, ncclDataType_t type, int peer,
                       ncclComm_t comm, cudaStream_t stream);
  ncclResult_t (*Recv)(void *data, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                       cudaStream_t stream);
  ncclResult_t (*AllReduce)(const void *send, void *recv, size_t count, ncclDataType_t type,
                            ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
  ncclResult_t (*GroupStart)();
  ncclResult_t (*GroupEnd)();

  int version = 0;    // ncclGetVersion, e.g. 22809
  std::string where;  // the file that was opened
};

// The loaded library (opened once per process, never closed). Throws
// flatmem::Error UNSUPPORTED naming every place tried, or the version found,
// when NCCL cannot be used. Thread-safe.
const Api &api();

// "2.28.9" from 22809.
std::string version_text(int version);

}  // namespace flatmem::comm::nccl
