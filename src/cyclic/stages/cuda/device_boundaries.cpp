// The device side of a stage rank over NCCL (see ../device_boundaries.hpp and
// "Transport" in flatmem/cyclic_stages.h).
//
// Ordering, all without host waits except arrived() and finish():
//   put (tau, parity p)    caller's stream: wait for the group of tau - 1
//                          (the last one to send parity-p slots), header
//                          kernel, payload copy, mark;
//   enter (tau, parity p)  transfer stream: wait for the marks of the puts of
//                          tau - 1 (parity 1 - p) and of the takes of tau - 2
//                          (parity p), ONE NCCL group (sends from parity 1 - p
//                          slots, receives into parity p slots), the received
//                          headers to pinned host memory, group_done_[p];
//   take (tau, parity p)   after arrived() synchronised the transfer stream:
//                          payload copy on the caller's stream, mark.
#include <cuda_runtime_api.h>

#include <cstring>
#include <vector>

#include "comm/device_transport.hpp"
#include "core/cuda/device.hpp"
#include "cyclic/cuda/abort_on_failure.hpp"
#include "cyclic/cuda/kernels.hpp"
#include "cyclic/stages/device_boundaries.hpp"

namespace flatmem::cyclic::stages {
namespace {

using flatmem::cuda::DeviceGuard;

void check(cudaError_t status, const std::string &what) {
  if (status != cudaSuccess)  // the message is built only for a failure
    cuda::check_launch(status, ("cyclic device memory: stages: " + what).c_str());
}

cudaStream_t as_stream(void *s) { return static_cast<cudaStream_t>(s); }

// Slots start 256-byte aligned (the header is written as 8-byte words).
std::size_t stride_of(std::size_t message_bytes) { return (message_bytes + 255) / 256 * 256; }

// A CUDA event on a caller's stream and whether the transfer stream still has to wait for it.
struct Mark {
  cudaEvent_t event = nullptr;
  bool armed = false;
};

// One stream's slots of one parity.
struct Lane {
  char *memory = nullptr;
  std::vector<Mark> marks;  // per slot: the last put (outgoing) / take (incoming)
};

class CudaBoundaries final : public DeviceBoundaries {
 public:
  CudaBoundaries(comm::Communicator &host, const std::array<Link, 4> &links, int slots, comm::Milliseconds timeout)
      : host_(host), device_(host.device()->device()), links_(links), slots_(slots), timeout_(timeout) {
    bool any = false;
    for (const Link &l : links_) any = any || l.peer >= 0;
    if (any) nccl_ = comm::create_device_transport(host, device_, timeout);
    DeviceGuard guard(device_, "communicator device");
    try {
      check(cudaStreamCreateWithFlags(&transfer_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
      for (cudaEvent_t &e : group_done_) check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
      for (int d = 0; d < 4; ++d) {
        if (links_[std::size_t(d)].peer < 0) continue;
        const std::size_t bytes = std::size_t(slots_) * stride_of(links_[std::size_t(d)].message_bytes);
        for (Lane &lane : lanes_[std::size_t(d)]) {
          lane.marks.resize(std::size_t(slots_));
          for (Mark &m : lane.marks) check(cudaEventCreateWithFlags(&m.event, cudaEventDisableTiming), "cudaEventCreate");
          check(cudaMalloc(reinterpret_cast<void **>(&lane.memory), bytes),
                "the boundary staging (" + std::to_string(bytes) + " bytes of device memory per stream and parity)");
          // Defined bytes throughout: a message's padding travels too.
          check(cudaMemsetAsync(lane.memory, 0, bytes, transfer_), "cudaMemsetAsync");
        }
      }
      check(cudaMallocHost(reinterpret_cast<void **>(&headers_), sizeof(Header) * 8 * std::size_t(slots_)),
            "the received headers (pinned host memory)");
      for (Mark &m : accumulator_mark_)
        check(cudaEventCreateWithFlags(&m.event, cudaEventDisableTiming), "cudaEventCreate");
    } catch (const Error &e) {
      // The neighbours' NCCL communicator exists now: they must not wait for ours.
      host.poison(e.status(), "cyclic stages, stage " + std::to_string(host.rank()) + ": " + e.what());
      release();
      throw;
    }
    try {
      if (nccl_) connect();  // poisons on failure (run)
    } catch (const Error &) {
      release();
      throw;
    }
  }

  ~CudaBoundaries() override { release(); }
  CudaBoundaries(const CudaBoundaries &) = delete;
  CudaBoundaries &operator=(const CudaBoundaries &) = delete;

  int device() const override { return device_; }

  void enter(std::int64_t tau, const std::array<int, 4> &count) override {
    const int p = parity(tau);
    run("cyclic stages: the transfers of time step " + std::to_string(tau), [&] {
      DeviceGuard guard(device_, "communicator device");
      int total = 0;
      for (int d = 0; d < 4; ++d) {
        const int n = count[std::size_t(d)];
        if (n > 0 && (links_[std::size_t(d)].peer < 0 || n > slots_))
          fail(FLATMEM_STATUS_INTERNAL, n, " messages on boundary stream ", d, " (", slots_, " slots)");
        total += n;
        // Outgoing: the puts of tau - 1; incoming: the takes of tau - 2.
        if (links_[std::size_t(d)].peer >= 0) settle(lanes_[std::size_t(d)][std::size_t(incoming(d) ? p : 1 - p)]);
      }
      if (total > 0) {
        nccl_->group_start();
        for (int d = 0; d < 4; ++d) {
          const Link &l = links_[std::size_t(d)];
          for (int i = 0; i < count[std::size_t(d)]; ++i) {
            if (incoming(d))
              nccl_->recv(slot(d, p, i), l.message_bytes, l.peer, transfer_, timeout_);
            else
              nccl_->send(slot(d, 1 - p, i), l.message_bytes, l.peer, transfer_, timeout_);
          }
        }
        // NCCL launches a non-blocking group on a thread of its own; the wait
        // for that (not for the transfers) is bounded by the timeout.
        nccl_->group_end(timeout_);
        for (int d : {int(in_activation), int(in_gradient)})
          for (int i = 0; i < count[std::size_t(d)]; ++i)
            check(cudaMemcpyAsync(&headers_[header_index(p, d, i)], slot(d, p, i), sizeof(Header),
                                  cudaMemcpyDeviceToHost, transfer_),
                  "cudaMemcpyAsync (header)");
      }
      // Every time step, so that group_done_[p] always covers the groups up to tau.
      check(cudaEventRecord(group_done_[p], transfer_), "cudaEventRecord");
      synced_ = false;
    });
  }

  void put(int d, int ordinal, std::int64_t tau, const Header &h, const void *data, std::size_t bytes,
           void *caller_stream) override {
    const int p = parity(tau);
    run("cyclic stages: staging the send", [&] {
      DeviceGuard guard(device_, "communicator device");
      const cudaStream_t s = as_stream(caller_stream);
      // The group of tau - 1 was the last to send this parity's slots.
      if (tau > 0) check(cudaStreamWaitEvent(s, group_done_[1 - p], 0), "cudaStreamWaitEvent");
      char *to = slot(d, p, ordinal);
      unsigned long long words[4];
      std::memcpy(words, &h, sizeof h);
      device::write_words(to, words, s);
      if (bytes > 0) check(cudaMemcpyAsync(to + sizeof(Header), data, bytes, cudaMemcpyDeviceToDevice, s), "cudaMemcpyAsync");
      arm(lanes_[std::size_t(d)][std::size_t(p)].marks[std::size_t(ordinal)], s);
    });
  }

  Header arrived(int d, int ordinal, std::int64_t tau, comm::Milliseconds timeout) override {
    if (!synced_) {
      // Host wait for the transfer stream (the group of tau is the last work on it).
      run("", [&] { nccl_->synchronize(transfer_, timeout); });
      synced_ = true;
    }
    return headers_[header_index(parity(tau), d, ordinal)];
  }

  void take(int d, int ordinal, std::int64_t tau, void *into, std::size_t bytes, void *caller_stream) override {
    const int p = parity(tau);
    run("cyclic stages: copying the received tensor out", [&] {
      DeviceGuard guard(device_, "communicator device");
      const cudaStream_t s = as_stream(caller_stream);
      if (bytes > 0)
        check(cudaMemcpyAsync(into, slot(d, p, ordinal) + sizeof(Header), bytes, cudaMemcpyDeviceToDevice, s),
              "cudaMemcpyAsync");
      arm(lanes_[std::size_t(d)][std::size_t(p)].marks[std::size_t(ordinal)], s);
    });
  }

  void finish(comm::Milliseconds timeout) override {
    if (nccl_) run("", [&] { nccl_->synchronize(transfer_, timeout); });
  }

  void accumulate(int slot_index, bool first, bool f64, const void *gradient, std::size_t count, std::size_t bytes,
                  std::int64_t average_over, void *caller_stream) override {
    run("cyclic stages: accumulating the gradient", [&] {
      DeviceGuard guard(device_, "communicator device");
      if (accumulator_[0] == nullptr) {
        for (char *&a : accumulator_)
          check(cudaMalloc(reinterpret_cast<void **>(&a), bytes),
                "the gradient accumulators (2 x " + std::to_string(bytes) + " bytes of device memory)");
      }
      const cudaStream_t s = as_stream(caller_stream);
      char *acc = accumulator_[slot_index];
      // After the accumulator's last use, whichever stream that was on.
      follow(accumulator_mark_[slot_index], s);
      // The host arithmetic: copy, then acc[i] = acc[i] + g[i], then the average's factor.
      if (first)
        check(cudaMemcpyAsync(acc, gradient, bytes, cudaMemcpyDeviceToDevice, s), "cudaMemcpyAsync");
      else
        device::add(f64, acc, gradient, count, s);
      if (average_over > 1) device::scale_to_average(f64, acc, count, average_over, s);
      arm(accumulator_mark_[slot_index], s);
    });
  }

  void average(int slot_index, void *out, std::size_t bytes, void *caller_stream) override {
    run("cyclic stages: copying the average out", [&] {
      DeviceGuard guard(device_, "communicator device");
      const cudaStream_t s = as_stream(caller_stream);
      follow(accumulator_mark_[slot_index], s);
      check(cudaMemcpyAsync(out, accumulator_[slot_index], bytes, cudaMemcpyDeviceToDevice, s),
            "cudaMemcpyAsync (the average)");
      arm(accumulator_mark_[slot_index], s);
    });
  }

 private:
  static constexpr comm::Milliseconds no_deadline{std::int64_t(24) * 3600 * 1000};

  static int parity(std::int64_t tau) { return int(tau & 1); }
  std::size_t header_index(int p, int d, int i) const { return (std::size_t(p) * 4 + std::size_t(d)) * std::size_t(slots_) + std::size_t(i); }
  char *slot(int d, int p, int i) const {
    return lanes_[std::size_t(d)][std::size_t(p)].memory + std::size_t(i) * stride_of(links_[std::size_t(d)].message_bytes);
  }

  // Before the next group: one 1-byte transfer each way with every linked
  // neighbour, so that NCCL's lazy connection (a handshake with the peer)
  // happens here, under the create timeout, and not inside a later
  // flatmem_cyclic_stages_next.
  void connect() {
    run("cyclic stages create: connecting to the neighbouring stages", [&] {
      DeviceGuard guard(device_, "communicator device");
      nccl_->group_start();
      for (int d = 0; d < 4; ++d) {
        const Link &l = links_[std::size_t(d)];
        if (l.peer < 0) continue;
        if (incoming(d))
          nccl_->recv(slot(d, 0, 0), 1, l.peer, transfer_, timeout_);
        else
          nccl_->send(slot(d, 0, 0), 1, l.peer, transfer_, timeout_);
      }
      nccl_->group_end(timeout_);
      nccl_->synchronize(transfer_, timeout_);
    });
  }

  // Stream s waits for m's last recording (if any).
  static void follow(const Mark &m, cudaStream_t s) {
    if (m.armed) check(cudaStreamWaitEvent(s, m.event, 0), "cudaStreamWaitEvent");
  }

  void arm(Mark &m, cudaStream_t s) {
    check(cudaEventRecord(m.event, s), "cudaEventRecord");
    m.armed = true;
  }
  // The transfer stream waits for the lane's armed marks.
  void settle(Lane &lane) {
    for (Mark &m : lane.marks)
      if (m.armed) {
        check(cudaStreamWaitEvent(transfer_, m.event, 0), "cudaStreamWaitEvent");
        m.armed = false;
      }
  }

  template <typename F>
  void run(const std::string &what, F f) const {
    abort_on_failure(host_, nccl_.get(), what.empty() ? std::string("cyclic stages: device transfer") : what, f);
  }

  void release() noexcept {
    // NCCL first: a failed communicator is aborted there, so NCCL kernels on
    // the transfer stream end; cudaFree then waits for the device (callers'
    // copies from and into the staging included).
    // A poisoned host communicator means transfers may wait for a peer that
    // is gone: abort rather than let the destructor's finalisation wait.
    if (nccl_ && host_.health(nullptr) != FLATMEM_STATUS_SUCCESS) nccl_->abort();
    nccl_.reset();
    int previous = -1;
    if (cudaGetDevice(&previous) != cudaSuccess || cudaSetDevice(device_) != cudaSuccess) previous = -1;
    for (auto &lanes : lanes_)
      for (Lane &lane : lanes) {
        if (lane.memory != nullptr) cudaFree(lane.memory);
        for (Mark &m : lane.marks)
          if (m.event != nullptr) cudaEventDestroy(m.event);
        lane = Lane{};
      }
    for (char *&a : accumulator_) {
      if (a != nullptr) cudaFree(a);
      a = nullptr;
    }
    for (Mark &m : accumulator_mark_) {
      if (m.event != nullptr) cudaEventDestroy(m.event);
      m = Mark{};
    }
    for (cudaEvent_t &e : group_done_) {
      if (e != nullptr) cudaEventDestroy(e);
      e = nullptr;
    }
    if (headers_ != nullptr) cudaFreeHost(headers_);
    headers_ = nullptr;
    if (transfer_ != nullptr) cudaStreamDestroy(transfer_);
    transfer_ = nullptr;
    cudaGetLastError();
    if (previous >= 0) cudaSetDevice(previous);
  }

  comm::Communicator &host_;
  int device_;
  std::array<Link, 4> links_;
  int slots_;
  std::unique_ptr<comm::DeviceTransport> nccl_;
  cudaStream_t transfer_ = nullptr;
  cudaEvent_t group_done_[2] = {nullptr, nullptr};
  std::array<std::array<Lane, 2>, 4> lanes_;
  Header *headers_ = nullptr;  // [parity][direction][slot], pinned
  char *accumulator_[2] = {nullptr, nullptr};
  Mark accumulator_mark_[2];  // the last accumulate / average of each, on its caller's stream
  comm::Milliseconds timeout_;
  bool synced_ = false;  // the transfer stream finished everything enqueued so far
};

}  // namespace

std::unique_ptr<DeviceBoundaries> device_boundaries(comm::Communicator &comm, const std::array<Link, 4> &links,
                                                    int slots, comm::Milliseconds timeout) {
  if (comm.device() == nullptr)
    invalid("options.memory: CUDA, but the communicator has no device transport (flatmem_comm_init_device)");
  return std::make_unique<CudaBoundaries>(comm, links, slots, timeout);
}

}  // namespace flatmem::cyclic::stages
