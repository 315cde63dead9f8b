// The ZeRO relay's device transfers (see ../relay_links.hpp and "On the
// device" under "ZeRO relay" in flatmem/cyclic.h).
//
// Ordering, without host waits except take() and finish():
//   advance(tau)  copies on the shards' streams (each after the group of
//                 tau - 1, the last to read the slot it overwrites), each
//                 marked; the transfer stream waits for every mark made
//                 since the last group (those copies, the takes of tau - 1),
//                 then ONE NCCL group, then last_group_;
//   take(tau)     host wait for the transfer stream (the group of tau is its
//                 last work), then the copy into `full` on the caller's
//                 stream, marked.
// Slots: the stage used at tau lives in slot tau % K from the group of tau
// (received, or gathered on rank 0) until it was sent on (tau + offset
// difference < tau + K) and taken; shard copies for rank 0's gather g in
// copy slot g % 3 from their contribution time (g - 1 or g) to the group of g.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <string>
#include <vector>

#include "comm/device_transport.hpp"
#include "core/cuda/device.hpp"
#include "cyclic/cuda/abort_on_failure.hpp"
#include "cyclic/relay_links.hpp"

namespace flatmem::cyclic {
namespace {

using flatmem::cuda::DeviceGuard;

void check(cudaError_t status, const std::string &what) {
  if (status != cudaSuccess)  // the message is built only for a failure
    cuda::check_launch(status, ("cyclic device memory: relay: " + what).c_str());
}

constexpr int copy_slots = 3;

class CudaRelayLinks final : public RelayLinks {
 public:
  CudaRelayLinks(comm::Communicator &host, const RelayPlan &plan, comm::Milliseconds timeout,
                 std::function<void(std::int64_t)> account_sent)
      : host_(host), plan_(plan), device_(host.device()->device()), rank_(host.rank()), world_(host.size()),
        timeout_(timeout), account_sent_(std::move(account_sent)), slots_(plan.staging_buffers()) {
    nccl_ = comm::create_device_transport(host, device_, timeout);
    DeviceGuard guard(device_, "communicator device");
    try {
      check(cudaStreamCreateWithFlags(&transfer_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
      check(cudaEventCreateWithFlags(&last_group_, cudaEventDisableTiming), "cudaEventCreate");
      check(cudaMalloc(reinterpret_cast<void **>(&handshake_), std::size_t(world_) + 1), "cudaMalloc (handshake)");
      check(cudaMemsetAsync(handshake_, 0, std::size_t(world_) + 1, transfer_), "cudaMemsetAsync (handshake)");
    } catch (const Error &e) {
      // The peers' NCCL communicator exists now: they must not wait for ours.
      host.poison(e.status(), "cyclic parameter relay, rank " + std::to_string(rank_) + ": " + e.what());
      release();
      throw;
    }
    try {
      connect();  // poisons on failure (run)
    } catch (const Error &) {
      release();
      throw;
    }
  }

  ~CudaRelayLinks() override { release(); }
  CudaRelayLinks(const CudaRelayLinks &) = delete;
  CudaRelayLinks &operator=(const CudaRelayLinks &) = delete;

  int device() const override { return device_; }
  std::int64_t staging_bytes() const override { return std::int64_t(full_bytes_ + copy_bytes_); }

  void advance(std::int64_t tau, const std::vector<DeviceShard> &shards, std::size_t element) override {
    run("cyclic parameter relay, time step " + std::to_string(tau), [&] {
      DeviceGuard guard(device_, "communicator device");
      allocate(element);
      copy_shards(tau, shards);
      group(tau);
    });
  }

  void take(std::int64_t tau, void *full, std::size_t bytes, void *stream, comm::Milliseconds timeout) override {
    if (!synced_) {
      // The whole group of tau: this rank's receive, and also its sends (to
      // rank + 1, its shard to rank 0) and the copies they wait for.
      run("the relay group of time step " + std::to_string(tau) + " (the transfers with ranks " + neighbours(tau) +
              ", and this rank's copies on the shards' streams)",
          [&] { nccl_->synchronize(transfer_, timeout); });
      synced_ = true;
    }
    run("copying the relayed stage out", [&] {
      DeviceGuard guard(device_, "communicator device");
      const auto s = static_cast<cudaStream_t>(stream);
      check(cudaMemcpyAsync(full, slot(tau), bytes, cudaMemcpyDeviceToDevice, s), "cudaMemcpyAsync (full)");
      mark(s);
    });
  }

  void finish(comm::Milliseconds timeout) override {
    run("the last relay groups", [&] { nccl_->synchronize(transfer_, timeout); });
  }

 private:
  template <typename F>
  void run(const std::string &what, F f) {
    abort_on_failure(host_, nccl_.get(), what, f);
  }

  // One 1-byte transfer along each relay link (r -> r + 1, k -> 0), so that
  // NCCL's lazy connection handshake happens here, within the create timeout.
  void connect() {
    run("cyclic create: connecting the parameter relay", [&] {
      DeviceGuard guard(device_, "communicator device");
      nccl_->group_start();
      if (rank_ > 0) nccl_->recv(handshake_ + 1 + rank_ - 1, 1, rank_ - 1, transfer_, timeout_);
      if (rank_ + 1 < world_) nccl_->send(handshake_, 1, rank_ + 1, transfer_, timeout_);
      if (rank_ > 0) nccl_->send(handshake_, 1, 0, transfer_, timeout_);
      if (rank_ == 0)
        for (int k = 1; k < world_; ++k) nccl_->recv(handshake_ + 1 + k, 1, k, transfer_, timeout_);
      nccl_->group_end(timeout_);
      nccl_->synchronize(transfer_, timeout_);
    });
  }

  // "1, 2 and 0": the peers of the group of tau.
  std::string neighbours(std::int64_t tau) const {
    std::vector<int> peers;
    const auto gather = plan_.item(0, tau);
    if (gather && rank_ == 0)
      for (int k = 1; k < world_; ++k)
        if (const auto [b, e] = plan_.shard(gather->stage, k); e > b) peers.push_back(k);
    if (gather && rank_ > 0) peers.push_back(0);
    if (rank_ > 0 && plan_.item(rank_, tau)) peers.push_back(rank_ - 1);
    if (rank_ + 1 < world_ && plan_.item(rank_ + 1, tau)) peers.push_back(rank_ + 1);
    std::sort(peers.begin(), peers.end());
    peers.erase(std::unique(peers.begin(), peers.end()), peers.end());
    std::string text;
    for (std::size_t i = 0; i < peers.size(); ++i)
      text += (i == 0 ? "" : i + 1 == peers.size() ? " and " : ", ") + std::to_string(peers[i]);
    return text.empty() ? "none" : text;
  }

  void allocate(std::size_t element) {
    if (full_ != nullptr || element == 0) return;
    std::int64_t largest_shard = 1;
    for (std::int32_t j = 0; j < plan_.schedule.stages; ++j) {
      const auto [b, e] = plan_.shard(j, 0);  // shard 0 is the largest
      largest_shard = std::max(largest_shard, e - b);
    }
    stage_bytes_ = std::size_t(plan_.largest()) * element;
    copy_each_ = std::size_t(largest_shard) * element;
    full_bytes_ = std::size_t(slots_) * stage_bytes_;
    copy_bytes_ = std::size_t(copy_slots) * copy_each_;
    check(cudaMalloc(reinterpret_cast<void **>(&full_), full_bytes_),
          "the relay staging (" + std::to_string(slots_) + " full stages, " + std::to_string(full_bytes_) + " bytes)");
    check(cudaMalloc(reinterpret_cast<void **>(&copies_), copy_bytes_),
          "the shard copies (" + std::to_string(copy_bytes_) + " bytes)");
    element_ = element;
  }

  char *slot(std::int64_t tau) const { return full_ + std::size_t(tau % slots_) * stage_bytes_; }
  char *copy_slot(std::int64_t g) const { return copies_ + std::size_t(g % copy_slots) * copy_each_; }
  std::size_t bytes_of(std::int32_t stage) const { return std::size_t(plan_.count[std::size_t(stage)]) * element_; }

  // A copy of `n` bytes on the shard's stream, after the last group (which
  // read the slot last), marked for the next group.
  void copy_on(const DeviceShard &shard, char *to, std::size_t n) {
    // After the last group, which read the slot last. A host wait (bounded)
    // rather than a device one: the caller's stream must never wait on the
    // peers without a deadline (a dead peer would hang its synchronisation).
    if (groups_ > 0 && !synced_) {
      nccl_->synchronize(transfer_, timeout_);
      synced_ = true;
    }
    const auto s = static_cast<cudaStream_t>(shard.stream);
    check(cudaMemcpyAsync(to, shard.data, n, cudaMemcpyDeviceToDevice, s), "cudaMemcpyAsync (shard)");
    mark(s);
  }

  void copy_shards(std::int64_t tau, const std::vector<DeviceShard> &shards) {
    for (std::int64_t g = tau; g <= tau + 1; ++g) {
      const auto gather = plan_.item(0, g);
      if (!gather) continue;
      const auto [b, e] = plan_.shard(gather->stage, rank_);
      if (e == b) continue;
      const std::size_t n = std::size_t(e - b) * element_;
      const DeviceShard &shard = shards[std::size_t(gather->stage)];
      // Rank 0 copies into its own gather at g; an owner at the contribution time.
      if (rank_ == 0 ? g != tau : plan_.contribution_time(*gather) != tau) continue;
      if (plan_.version_held(gather->stage, tau) != gather->version())
        fail(FLATMEM_STATUS_INTERNAL, "rank ", rank_, " holds version ", plan_.version_held(gather->stage, tau),
             " of stage ", gather->stage, " at time step ", tau, ", the gather of time step ", g, " needs ",
             gather->version());
      copy_on(shard, rank_ == 0 ? slot(tau) + std::size_t(b) * element_ : copy_slot(g), n);
    }
  }

  void group(std::int64_t tau) {
    // Everything marked on the callers' and shards' streams since the last group.
    for (cudaEvent_t e : pending_) {
      check(cudaStreamWaitEvent(transfer_, e, 0), "cudaStreamWaitEvent");
      free_.push_back(e);
    }
    pending_.clear();
    struct Op {
      bool send;
      char *data;
      std::size_t bytes;
      int peer;
    };
    std::vector<Op> ops;
    if (const auto gather = plan_.item(0, tau)) {
      if (rank_ == 0) {
        for (int k = 1; k < world_; ++k) {
          const auto [b, e] = plan_.shard(gather->stage, k);
          if (e > b) ops.push_back({false, slot(tau) + std::size_t(b) * element_, std::size_t(e - b) * element_, k});
        }
      } else if (const auto [b, e] = plan_.shard(gather->stage, rank_); e > b) {
        ops.push_back({true, copy_slot(tau), std::size_t(e - b) * element_, 0});
      }
    }
    if (rank_ > 0)
      if (const auto mine = plan_.item(rank_, tau)) ops.push_back({false, slot(tau), bytes_of(mine->stage), rank_ - 1});
    if (rank_ + 1 < world_)
      if (const auto next = plan_.item(rank_ + 1, tau)) {
        // This rank used the same stage and step offset(r+1) - offset(r) time steps earlier.
        const std::int64_t used = tau - (plan_.schedule.offset(rank_ + 1) - plan_.schedule.offset(rank_));
        const auto own = plan_.item(rank_, used);
        if (!own || own->stage != next->stage || own->step != next->step || used == tau)
          fail(FLATMEM_STATUS_INTERNAL, "rank ", rank_, " has no relay at time step ", used, " to pass on for time step ",
               tau);
        ops.push_back({true, slot(used), bytes_of(next->stage), rank_ + 1});
      }
    if (!ops.empty()) {
      nccl_->group_start();
      for (const Op &op : ops) {
        if (op.send) {
          nccl_->send(op.data, op.bytes, op.peer, transfer_, timeout_);
          account_sent_(std::int64_t(op.bytes));
        } else {
          nccl_->recv(op.data, op.bytes, op.peer, transfer_, timeout_);
        }
      }
      nccl_->group_end(timeout_);
    }
    check(cudaEventRecord(last_group_, transfer_), "cudaEventRecord");
    ++groups_;
    synced_ = false;
  }

  void mark(cudaStream_t s) {
    cudaEvent_t e = nullptr;
    if (!free_.empty()) {
      e = free_.back();
      free_.pop_back();
    } else {
      check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    }
    pending_.push_back(e);
    check(cudaEventRecord(e, s), "cudaEventRecord");
  }

  void release() noexcept {
    // A poisoned host communicator means transfers may wait for a peer that
    // is gone: abort rather than let the destructor's finalisation wait.
    if (nccl_ && host_.health(nullptr) != FLATMEM_STATUS_SUCCESS) nccl_->abort();
    nccl_.reset();
    int previous = -1;
    if (cudaGetDevice(&previous) != cudaSuccess || cudaSetDevice(device_) != cudaSuccess) previous = -1;
    // cudaFree waits for the device: the callers' copies from the staging included.
    for (char *p : {full_, copies_, handshake_})
      if (p != nullptr) cudaFree(p);
    full_ = copies_ = handshake_ = nullptr;
    for (cudaEvent_t e : pending_) cudaEventDestroy(e);
    for (cudaEvent_t e : free_) cudaEventDestroy(e);
    pending_.clear();
    free_.clear();
    if (last_group_ != nullptr) cudaEventDestroy(last_group_);
    last_group_ = nullptr;
    if (transfer_ != nullptr) cudaStreamDestroy(transfer_);
    transfer_ = nullptr;
    cudaGetLastError();
    if (previous >= 0) cudaSetDevice(previous);
  }

  comm::Communicator &host_;
  const RelayPlan &plan_;
  int device_, rank_, world_;
  comm::Milliseconds timeout_;
  std::function<void(std::int64_t)> account_sent_;
  std::int64_t slots_;
  std::unique_ptr<comm::DeviceTransport> nccl_;
  cudaStream_t transfer_ = nullptr;
  cudaEvent_t last_group_ = nullptr;
  std::int64_t groups_ = 0;
  bool synced_ = false;
  std::vector<cudaEvent_t> pending_, free_;
  char *handshake_ = nullptr, *full_ = nullptr, *copies_ = nullptr;
  std::size_t element_ = 0, stage_bytes_ = 0, copy_each_ = 0, full_bytes_ = 0, copy_bytes_ = 0;
};

}  // namespace

std::unique_ptr<RelayLinks> relay_links(comm::Communicator &comm, const RelayPlan &plan, comm::Milliseconds timeout,
                                        std::function<void(std::int64_t)> account_sent) {
  if (comm.device() == nullptr)
    invalid("options.memory: CUDA, but the communicator has no device transport (flatmem_comm_init_device)");
  return std::make_unique<CudaRelayLinks>(comm, plan, timeout, std::move(account_sent));
}

}  // namespace flatmem::cyclic
