// What the three CUDA rings share: the device transport of the communicator,
// the relayed items' folds as kernels, and the end of a call (one
// synchronisation under the deadline, then the scalars to the host).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <optional>

#include "comm/device_transport.hpp"
#include "contrastive/cuda/dispatch.hpp"
#include "contrastive/cuda/params.hpp"
#include "contrastive/problem.hpp"
#include "contrastive/ring/cuda/nccl_transport.hpp"
#include "contrastive/ring/schedule.hpp"
#include "core/cuda/device.hpp"
#include "core/device_workspace.hpp"
#include "core/workspace.hpp"

struct flatmem_contrastive_s;

namespace flatmem::contrastive::ring::cuda_ring {

cudaStream_t stream_of(void *stream);

// What every CUDA ring call sets up: q's device made current (for the whole
// call), the caller's stream, the communicator's NCCL transport wrapped for
// the schedule, the operand type and the SM count; and the handle's device
// memory.
class Call {
 public:
  Call(flatmem_contrastive_s &handle, comm::Communicator &comm, const Inputs &in, void *stream,
       const char *phase, Stats &stats);

  // The buffers `carve` takes (a function of a WorkspaceCarver returning
  // them), carved out of the handle's device memory: measured, then taken.
  template <typename Carve>
  auto carve(Carve &&take) {
    WorkspaceCarver measure;
    take(measure);
    WorkspaceCarver carver(memory_.resolve(device_id, measure.bytes()));
    return take(carver);
  }
  // The block this rank sends first: k itself when compact (or when alone),
  // else a compact copy in `scratch` (k.rows x k.cols), made on the stream.
  MatrixView own_block(const MatrixView &k, int ranks, void *scratch) const;
  // finish_and_read below, on this call's stream.
  void finish_and_read(const double *device_values, double *host, int count) const;

 private:
  flatmem::cuda::DeviceGuard guard_;
  DeviceWorkspace &memory_;

 public:
  const int device_id;
  const cudaStream_t stream;
  comm::Communicator &comm;
  comm::DeviceTransport &device;
  const int multiprocessors;
  const contrastive::cuda::Operand op;
  NcclRingTransport transport;
};

// The two gradient passes of a ring step, for the softmax (PassParams) and
// sigmoid (SigmoidPassParams) passes alike: the row side (rows = q_r, cols =
// the block: dq's pass) and the column side (rows = the block, cols = q_r:
// the block's partial dk), with global pair indices.
template <typename Params>
void row_side(Params &p, const Inputs &in, const MatrixView &block, std::int64_t col_offset) {
  p.rows = contrastive::cuda::device_matrix(in.q);
  p.cols = contrastive::cuda::device_matrix(block);
  p.label_side = in.labels ? contrastive::cuda::LabelSide::of_row : contrastive::cuda::LabelSide::identity;
  p.pairs.rows_offset = in.row_offset;
  p.pairs.cols_offset = col_offset;
}
template <typename Params>
void column_side(Params &p, const Inputs &in, const MatrixView &block, std::int64_t col_offset) {
  p.rows = contrastive::cuda::device_matrix(block);
  p.cols = contrastive::cuda::device_matrix(in.q);
  p.label_side = in.labels ? contrastive::cuda::LabelSide::of_col : contrastive::cuda::LabelSide::identity;
  p.pairs.rows_offset = col_offset;
  p.pairs.cols_offset = in.row_offset;
}
// The pass's output: fp32 rows of d floats at `out`, added to (accumulate:
// the running dq) or written (the fresh partial dk).
template <typename Params>
void output_to(Params &p, float *out, std::int64_t d, bool accumulate) {
  p.out = out;
  p.out_ld = d;
  p.out_type = contrastive::cuda::OutType::f32;
  p.out_accumulate = accumulate;
}

// The relayed column (max, sum) states (cuda::MaxSum each): copied, or merged
// in order, on `stream`.
Relayed relayed_states(void *fresh, void *const transit[2], cudaStream_t stream);
// The relayed partial dk (fp32, ld d): copied, or added, on `stream`.
// nullopt when fresh == nullptr (dk not requested).
std::optional<Relayed> relayed_dk(float *fresh, float *const transit[2], std::int64_t d,
                                  cudaStream_t stream);

// Waits (host) until `stream` has done everything queued so far, polling the
// NCCL communicator under the communicator's deadline (a dead or wedged peer
// fails with TIMEOUT / PEER_FAILURE and poisons it), then copies `count`
// doubles from device memory to `host`.
void finish_and_read(comm::Communicator &comm, comm::DeviceTransport &device, cudaStream_t stream,
                     const double *device_values, double *host, int count);

// cudaMemcpyAsync on `stream` (device to device); throws INTERNAL naming `what`.
void copy_on(cudaStream_t stream, void *to, const void *from, std::size_t bytes, const char *what);

}  // namespace flatmem::contrastive::ring::cuda_ring
