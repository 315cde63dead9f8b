// What the three CUDA rings share: the device transport of the communicator,
// the relayed items' folds as kernels, and the end of a call (one
// synchronisation under the deadline, then the scalars to the host).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <optional>

#include "comm/device_transport.hpp"
#include "contrastive/ring/schedule.hpp"

namespace flatmem::contrastive::ring::cuda_ring {

cudaStream_t stream_of(void *stream);

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
