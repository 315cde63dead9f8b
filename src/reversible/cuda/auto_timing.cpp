#include "reversible/cuda/auto_timing.hpp"

#include "core/cuda/device.hpp"

namespace flatmem::reversible::cuda {

using flatmem::cuda::check_launch;
using flatmem::cuda::DeviceGuard;

struct AutoTiming {
  int device = -1;
  cudaEvent_t begin = nullptr, end = nullptr;
  bool pending = false;  // end recorded, not yet collected
  StateLayout layout;
  flatmem_reversible_mode mode = FLATMEM_REVERSIBLE_VANILLA;

  explicit AutoTiming(int d) : device(d) {
    DeviceGuard guard(device);
    check_launch(cudaEventCreate(&begin), "reversible: AUTO timing event");
    check_launch(cudaEventCreate(&end), "reversible: AUTO timing event");
  }
  ~AutoTiming() {
    DeviceGuard guard(device);
    if (begin) cudaEventDestroy(begin);
    if (end) cudaEventDestroy(end);
  }
};

namespace {

void destroy(AutoTiming *t) { delete t; }

// A finished measurement goes to the chooser; one still in flight stays.
void collect(flatmem_reversible_t &h) {
  AutoTiming *t = h.cuda_auto.get();
  if (t == nullptr || !t->pending) return;
  DeviceGuard guard(t->device);
  const cudaError_t done = cudaEventQuery(t->end);
  if (done == cudaErrorNotReady) return;
  t->pending = false;
  float ms = 0.0f;
  if (done != cudaSuccess || cudaEventElapsedTime(&ms, t->begin, t->end) != cudaSuccess) {
    cudaGetLastError();  // a lost measurement is not the caller's error
    return;
  }
  h.chooser.record(t->layout, t->mode, double(ms) * 1e-3);
}

}  // namespace

flatmem_reversible_mode auto_backward_begin(flatmem_reversible_t &h, const StateLayout &s, cudaStream_t stream,
                                            bool &timed) {
  collect(h);
  const flatmem_reversible_mode mode = h.chooser.next(s, h.size());
  timed = h.size() >= 2 && !(h.cuda_auto && h.cuda_auto->pending);
  if (!timed) return mode;
  if (!h.cuda_auto || h.cuda_auto->device != s.device.device_id)
    h.cuda_auto = CudaAutoTimingPointer(new AutoTiming(s.device.device_id), destroy);
  DeviceGuard guard(s.device.device_id);
  check_launch(cudaEventRecord(h.cuda_auto->begin, stream), "reversible: AUTO timing record");
  return mode;
}

void auto_backward_end(flatmem_reversible_t &h, const StateLayout &s, flatmem_reversible_mode ran,
                       cudaStream_t stream) {
  AutoTiming &t = *h.cuda_auto;
  DeviceGuard guard(t.device);
  check_launch(cudaEventRecord(t.end, stream), "reversible: AUTO timing record");
  t.pending = true;
  t.layout = s;
  t.mode = ran;
}

}  // namespace flatmem::reversible::cuda
