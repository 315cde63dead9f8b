// The C entry points of flatmem's NCCL stand-in (libflatmem_nccl_standin.so,
// tests only): the subset of NCCL's API that flatmem's device transport calls
// (comm/nccl/nccl_library.hpp), over the matching engine (standin_engine.hpp)
// and device copies on one GPU (library_executor(): cuda_executor.cu). It is not NCCL: ranks must
// be threads of one process. Select it with FLATMEM_NCCL_LIBRARY=<path>.
//
// Non-blocking, as flatmem's communicators are (ncclConfig_t.blocking = 0):
// a call or group end posts its operations on the caller's thread, completes
// them on a thread of its own and answers ncclInProgress; the communicator
// reports ncclInProgress through ncclCommGetAsyncError until they are issued
// on the streams. A match that does not come within
// FLATMEM_NCCL_STANDIN_TIMEOUT_MS (default 30000) is an error
// (ncclSystemError), as is a size mismatch (ncclInvalidUsage); either, or
// ncclCommAbort of any rank, fails every rank of the communicator
// (ncclRemoteError from then on).
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "nccl_standin/standin_engine.hpp"

namespace ns = nccl_standin;

namespace {

// A rank, shared with the threads that complete its batches.
struct RankState {
  std::unique_ptr<ns::Comm> comm;
  std::mutex mutex;
  int pending = 0;     // batches still completing
  ns::Status failure;  // the first failed completion
  std::string last_error;
};
using States = std::vector<std::shared_ptr<RankState>>;

}  // namespace

struct ncclComm {
  std::shared_ptr<RankState> state;
};

namespace {

constexpr const char *prefix = "flatmem's NCCL stand-in (tests only, not NCCL): ";

thread_local std::string last_error_here;  // ncclGetLastError(NULL)

std::chrono::milliseconds deadline() {
  const char *text = std::getenv("FLATMEM_NCCL_STANDIN_TIMEOUT_MS");
  const long ms = text != nullptr ? std::atol(text) : 0;
  return std::chrono::milliseconds(ms > 0 ? ms : 30000);
}

ncclResult_t nccl_result(ns::Result result) {
  switch (result) {
    case ns::Result::success: return ncclSuccess;
    case ns::Result::invalid_argument: return ncclInvalidArgument;
    case ns::Result::invalid_usage: return ncclInvalidUsage;
    case ns::Result::timeout: return ncclSystemError;
    case ns::Result::peer_failed: return ncclRemoteError;
    case ns::Result::executor_failed: return ncclUnhandledCudaError;
  }
  return ncclInternalError;
}

// Records a failure's text (on the ranks and for ncclGetLastError(NULL)).
ncclResult_t report(const ns::Status &status, const States &ranks = {}) {
  if (status.ok()) return ncclSuccess;
  last_error_here = prefix + status.message;
  for (const std::shared_ptr<RankState> &rank : ranks) {
    std::lock_guard<std::mutex> lock(rank->mutex);
    rank->last_error = last_error_here;
  }
  return nccl_result(status.result);
}

bool element_type(ncclDataType_t type, ns::ElementType &out) {
  switch (type) {
    case ncclInt8: out = ns::ElementType::i8; return true;
    case ncclUint8: out = ns::ElementType::u8; return true;
    case ncclInt32: out = ns::ElementType::i32; return true;
    case ncclUint32: out = ns::ElementType::u32; return true;
    case ncclInt64: out = ns::ElementType::i64; return true;
    case ncclUint64: out = ns::ElementType::u64; return true;
    case ncclFloat16: out = ns::ElementType::f16; return true;
    case ncclBfloat16: out = ns::ElementType::bf16; return true;
    case ncclFloat32: out = ns::ElementType::f32; return true;
    case ncclFloat64: out = ns::ElementType::f64; return true;
    default: return false;
  }
}

thread_local States group_ranks;  // the ranks of the ops the open group collected

// Posts `ops` and completes them on a thread of its own (ncclInProgress), or
// here when nothing has to wait for another rank.
ncclResult_t issue(std::vector<ns::Op> ops, const States &ranks) {
  std::unique_ptr<ns::Batch> posted;
  if (const ns::Status s = ns::Batch::post(std::move(ops), posted); !s.ok()) return report(s, ranks);
  if (!posted) return ncclSuccess;
  if (!posted->waits()) return report(posted->complete(), ranks);  // sends: done when posted
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) device = 0;
  for (const std::shared_ptr<RankState> &rank : ranks) {
    std::lock_guard<std::mutex> lock(rank->mutex);
    ++rank->pending;
  }
  std::shared_ptr<ns::Batch> batch(std::move(posted));
  auto complete = [batch, ranks, device] {
    cudaSetDevice(device);
    const ns::Status done = batch->complete();
    for (const std::shared_ptr<RankState> &rank : ranks) {
      std::lock_guard<std::mutex> lock(rank->mutex);
      --rank->pending;
      if (!done.ok() && rank->failure.ok()) {
        rank->failure = done;
        rank->last_error = prefix + done.message;
      }
    }
  };
  try {
    std::thread(complete).detach();
  } catch (const std::system_error &) {  // no thread to be had: complete here
    complete();
  }
  return ncclInProgress;
}

ncclResult_t add(ns::Op op, ncclDataType_t type, ncclComm_t comm, cudaStream_t stream) {
  if (comm == nullptr) return report({ns::Result::invalid_argument, "no communicator"});
  if (!element_type(type, op.type))
    return report({ns::Result::invalid_argument, "data type " + std::to_string(int(type)) + " is not supported"},
                  {comm->state});
  op.comm = comm->state->comm.get();
  op.stream = stream;
  ns::Status collected;
  if (!ns::Group::collect(op, collected)) return issue({op}, {comm->state});
  if (collected.ok()) group_ranks.push_back(comm->state);
  return report(collected, {comm->state});
}

}  // namespace

extern "C" {

// What a test asks to know that FLATMEM_NCCL_LIBRARY names the stand-in.
const char *flatmem_nccl_standin_description() {
  return "flatmem's NCCL stand-in: ranks are threads of one process on one GPU (tests only, not NCCL)";
}

ncclResult_t ncclGetVersion(int *version) {
  if (version == nullptr) return ncclInvalidArgument;
  *version = NCCL_VERSION_CODE;  // the nccl.h it was built with: flatmem's version check passes
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
  if (id == nullptr) return ncclInvalidArgument;
  static std::atomic<unsigned long> serial{0};
  const std::string key = "flatmem-nccl-stand-in:" + std::to_string(getpid()) + ":" + std::to_string(serial++) + ":" +
                          std::to_string(std::random_device{}());
  std::memset(id->internal, 0, sizeof id->internal);
  std::memcpy(id->internal, key.data(), std::min(key.size(), sizeof id->internal - 1));
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t *) {
  if (comm == nullptr) return ncclInvalidArgument;
  *comm = nullptr;
  const std::string key(id.internal, strnlen(id.internal, sizeof id.internal));
  ns::Status status;
  auto joined = ns::Comm::join(key, nranks, rank, ns::library_executor(), deadline(), status);
  if (!joined) return report(status);
  *comm = new ncclComm{std::make_shared<RankState>()};
  (*comm)->state->comm = std::move(joined);
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *state) {
  if (comm == nullptr || state == nullptr) return ncclInvalidArgument;
  RankState &rank = *comm->state;
  const ns::Status health = rank.comm->health();
  std::lock_guard<std::mutex> lock(rank.mutex);
  if (!rank.failure.ok()) {
    *state = nccl_result(rank.failure.result);
  } else if (!health.ok()) {
    *state = nccl_result(health.result);
    rank.last_error = prefix + health.message;
  } else {
    *state = rank.pending > 0 ? ncclInProgress : ncclSuccess;
  }
  return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) { return comm == nullptr ? ncclInvalidArgument : ncclSuccess; }

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm != nullptr) comm->state->comm->abort();
  delete comm;
  return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "flatmem's NCCL stand-in: no error";
    case ncclUnhandledCudaError: return "flatmem's NCCL stand-in: a CUDA call failed";
    case ncclSystemError: return "flatmem's NCCL stand-in: a peer did not match in time";
    case ncclInvalidArgument: return "flatmem's NCCL stand-in: invalid argument";
    case ncclInvalidUsage: return "flatmem's NCCL stand-in: invalid usage (the ranks' calls do not match)";
    case ncclRemoteError: return "flatmem's NCCL stand-in: the communicator failed (a rank aborted or failed)";
    case ncclInProgress: return "flatmem's NCCL stand-in: in progress";
    default: return "flatmem's NCCL stand-in: unknown result";
  }
}

const char *ncclGetLastError(ncclComm_t comm) {
  // A failed call is known to the calling thread; a failed completion to the ranks.
  if (comm == nullptr) return last_error_here.c_str();
  std::lock_guard<std::mutex> lock(comm->state->mutex);
  thread_local std::string copy;
  copy = comm->state->last_error.empty() ? last_error_here : comm->state->last_error;
  return copy.c_str();
}

ncclResult_t ncclSend(const void *data, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  ns::Op op;
  op.kind = ns::Op::Kind::send;
  op.send = data;
  op.count = count;
  op.peer = peer;
  return add(op, type, comm, stream);
}

ncclResult_t ncclRecv(void *data, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  ns::Op op;
  op.kind = ns::Op::Kind::recv;
  op.recv = data;
  op.count = count;
  op.peer = peer;
  return add(op, type, comm, stream);
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  if (op != ncclSum)
    return report({ns::Result::invalid_argument, "only ncclSum is supported"},
                  comm != nullptr ? States{comm->state} : States{});
  ns::Op sum;
  sum.kind = ns::Op::Kind::all_reduce;
  sum.send = send;
  sum.recv = recv;
  sum.count = count;
  return add(sum, type, comm, stream);
}

ncclResult_t ncclGroupStart() {
  ns::Group::start();
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  std::vector<ns::Op> ops;
  if (const ns::Status s = ns::Group::end(ops); !s.ok()) return report(s);
  if (ops.empty()) {
    if (ns::Group::depth() == 0) group_ranks.clear();
    return ncclSuccess;
  }
  States ranks;
  ranks.swap(group_ranks);
  return issue(std::move(ops), ranks);
}

}  // extern "C"
