#include "comm/nccl/nccl_transport.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "core/cuda/device.hpp"
#include "core/error.hpp"

namespace flatmem::comm {

bool device_transport_built() { return true; }

namespace nccl {
namespace {

using Clock = NcclTransport::Clock;
using flatmem::cuda::check_device_pointer;
using flatmem::cuda::DeviceGuard;

// Between polls of a pending NCCL or CUDA state: 20 us, doubling up to 1 ms.
class Backoff {
 public:
  void pause() {
    std::this_thread::sleep_for(delay_);
    delay_ = std::min(delay_ * 2, std::chrono::microseconds(1000));
  }

 private:
  std::chrono::microseconds delay_{20};
};

// Time left until `deadline`, at least 1 ms (a host wait of 0 would mean
// "the default timeout").
Milliseconds remaining(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<Milliseconds>(deadline - Clock::now());
  return std::max(left, Milliseconds(1));
}

const char *dtype_name(DeviceSumType type) {
  switch (type) {
    case DeviceSumType::f32: return "fp32";
    case DeviceSumType::f64: return "fp64";
    case DeviceSumType::i32: return "int32";
    case DeviceSumType::i64: return "int64";
    case DeviceSumType::bf16: return "bf16";
    case DeviceSumType::f16: return "fp16";
  }
  return "?";
}

ncclDataType_t nccl_type(DeviceSumType type) {
  switch (type) {
    case DeviceSumType::f32: return ncclFloat32;
    case DeviceSumType::f64: return ncclFloat64;
    case DeviceSumType::i32: return ncclInt32;
    case DeviceSumType::i64: return ncclInt64;
    case DeviceSumType::bf16: return ncclBfloat16;
    case DeviceSumType::f16: return ncclFloat16;
  }
  invalid("all_reduce: unknown device element type");
}

std::size_t element_bytes(DeviceSumType type) {
  switch (type) {
    case DeviceSumType::f64:
    case DeviceSumType::i64: return 8;
    case DeviceSumType::bf16:
    case DeviceSumType::f16: return 2;
    default: return 4;
  }
}

bool overlap(const void *a, const void *b, std::size_t bytes) {
  const auto x = reinterpret_cast<std::uintptr_t>(a), y = reinterpret_cast<std::uintptr_t>(b);
  return bytes > 0 && x < y + bytes && y < x + bytes;
}

std::string plural(std::uint64_t n, const char *one, const char *many) {
  return std::to_string(n) + " " + (n == 1 ? one : many);
}

// Makes `device` current without throwing (destructor, abort); restores.
class QuietDeviceGuard {
 public:
  explicit QuietDeviceGuard(int device) {
    int current = -1;
    if (cudaGetDevice(&current) == cudaSuccess && current != device && cudaSetDevice(device) == cudaSuccess)
      previous_ = current;
    cudaGetLastError();
  }
  ~QuietDeviceGuard() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  QuietDeviceGuard(const QuietDeviceGuard &) = delete;
  QuietDeviceGuard &operator=(const QuietDeviceGuard &) = delete;

 private:
  int previous_ = -1;
};

// ncclCommAbort frees NCCL's device memory, and cudaFree waits for all work on the device: a
// stream held by other work (seen on an H200: a 3 s host function on the caller's stream) holds
// the abort, and whoever called it. So the abort runs on a thread of its own and the caller
// returns at its deadline; NCCL kernels still on a stream see the abort flag and exit. At exit
// the process waits up to 5 s for aborts still running (NCCL must not be torn down under them).
std::atomic<int> &aborts_running() {
  static std::atomic<int> count{0};
  return count;
}

void wait_for_aborts() {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (aborts_running().load() > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

void abort_in_background(const Api &api, ncclComm_t comm, int device) noexcept {
  static const bool registered = std::atexit(wait_for_aborts) == 0;
  (void)registered;
  const Api *nccl = &api;  // the process-lifetime NCCL table (nccl_library.hpp)
  aborts_running().fetch_add(1);
  try {
    std::thread([nccl, comm, device] {
      {
        QuietDeviceGuard guard(device);
        nccl->CommAbort(comm);
      }
      aborts_running().fetch_sub(1);
    }).detach();
  } catch (...) {  // no thread to be had: abort here, waiting
    QuietDeviceGuard guard(device);
    nccl->CommAbort(comm);
    aborts_running().fetch_sub(1);
  }
}

}  // namespace

// --- the transport ------------------------------------------------------------------

NcclTransport::NcclTransport(Communicator &host, const Api &api, int device, ncclComm_t comm,
                             Milliseconds finalize_timeout)
    : host_(host),
      api_(api),
      device_(device),
      rank_(host.rank()),
      size_(host.size()),
      comm_(comm),
      finalize_timeout_(finalize_timeout) {}

NcclTransport::~NcclTransport() {
  if (comm_ == nullptr) return;
  if (group_depth_ > 0) {  // a group left open: end it, abort what it issued
    abort();
    return;
  }
  QuietDeviceGuard guard(device_);
  ncclResult_t state = ncclInProgress;
  bool healthy = api_.CommGetAsyncError(comm_, &state) == ncclSuccess && state == ncclSuccess;
  if (healthy) {
    const ncclResult_t started = api_.CommFinalize(comm_);
    healthy = started == ncclSuccess || started == ncclInProgress;
    const auto deadline = Clock::now() + finalize_timeout_;
    Backoff backoff;
    while (healthy) {
      if (api_.CommGetAsyncError(comm_, &state) != ncclSuccess) {
        healthy = false;
      } else if (state == ncclSuccess) {
        break;
      } else if (state != ncclInProgress || Clock::now() >= deadline) {
        healthy = false;
      } else {
        backoff.pause();
      }
    }
  }
  if (healthy) {
    api_.CommDestroy(comm_);
    comm_ = nullptr;
  } else {
    abort();
  }
}

void NcclTransport::abort() noexcept {
  if (comm_ == nullptr) return;
  {
    QuietDeviceGuard guard(device_);
    // NCCL groups are per thread and must be closed (here, on the caller's thread); closing one
    // may issue what it collected, which the abort then stops.
    while (group_depth_ > 0) {
      api_.GroupEnd();
      --group_depth_;
    }
  }
  ncclComm_t comm = comm_;
  comm_ = nullptr;
  abort_in_background(api_, comm, device_);
}

std::string NcclTransport::on_device() const { return " on CUDA device " + std::to_string(device_); }

std::string NcclTransport::nccl_text(ncclResult_t result) const {
  std::string text = std::string("NCCL: ") + api_.GetErrorString(result);
  const char *last = api_.GetLastError(comm_);
  if (last != nullptr && *last != '\0') text += std::string(" (last NCCL error: ") + last + ")";
  return text;
}

void NcclTransport::die(flatmem_status status, const std::string &message) {
  abort();
  host_.poison(status, message);
  fail(status, message);
}

void NcclTransport::watch_host() {
  std::string first;
  if (host_.health(&first) == FLATMEM_STATUS_SUCCESS) return;
  abort();
  fail(FLATMEM_STATUS_COMM_POISONED, first);
}

void NcclTransport::check_usable(const std::string &what) {
  host_.check_healthy();
  if (comm_ == nullptr)
    fail(FLATMEM_STATUS_COMM_POISONED, what, ": the NCCL communicator", on_device(),
         " was aborted earlier");
  ncclResult_t state = ncclSuccess;
  const ncclResult_t r = api_.CommGetAsyncError(comm_, &state);
  if (r != ncclSuccess)
    die(FLATMEM_STATUS_PEER_FAILURE, what + on_device() + ": ncclCommGetAsyncError failed, " + nccl_text(r));
  if (state != ncclSuccess && state != ncclInProgress)
    die(FLATMEM_STATUS_PEER_FAILURE,
        what + on_device() + ": an earlier NCCL operation failed asynchronously, " + nccl_text(state));
}

void NcclTransport::settle(const std::string &what, Clock::time_point deadline, Milliseconds timeout) {
  Backoff backoff;
  for (;;) {
    ncclResult_t state = ncclInProgress;
    const ncclResult_t r = api_.CommGetAsyncError(comm_, &state);
    if (r != ncclSuccess)
      die(FLATMEM_STATUS_PEER_FAILURE, what + on_device() + ": ncclCommGetAsyncError failed, " + nccl_text(r));
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) die(FLATMEM_STATUS_PEER_FAILURE, what + on_device() + ": " + nccl_text(state));
    watch_host();
    if (Clock::now() >= deadline)
      die(FLATMEM_STATUS_TIMEOUT, what + on_device() + ": timed out after " +
                                      std::to_string(timeout.count()) +
                                      " ms waiting for NCCL to issue it (a peer that never joins "
                                      "the same call, or a wedged peer)");
    backoff.pause();
  }
}

void NcclTransport::complete(ncclResult_t result, const std::string &what, Clock::time_point deadline,
                             Milliseconds timeout) {
  if (result == ncclSuccess) return;
  if (result == ncclInProgress) return settle(what, deadline, timeout);
  die(FLATMEM_STATUS_PEER_FAILURE, what + on_device() + ": " + nccl_text(result));
}

void NcclTransport::check_buffer(const void *p, std::size_t bytes, const char *name) const {
  if (bytes == 0) return;  // nothing is read or written (data may be NULL)
  check_device_pointer(p, name, device_);
}

void NcclTransport::check_peer(int peer, const char *name) const {
  if (peer < 0 || peer >= size_)
    invalid(name, " ", peer, " is out of range: the communicator has ", size_, " ranks (0 .. ",
            size_ - 1, ")");
}

void NcclTransport::begin_group() {
  const ncclResult_t r = api_.GroupStart();
  if (r != ncclSuccess) die(FLATMEM_STATUS_PEER_FAILURE, "device group_start" + on_device() + ": " + nccl_text(r));
  if (group_depth_++ == 0) group_ = GroupSummary{};
}

void NcclTransport::end_group(const std::string &what, Clock::time_point deadline, Milliseconds timeout) {
  --group_depth_;
  const ncclResult_t r = api_.GroupEnd();
  complete(r, what, deadline, timeout);
}

void NcclTransport::send(const void *data, std::size_t bytes, int peer, void *stream,
                         Milliseconds timeout) {
  point_to_point(true, const_cast<void *>(data), bytes, peer, stream, timeout);
}

void NcclTransport::recv(void *data, std::size_t bytes, int peer, void *stream, Milliseconds timeout) {
  point_to_point(false, data, bytes, peer, stream, timeout);
}

void NcclTransport::point_to_point(bool sending, void *data, std::size_t bytes, int peer, void *stream,
                                   Milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  const std::string what = std::string(sending ? "device send to rank " : "device receive from rank ") +
                           std::to_string(peer) + " (" + plural(bytes, "byte", "bytes") + ")";
  check_peer(peer, "peer");
  check_buffer(data, bytes, "buffer");
  check_usable(what);
  DeviceGuard guard(device_, "communicator device");
  const auto s = static_cast<cudaStream_t>(stream);
  const ncclResult_t r = sending ? api_.Send(data, bytes, ncclUint8, peer, comm_, s)
                                 : api_.Recv(data, bytes, ncclUint8, peer, comm_, s);
  if (group_depth_ > 0) {
    ++(sending ? group_.sends : group_.receives);
    group_.bytes += bytes;
  }
  complete(r, what, deadline, timeout);
}

void NcclTransport::group_start() {
  check_usable("device group_start");
  DeviceGuard guard(device_, "communicator device");
  begin_group();
}

void NcclTransport::group_end(Milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  if (group_depth_ == 0) invalid("group_end: no device group is open (call flatmem_comm_group_start first)");
  const std::string what = "device group_end (" + plural(group_.sends, "send", "sends") + ", " +
                           plural(group_.receives, "receive", "receives") + ", " +
                           plural(group_.collectives, "collective", "collectives") + ", " +
                           plural(group_.bytes, "byte", "bytes") + ")";
  check_usable(what);
  DeviceGuard guard(device_, "communicator device");
  end_group(what, deadline, timeout);
}

void NcclTransport::ring_shift(const void *send, void *recv, std::size_t bytes, void *stream,
                               Milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  const int next = (rank_ + 1) % size_, previous = (rank_ - 1 + size_) % size_;
  const std::string what = "device ring_shift (send " + plural(bytes, "byte", "bytes") + " to rank " +
                           std::to_string(next) + ", receive from rank " + std::to_string(previous) + ")";
  check_buffer(send, bytes, "send");
  check_buffer(recv, bytes, "recv");
  if (overlap(send, recv, bytes)) invalid("ring_shift: recv overlaps send (", bytes, " bytes each)");
  check_usable(what);
  DeviceGuard guard(device_, "communicator device");
  const auto s = static_cast<cudaStream_t>(stream);
  if (size_ == 1) {
    if (bytes == 0) return;
    const cudaError_t status = cudaMemcpyAsync(recv, send, bytes, cudaMemcpyDeviceToDevice, s);
    if (status != cudaSuccess) {
      cudaGetLastError();
      die(FLATMEM_STATUS_PEER_FAILURE, what + on_device() + ": cudaMemcpyAsync failed: " + cudaGetErrorString(status));
    }
    return;
  }
  begin_group();
  complete(api_.Send(send, bytes, ncclUint8, next, comm_, s), what, deadline, timeout);
  complete(api_.Recv(recv, bytes, ncclUint8, previous, comm_, s), what, deadline, timeout);
  if (group_depth_ > 1) {  // inside the caller's group: issued by its group_end
    ++group_.sends;
    ++group_.receives;
    group_.bytes += 2 * std::uint64_t(bytes);
  }
  end_group(what, deadline, timeout);
}

void NcclTransport::all_reduce_sum(const void *send, void *recv, std::size_t count, DeviceSumType type,
                                   void *stream, Milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  const std::size_t bytes = count * element_bytes(type);
  const std::string what = "device all_reduce (sum of " + std::to_string(count) + " " + dtype_name(type) +
                           ", " + plural(bytes, "byte", "bytes") + ", " + std::to_string(size_) + " ranks)";
  check_buffer(send, bytes, "send");
  check_buffer(recv, bytes, "recv");
  if (send != recv && overlap(send, recv, bytes))
    invalid("all_reduce: recv partially overlaps send (in place needs recv == send)");
  check_usable(what);
  DeviceGuard guard(device_, "communicator device");
  const ncclResult_t r =
      api_.AllReduce(send, recv, count, nccl_type(type), ncclSum, comm_, static_cast<cudaStream_t>(stream));
  if (group_depth_ > 0) {
    ++group_.collectives;
    group_.bytes += bytes;
  }
  complete(r, what, deadline, timeout);
}

void NcclTransport::synchronize(void *stream, Milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  std::ostringstream name;
  name << "device synchronize (stream " << stream << ")";
  const std::string what = name.str();
  if (group_depth_ > 0)
    invalid("synchronize: a device group is open (flatmem_comm_group_start without group_end); "
            "its transfers are not issued yet");
  check_usable(what);
  DeviceGuard guard(device_, "communicator device");
  const auto s = static_cast<cudaStream_t>(stream);
  Backoff backoff;
  for (;;) {
    const cudaError_t status = cudaStreamQuery(s);
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = api_.CommGetAsyncError(comm_, &state);
    if (r != ncclSuccess)
      die(FLATMEM_STATUS_PEER_FAILURE, what + on_device() + ": ncclCommGetAsyncError failed, " + nccl_text(r));
    if (state != ncclSuccess && state != ncclInProgress)
      die(FLATMEM_STATUS_PEER_FAILURE, what + on_device() + ": " + nccl_text(state));
    if (status == cudaSuccess) return;
    if (status != cudaErrorNotReady) {
      cudaGetLastError();
      die(FLATMEM_STATUS_PEER_FAILURE,
          what + on_device() + ": the stream failed: " + cudaGetErrorString(status));
    }
    watch_host();
    if (Clock::now() >= deadline)
      die(FLATMEM_STATUS_TIMEOUT, what + on_device() + ": the stream has not finished after " +
                                      std::to_string(timeout.count()) +
                                      " ms (a peer that never joins a transfer, or work still "
                                      "running); the NCCL communicator was aborted");
    backoff.pause();
  }
}

}  // namespace nccl

// --- creation -----------------------------------------------------------------------

namespace {

// What each rank reports before the NCCL unique id is sent: whether it can
// take part (NCCL loaded, the device usable, rank 0's id made).
struct Readiness {
  std::int32_t status = FLATMEM_STATUS_SUCCESS;
  std::int32_t nccl_version = 0;
};

}  // namespace

std::unique_ptr<DeviceTransport> create_device_transport(Communicator &host, int cuda_device,
                                                         Milliseconds timeout) {
  using nccl::NcclTransport;
  using Clock = NcclTransport::Clock;
  const auto deadline = Clock::now() + timeout;
  const std::string what = "init_device (CUDA device " + std::to_string(cuda_device) + ")";
  host.check_healthy();
  if (cuda_device < 0) invalid("init_device: cuda_device ", cuda_device, " is negative");

  // 1. Local preparation. A failure here is not sent as a poison: every rank
  //    learns of it from the readiness exchange below and fails the same way,
  //    and the host communicator stays usable.
  const nccl::Api *api = nullptr;
  ncclUniqueId id{};
  Readiness mine;
  std::string local_error;
  try {
    api = &nccl::api();
    mine.nccl_version = api->version;
    int count = 0;
    const cudaError_t counted = cudaGetDeviceCount(&count);
    cudaGetLastError();
    if (counted != cudaSuccess)
      fail(FLATMEM_STATUS_UNSUPPORTED, what, ": the CUDA runtime finds no usable device (",
           cudaGetErrorString(counted), ")");
    if (cuda_device >= count)
      invalid(what, ": cuda_device ", cuda_device, " does not exist (this process sees ", count,
              count == 1 ? " CUDA device)" : " CUDA devices)");
    flatmem::cuda::DeviceGuard guard(cuda_device, "init_device: cuda_device");
    const cudaError_t context = cudaFree(nullptr);  // the device's primary context, made now
    cudaGetLastError();
    if (context != cudaSuccess)
      fail(FLATMEM_STATUS_UNSUPPORTED, what, ": the CUDA device cannot be used (", cudaGetErrorString(context), ")");
    if (host.rank() == 0) {
      const ncclResult_t r = api->GetUniqueId(&id);
      if (r != ncclSuccess)
        fail(FLATMEM_STATUS_UNSUPPORTED, what, ": ncclGetUniqueId failed: NCCL: ", api->GetErrorString(r), " (",
             api->GetLastError(nullptr), ")");
    }
  } catch (const Error &e) {
    mine.status = e.status();
    local_error = e.what();
    if (local_error.rfind("init_device", 0) != 0) local_error = what + ": " + local_error;
  }

  // 2. Every rank's readiness (a host collective: a dead peer fails it and
  //    poisons the handle, as every host collective does).
  if (host.size() > 1) {
    std::vector<Readiness> all(std::size_t(host.size()));
    host.all_gather(&mine, all.data(), sizeof mine, nccl::remaining(deadline),
                    "init_device: readiness of every rank");
    if (mine.status == FLATMEM_STATUS_SUCCESS) {
      for (int r = 0; r < host.size(); ++r) {
        const Readiness &peer = all[std::size_t(r)];
        if (peer.status != FLATMEM_STATUS_SUCCESS)
          fail(static_cast<flatmem_status>(peer.status), what, ": rank ", r,
               " cannot create its NCCL communicator (", flatmem_status_string(static_cast<flatmem_status>(peer.status)),
               "; its own error says why); no NCCL communicator was created");
      }
      for (int r = 0; r < host.size(); ++r)
        if (all[std::size_t(r)].nccl_version / 100 != mine.nccl_version / 100)
          fail(FLATMEM_STATUS_UNSUPPORTED, what, ": rank ", r, " runs NCCL ",
               nccl::version_text(all[std::size_t(r)].nccl_version), " but this rank runs NCCL ",
               nccl::version_text(mine.nccl_version), "; all ranks need the same NCCL 2.x");
    }
  }
  if (mine.status != FLATMEM_STATUS_SUCCESS) fail(static_cast<flatmem_status>(mine.status), local_error);

  // 3. Rank 0's unique id to every rank.
  if (host.size() > 1)
    host.broadcast(&id, sizeof id, 0, nccl::remaining(deadline), "init_device: NCCL unique id");

  // 4. Non-blocking initialisation, polled under the deadline. From here on a
  //    failure aborts NCCL and poisons the host communicator (the other ranks
  //    are inside the same NCCL initialisation).
  flatmem::cuda::DeviceGuard guard(cuda_device, "init_device: cuda_device");
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  config.commName = "flatmem";
  ncclComm_t comm = nullptr;
  const auto give_up = [&](flatmem_status status, const std::string &why) {
    std::string text = what + ": " + why;
    const char *last = api->GetLastError(comm);
    if (last != nullptr && *last != '\0') text += std::string(" (last NCCL error: ") + last + ")";
    if (comm != nullptr) api->CommAbort(comm);
    host.poison(status, text);
    fail(status, text);
  };
  ncclResult_t r = api->CommInitRankConfig(&comm, host.size(), id, host.rank(), &config);
  if (r != ncclSuccess && r != ncclInProgress)
    give_up(FLATMEM_STATUS_PEER_FAILURE, std::string("ncclCommInitRankConfig failed: NCCL: ") + api->GetErrorString(r));
  if (comm == nullptr) give_up(FLATMEM_STATUS_PEER_FAILURE, "ncclCommInitRankConfig returned no communicator");
  nccl::Backoff backoff;
  for (;;) {
    ncclResult_t state = ncclInProgress;
    r = api->CommGetAsyncError(comm, &state);
    if (r != ncclSuccess)
      give_up(FLATMEM_STATUS_PEER_FAILURE, std::string("ncclCommGetAsyncError failed: NCCL: ") + api->GetErrorString(r));
    if (state == ncclSuccess) break;
    if (state != ncclInProgress)
      give_up(FLATMEM_STATUS_PEER_FAILURE,
              std::string("NCCL initialisation failed: NCCL: ") + api->GetErrorString(state));
    std::string first;
    if (host.health(&first) != FLATMEM_STATUS_SUCCESS) {
      api->CommAbort(comm);
      fail(FLATMEM_STATUS_COMM_POISONED, first);
    }
    if (Clock::now() >= deadline)
      give_up(FLATMEM_STATUS_TIMEOUT, "NCCL initialisation did not finish within " + std::to_string(timeout.count()) +
                                          " ms (a rank that never called init_device, two ranks on one GPU, "
                                          "or an unreachable peer)");
    backoff.pause();
  }
  return std::make_unique<NcclTransport>(host, *api, cuda_device, comm, timeout);
}

}  // namespace flatmem::comm
