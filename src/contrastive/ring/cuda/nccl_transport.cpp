#include "contrastive/ring/cuda/nccl_transport.hpp"

#include "core/cuda/device.hpp"
#include "core/error.hpp"

namespace flatmem::contrastive::ring {
namespace {

struct NcclExchange final : Exchange {
  cudaEvent_t done = nullptr;
  ~NcclExchange() override {
    if (done) cudaEventDestroy(done);
  }
};

cudaEvent_t new_event(const std::string &what) {
  cudaEvent_t e = nullptr;
  flatmem::cuda::check_launch(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), what.c_str());
  return e;
}

}  // namespace

NcclRingTransport::NcclRingTransport(comm::Communicator &comm, comm::DeviceTransport &device,
                                     cudaStream_t compute, const char *phase, Stats &stats)
    : comm_(comm), device_(device), compute_(compute), phase_(phase), stats_(stats),
      ranks_(comm.size()), rank_(comm.rank()) {
  stats_.steps = ranks_;
  flatmem::cuda::check_launch(cudaStreamCreateWithFlags(&transfers_, cudaStreamNonBlocking),
                     "creating the ring's transfer stream");
}

NcclRingTransport::~NcclRingTransport() {
  // Work on it was ordered into the compute stream by events; destroying the
  // stream lets queued work finish first.
  if (transfers_) cudaStreamDestroy(transfers_);
}

ExchangePtr NcclRingTransport::exchange(int step, std::span<const Outgoing> sends,
                                        std::span<const Incoming> receives) {
  const std::string what = step_label(phase_, step, ranks_);
  const comm::Milliseconds timeout = comm_.default_timeout();
  auto posted = std::make_unique<NcclExchange>();
  try {
    // the sent data is written, and the receive buffers last read, by work queued on compute
    cudaEvent_t ready = new_event(what + ": creating an event");
    const cudaError_t recorded = cudaEventRecord(ready, compute_);
    const cudaError_t ordered = recorded == cudaSuccess ? cudaStreamWaitEvent(transfers_, ready, 0) : recorded;
    cudaEventDestroy(ready);
    flatmem::cuda::check_launch(ordered, (what + ": ordering the transfers after the compute stream").c_str());
    const int next = (rank_ + 1) % ranks_, previous = (rank_ + ranks_ - 1) % ranks_;
    device_.group_start();
    for (const Incoming &in : receives) device_.recv(in.data, in.bytes, previous, transfers_, timeout);
    for (const Outgoing &out : sends) {
      device_.send(out.data, out.bytes, next, transfers_, timeout);
      stats_.bytes_sent += out.bytes;
      stats_.messages_sent += 1;
    }
    device_.group_end(timeout);
    posted->done = new_event(what + ": creating an event");
    flatmem::cuda::check_launch(cudaEventRecord(posted->done, transfers_), (what + ": recording an event").c_str());
  } catch (const Error &e) {
    const std::string message = what + ": " + e.what();
    comm_.poison(e.status(), message);
    throw Error(e.status(), message);
  }
  return posted;
}

void NcclRingTransport::wait(ExchangePtr &posted) {
  if (!posted) return;
  const cudaError_t status = cudaStreamWaitEvent(compute_, static_cast<NcclExchange &>(*posted).done, 0);
  posted.reset();  // destroying an event another stream waits for is allowed
  if (status != cudaSuccess) {
    const std::string message = std::string(phase_) + ": ordering the compute stream after a transfer: " +
                                cudaGetErrorString(status);
    comm_.poison(FLATMEM_STATUS_INTERNAL, message);
    throw Error(FLATMEM_STATUS_INTERNAL, message);
  }
}

}  // namespace flatmem::contrastive::ring
