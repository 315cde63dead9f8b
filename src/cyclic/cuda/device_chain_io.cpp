// The device ChainIo (see chain_io.hpp): one private NCCL communicator and
// one non-blocking stream per chain thread, the kernels of kernels.cu, and a
// host wait (polling NCCL and the host communicator) at the end of each
// link. Built with the NCCL transport only (src/cyclic/no_device_chain_io.cpp
// otherwise).
#include <cuda_runtime_api.h>

#include <chrono>
#include <thread>

#include "comm/device_transport.hpp"
#include "core/cuda/device.hpp"
#include "core/error.hpp"
#include "cyclic/chain_io.hpp"
#include "cyclic/cuda/abort_on_failure.hpp"
#include "cyclic/cuda/kernels.hpp"

namespace flatmem::cyclic {
namespace {

using flatmem::cuda::DeviceGuard;

// The chains wait without a deadline of their own (see chain_io.hpp).
constexpr comm::Milliseconds no_deadline = std::chrono::hours(24);
constexpr unsigned long long none = ~0ull;

bool is_f64(const Gradient &g) { return g.type == comm::SumType::f64; }

comm::DeviceSumType sum_type(const Gradient &g) {
  return is_f64(g) ? comm::DeviceSumType::f64 : comm::DeviceSumType::f32;
}

void check(cudaError_t status, const std::string &what) {
  if (status != cudaSuccess)  // the message is built only for a failure
    cuda::check_launch(status, ("cyclic device memory: chain: " + what).c_str());
}

class DeviceChainIo final : public ChainIo {
 public:
  DeviceChainIo(comm::Communicator &host, comm::Milliseconds timeout)
      : host_(host), device_(host.device()->device()) {
    nccl_ = comm::create_device_transport(host, device_, timeout);
    DeviceGuard guard(device_, "communicator device");
    try {
      check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
      check(cudaMallocAsync(reinterpret_cast<void **>(&first_device_), sizeof(unsigned long long), stream_),
            "the scan's result (8 bytes of device memory)");
      check(cudaMallocHost(reinterpret_cast<void **>(&first_host_), sizeof(unsigned long long)),
            "the scan's result (8 bytes of pinned host memory)");
    } catch (const Error &e) {
      // The peers' NCCL communicator exists now: they must not wait for ours.
      host.poison(e.status(), std::string("cyclic device chain, rank ") + std::to_string(host.rank()) + ": " + e.what());
      release();
      throw;
    }
  }

  ~DeviceChainIo() override { release(); }
  DeviceChainIo(const DeviceChainIo &) = delete;
  DeviceChainIo &operator=(const DeviceChainIo &) = delete;

  std::int64_t prepare(const Gradient &g, bool scan) override {
    std::int64_t first = -1;
    run("cyclic device chain, stage " + std::to_string(g.stage) + ", step " + std::to_string(g.step) +
            ": waiting for the gradient on the caller's stream",
        [&] {
          DeviceGuard guard(device_, "communicator device");
          if (g.ready)
            check(cudaStreamWaitEvent(stream_, static_cast<cudaEvent_t>(g.ready.get()), 0), "cudaStreamWaitEvent");
          if (!scan) return;
          check(cudaMemsetAsync(first_device_, 0xff, sizeof(unsigned long long), stream_), "cudaMemsetAsync");
          device::first_nonfinite(is_f64(g), g.data, g.count, first_device_, stream_);
          check(cudaMemcpyAsync(first_host_, first_device_, sizeof(unsigned long long), cudaMemcpyDeviceToHost,
                                stream_),
                "cudaMemcpyAsync");
          nccl_->synchronize(stream_, no_deadline);
          if (*first_host_ != none) first = std::int64_t(*first_host_);
        });
    return first;
  }

  void exchange(std::span<const Transfer> transfers) override {
    if (transfers.empty()) return;
    run(transfers.front().what, [&] {
      // One NCCL group: the transfers progress together (NCCL matches them
      // with the peers' in order; every rank issues its chain in the same order).
      nccl_->group_start();
      for (const Transfer &t : transfers) {
        if (t.send)
          nccl_->send(t.data, t.bytes, t.peer, stream_, no_deadline);
        else
          nccl_->recv(t.data, t.bytes, t.peer, stream_, no_deadline);
      }
      nccl_->group_end(no_deadline);
      nccl_->synchronize(stream_, no_deadline);
    });
  }

  void receive_add(Gradient &g, int peer, std::uint64_t tag, const std::string &what) override {
    run(what, [&] { reserve(g.bytes); });
    const Transfer t{false, peer, scratch_, g.bytes, tag, what};
    exchange({&t, 1});
    run(what, [&] {
      DeviceGuard guard(device_, "communicator device");
      device::add(is_f64(g), g.data, scratch_, g.count, stream_);
    });
  }

  void average(Gradient &g, std::int64_t n) override {
    run("cyclic device chain: the average", [&] {
      DeviceGuard guard(device_, "communicator device");
      device::scale_to_average(is_f64(g), g.data, g.count, n, stream_);
    });
  }

  void all_reduce(Gradient &g, std::uint64_t, const std::string &what) override {
    run(what, [&] { nccl_->all_reduce_sum(g.data, g.data, g.count, sum_type(g), stream_, no_deadline); });
  }

  void finish(const std::string &what) override {
    run(what, [&] { nccl_->synchronize(stream_, no_deadline); });
  }

 private:
  // Runs f; any failure ends this chain (device/abort_on_failure.hpp).
  template <typename F>
  void run(const std::string &what, F f) {
    abort_on_failure(host_, nccl_.get(), what, f);
  }

  void reserve(std::size_t bytes) {
    if (bytes <= scratch_bytes_) return;
    DeviceGuard guard(device_, "communicator device");
    if (scratch_ != nullptr) check(cudaFreeAsync(scratch_, stream_), "cudaFreeAsync");
    scratch_ = nullptr;
    scratch_bytes_ = 0;
    check(cudaMallocAsync(reinterpret_cast<void **>(&scratch_), bytes, stream_),
          "the partial-sum scratch (" + std::to_string(bytes) + " bytes of device memory)");
    scratch_bytes_ = bytes;
  }

  void release() noexcept {
    // NCCL first: a failed communicator is aborted there, which ends NCCL
    // kernels still waiting on the stream; the frees below are stream-ordered.
    // A poisoned host communicator means transfers may wait for a peer that
    // is gone: abort rather than let the destructor's finalisation wait.
    if (nccl_ && host_.health(nullptr) != FLATMEM_STATUS_SUCCESS) nccl_->abort();
    nccl_.reset();
    if (stream_ == nullptr) return;
    int previous = -1;
    if (cudaGetDevice(&previous) != cudaSuccess || cudaSetDevice(device_) != cudaSuccess) previous = -1;
    if (scratch_ != nullptr) cudaFreeAsync(scratch_, stream_);
    if (first_device_ != nullptr) cudaFreeAsync(first_device_, stream_);
    // The pinned result may still be written by a copy on the stream: free it
    // once the stream drained (bounded; past that it is left allocated).
    bool drained = false;
    for (int i = 0; i < 2000 && !drained; ++i) {
      const cudaError_t s = cudaStreamQuery(stream_);
      drained = s != cudaErrorNotReady;
      if (!drained) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (drained && first_host_ != nullptr) cudaFreeHost(first_host_);
    cudaStreamDestroy(stream_);
    cudaGetLastError();
    if (previous >= 0) cudaSetDevice(previous);
    stream_ = nullptr;
  }

  comm::Communicator &host_;
  int device_;
  std::unique_ptr<comm::DeviceTransport> nccl_;
  cudaStream_t stream_ = nullptr;
  char *scratch_ = nullptr;
  std::size_t scratch_bytes_ = 0;
  unsigned long long *first_device_ = nullptr;
  unsigned long long *first_host_ = nullptr;
};

}  // namespace

bool device_chains_built() { return comm::device_transport_built(); }

std::unique_ptr<ChainIo> device_chain_io(comm::Communicator &comm, comm::Milliseconds timeout) {
  if (comm.device() == nullptr)
    invalid("options.memory: CUDA, but the communicator has no device transport (flatmem_comm_init_device)");
  return std::make_unique<DeviceChainIo>(comm, timeout);
}

void check_device_memory(const void *p, int device, const char *name) {
  DeviceGuard guard(device, name);
  flatmem::cuda::check_device_pointer(p, name, device);
}

namespace {

// An event recorded on `stream` now (INVALID_ARGUMENT naming `name` when CUDA refuses the stream).
cudaEvent_t record_on(void *stream, int device, const char *name) {
  DeviceGuard guard(device, name);
  cudaEvent_t event = nullptr;
  check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreateWithFlags");
  const cudaError_t recorded = cudaEventRecord(event, static_cast<cudaStream_t>(stream));
  if (recorded != cudaSuccess) {
    cudaEventDestroy(event);
    cudaGetLastError();
    invalid(name, ": ", stream, " cannot be waited for on CUDA device ", device, " (cudaEventRecord: ",
            cudaGetErrorString(recorded), ")");
  }
  return event;
}

}  // namespace

void check_device_stream(void *stream, int device, const char *name) {
  const cudaEvent_t event = record_on(stream, device, name);
  DeviceGuard guard(device, name);
  cudaEventDestroy(event);
}

std::shared_ptr<void> device_gradient_ready(const void *data, std::size_t bytes, int device, void *stream) {
  (void)bytes;  // the start is checked; the extent is the caller's promise, as everywhere on the device
  check_device_memory(data, device, "gradient");
  const cudaEvent_t event = record_on(stream, device, "stream");
  return std::shared_ptr<void>(event, [device](void *e) {
    int previous = -1;
    if (cudaGetDevice(&previous) == cudaSuccess && previous != device) cudaSetDevice(device);
    cudaEventDestroy(static_cast<cudaEvent_t>(e));
    cudaGetLastError();
    if (previous >= 0 && previous != device) cudaSetDevice(previous);
  });
}

}  // namespace flatmem::cyclic
