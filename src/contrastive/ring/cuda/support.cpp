#include "contrastive/ring/cuda/support.hpp"

#include "contrastive/cuda/dispatch.hpp"
#include "contrastive/cuda/kernels.hpp"
#include "contrastive/handle.hpp"
#include "contrastive/ring/blocks.hpp"
#include "core/cuda/device.hpp"

namespace flatmem::contrastive::ring::cuda_ring {

using contrastive::cuda::MaxSum;
using flatmem::cuda::check_launch;

cudaStream_t stream_of(void *stream) { return static_cast<cudaStream_t>(stream); }

Call::Call(flatmem_contrastive_s &handle, comm::Communicator &comm_, const Inputs &in, void *stream_,
           const char *phase, Stats &stats)
    : guard_(in.q.device.device_id),
      memory_(handle.device_workspace),
      device_id(in.q.device.device_id),
      stream(stream_of(stream_)),
      comm(comm_),
      device(*comm_.device()),
      multiprocessors(flatmem::cuda::multiprocessor_count(device_id)),
      op(contrastive::cuda::operand_for(in.q.dtype, handle.options.fp32_precision)),
      transport(comm_, *comm_.device(), stream, phase, stats) {}

MatrixView Call::own_block(const MatrixView &k, int ranks, void *scratch) const {
  if (ranks == 1 || k.row_stride == k.cols) return k;
  const MatrixView own = block_view(scratch, k.rows, k);
  check_launch(cudaMemcpy2DAsync(own.data, block_bytes(1, k), k.data,
                                 std::size_t(k.row_stride) * dtype_bytes(k.dtype), block_bytes(1, k),
                                 std::size_t(k.rows), cudaMemcpyDeviceToDevice, stream),
               "copying k to a compact block");
  return own;
}

void Call::finish_and_read(const double *device_values, double *host, int count) const {
  cuda_ring::finish_and_read(comm, device, stream, device_values, host, count);
}

void copy_on(cudaStream_t stream, void *to, const void *from, std::size_t bytes, const char *what) {
  check_launch(cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToDevice, stream), what);
}

Relayed relayed_states(void *fresh, void *const transit[2], cudaStream_t stream) {
  const auto fold_in = [stream](void *into, const void *mine, std::int64_t cols, bool first) {
    if (first)
      copy_on(stream, into, mine, std::size_t(cols) * sizeof(MaxSum), "copying the column states");
    else
      check_launch(contrastive::cuda::launch_merge_states(static_cast<MaxSum *>(into),
                                                          static_cast<const MaxSum *>(mine), cols, stream),
                   "launching the column state merge");
  };
  return Relayed{Message::column_state, fresh, {transit[0], transit[1]}, sizeof(MaxSum), fold_in};
}

std::optional<Relayed> relayed_dk(float *fresh, float *const transit[2], std::int64_t d,
                                  cudaStream_t stream) {
  if (fresh == nullptr) return std::nullopt;
  const auto fold_in = [stream, d](void *into, const void *mine, std::int64_t cols, bool first) {
    const std::int64_t count = cols * d;
    if (first)
      copy_on(stream, into, mine, std::size_t(count) * sizeof(float), "copying the partial dk");
    else  // ranks o .. r - 1, then this one
      check_launch(contrastive::cuda::launch_add_floats(static_cast<float *>(into),
                                                        static_cast<const float *>(mine), count, stream),
                   "launching the partial dk sum");
  };
  return Relayed{Message::dk_partial, fresh, {transit[0], transit[1]}, std::size_t(d) * sizeof(float),
                 fold_in};
}

void finish_and_read(comm::Communicator &comm, comm::DeviceTransport &device, cudaStream_t stream,
                     const double *device_values, double *host, int count) {
  device.synchronize(stream, comm.default_timeout());
  // the stream is idle: the copy does not wait for anything else
  check_launch(cudaMemcpyAsync(host, device_values, std::size_t(count) * sizeof(double),
                               cudaMemcpyDeviceToHost, stream),
               "copying the ring's sums to the host");
  check_launch(cudaStreamSynchronize(stream), "copying the ring's sums to the host");
}

}  // namespace flatmem::contrastive::ring::cuda_ring
