// The CUDA ring's local checks beyond check_inputs & co. (ring_cuda.hpp).
#include <cmath>

#include "comm/device_transport.hpp"
#include "contrastive/ring/cuda/ring_cuda.hpp"
#include "core/cuda/device.hpp"
#include "core/error.hpp"

namespace flatmem::contrastive::ring {
namespace {

comm::DeviceTransport &device_transport(comm::Communicator &comm, int device) {
  comm::DeviceTransport *t = comm.device();
  if (t == nullptr)
    invalid("options.comm: has no device transport; the ring on kDLCUDA tensors moves its blocks "
            "with NCCL: call flatmem_comm_init_device on every rank first");
  if (t->device() != device)
    invalid("q: on CUDA device ", device, " but options.comm's device transport (NCCL) is on device ",
            t->device(), "; pass tensors of the communicator's device");
  return *t;
}

void read(void *host, const void *device, std::size_t bytes, cudaStream_t stream, const char *name) {
  const cudaError_t status = cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, stream);
  const cudaError_t done = status == cudaSuccess ? cudaStreamSynchronize(stream) : status;
  if (done != cudaSuccess)
    fail(FLATMEM_STATUS_INTERNAL, name, ": copying its value to the host failed: ", cudaGetErrorString(done));
}

}  // namespace

void check_device_tensors(comm::Communicator &comm, int device, std::initializer_list<NamedPointer> tensors) {
  device_transport(comm, device);
  for (const NamedPointer &t : tensors)
    if (t.pointer) flatmem::cuda::check_device_pointer(t.pointer, t.name, device);
}

std::vector<std::int64_t> read_device_inputs(comm::Communicator &comm, Inputs &in, void *stream,
                                             const float *dloss_data, float *dloss,
                                             const float *bias_data, float *bias) {
  const int device = in.q.device.device_id;
  comm::DeviceTransport &transport = device_transport(comm, device);
  flatmem::cuda::DeviceGuard guard(device);
  flatmem::cuda::check_device_pointer(in.q.data, "q", device);
  flatmem::cuda::check_device_pointer(in.k.data, "k", device);
  flatmem::cuda::check_device_pointer(in.scale_data, "logit_scale", device);
  if (in.labels) flatmem::cuda::check_device_pointer(in.labels, "labels", device);
  if (dloss_data) flatmem::cuda::check_device_pointer(dloss_data, "dloss", device);
  if (bias_data) flatmem::cuda::check_device_pointer(bias_data, "logit_bias", device);

  // The values are those the caller's stream will have when it reaches the call.
  const auto s = static_cast<cudaStream_t>(stream);
  transport.synchronize(stream, comm.default_timeout());
  read(&in.scale, in.scale_data, sizeof(float), s, "logit_scale");
  if (!(std::isfinite(in.scale) && in.scale > 0.0f))
    invalid("logit_scale: ", in.scale, "; expected a finite value > 0 (s = exp(learned log-scale))");
  if (dloss_data) read(dloss, dloss_data, sizeof(float), s, "dloss");
  if (bias_data) {
    read(bias, bias_data, sizeof(float), s, "logit_bias");
    if (!std::isfinite(*bias)) invalid("logit_bias: ", *bias, "; expected a finite value");
  }
  std::vector<std::int64_t> labels(in.labels ? std::size_t(in.b()) : 0);
  if (in.labels) read(labels.data(), in.labels, labels.size() * sizeof(std::int64_t), s, "labels");
  return labels;
}

}  // namespace flatmem::contrastive::ring
