// OVERLAPPED on CUDA: the rebuild chain R_{n-1} .. R_0 is enqueued on a
// stream owned by the handle, the gradient chain B_{n-1} .. B_0 on the
// caller's stream; they are joined by events only (cudaStreamWaitEvent,
// device-side), never by a host wait. See schedules.hpp for the slots.
//
// Host enqueue order: R_{n-1}, then for k = n-1 .. 0: R_{k-1}, B_k. An
// event wait binds to the record made before it, so each record is enqueued
// before its wait:
//   after R_k:  record rebuilt[k % ring] on the rebuild stream;
//   before B_k: the caller's stream waits rebuilt[k % ring];
//   after B_k:  record gradients[k % ring] on the caller's stream;
//   before R_k (k + 2 < n): the rebuild stream waits gradients[(k+2) % ring]
//               -- B_{k+2} was enqueued before R_k in this order.
// A ring of 4 events per kind is enough: an event is re-recorded only after
// the wait that needed its previous record was enqueued.
// The rebuild stream first waits for the caller's stream (y, dy ready); all
// of its work precedes B_0 on the caller's stream, so when the caller's
// stream passes the end every buffer of the workspace is free again.
#include <array>

#include "core/cuda/device.hpp"
#include "core/error.hpp"
#include "reversible/cuda/stream_chain.hpp"
#include "reversible/schedules.hpp"

namespace flatmem::reversible::cuda {

using flatmem::cuda::check_launch;
using flatmem::cuda::DeviceGuard;

constexpr int ring = 4;

struct OverlapResources {
  int device = -1;
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr;
  std::array<cudaEvent_t, ring> rebuilt{}, gradients{};

  explicit OverlapResources(int d) : device(d) {
    DeviceGuard guard(device);
    check_launch(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "reversible: rebuild stream");
    check_launch(cudaEventCreateWithFlags(&start, cudaEventDisableTiming), "reversible: event");
    for (auto *events : {&rebuilt, &gradients})
      for (auto &e : *events)
        check_launch(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "reversible: event");
  }
  ~OverlapResources() {
    DeviceGuard guard(device);
    for (auto *events : {&rebuilt, &gradients})
      for (auto &e : *events)
        if (e) cudaEventDestroy(e);
    if (start) cudaEventDestroy(start);
    // Pending work on the stream completes before its resources are released.
    if (stream) cudaStreamDestroy(stream);
  }
};

namespace {

void destroy(OverlapResources *r) { delete r; }

OverlapResources &resources_for(flatmem_reversible_t &h, int device) {
  if (!h.cuda_overlap || h.cuda_overlap->device != device)
    h.cuda_overlap = CudaOverlapPointer(new OverlapResources(device), destroy);
  return *h.cuda_overlap;
}

}  // namespace

void run_overlapped(flatmem_reversible_t &h, Chain &caller_chain, const StateLayout &s,
                    const ResidualPlan &r, Randomness rng, const BackwardIo &io,
                    const BackwardBuffers &b) {
  auto &caller = static_cast<StreamChain &>(caller_chain);
  OverlapResources &o = resources_for(h, caller.device());
  DeviceGuard guard(caller.device());
  StreamChain rebuild(caller.device(), o.stream);
  const std::int32_t n = h.size();
  auto state = [&](std::int32_t j) {
    return j == n ? StatePair{const_cast<char *>(io.y1), const_cast<char *>(io.y2)}
                  : b.states[std::size_t(j % 3)];
  };
  auto call_for = [&](std::int32_t k) {
    BlockCall call = block_call(h, k, s, rng);
    point_residuals(call, b.residuals[std::size_t(k % 2)], r);
    return call;
  };
  auto enqueue_rebuild = [&](std::int32_t k) {
    if (k + 2 < n)
      check_launch(cudaStreamWaitEvent(o.stream, o.gradients[std::size_t((k + 2) % ring)], 0),
                   "reversible: rebuild waits for gradients");
    rebuild_block(rebuild, call_for(k), state(k + 1), state(k));
    check_launch(cudaEventRecord(o.rebuilt[std::size_t(k % ring)], o.stream), "reversible: record");
  };

  start_gradients(caller, s, io, b.gradients);
  check_launch(cudaEventRecord(o.start, caller.stream()), "reversible: record");
  check_launch(cudaStreamWaitEvent(o.stream, o.start, 0), "reversible: rebuild waits for inputs");
  enqueue_rebuild(n - 1);
  for (std::int32_t k = n - 1; k >= 0; --k) {
    if (k >= 1) enqueue_rebuild(k - 1);
    check_launch(cudaStreamWaitEvent(caller.stream(), o.rebuilt[std::size_t(k % ring)], 0),
                 "reversible: gradients wait for the rebuild");
    gradient_block(caller, call_for(k), state(k + 1).a, state(k).b, b.gradients);
    check_launch(cudaEventRecord(o.gradients[std::size_t(k % ring)], caller.stream()),
                 "reversible: record");
  }
  finish_backward(caller, s, io, b.gradients, state(0));
}

}  // namespace flatmem::reversible::cuda
