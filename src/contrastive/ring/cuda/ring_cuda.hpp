// The ring on kDLCUDA tensors: the shared schedule (schedule.hpp) with the
// CUDA tile kernels computing each step on the caller's stream and the
// communicator's NCCL device transport moving the blocks
// (nccl_transport.hpp). Built with the CUDA backend and NCCL; otherwise
// no_cuda_ring.cpp refuses (UNSUPPORTED).
//
// A call is synchronous for the host: it reads the scalars (and labels) it
// must agree on at its start, after the caller's stream has reached the call,
// and it synchronises once at the end, under the communicator's deadline,
// before anything the caller owns is written (the writes are then queued on
// the caller's stream: they are ordered before anything queued after the
// call, as for every CUDA call of flatmem).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <vector>

#include "comm/communicator.hpp"
#include "contrastive/sigmoid_args.hpp"
#include "contrastive/problem.hpp"
#include "contrastive/ring/agreement.hpp"
#include "contrastive/ring/stats.hpp"

struct flatmem_contrastive_s;

namespace flatmem::contrastive::ring {

// Whether this build runs the ring on kDLCUDA tensors.
bool cuda_ring_built();

// The local checks a CUDA ring call adds to check_inputs & co., after
// check_device_tensors: the inputs are memory of q's device; then (after the caller's stream reached the call) the
// values every rank must agree on are copied to the host: in.scale (checked
// finite and > 0), the labels (returned, for the agreement's range check),
// and, when given, *dloss / *bias from their device pointers.
std::vector<std::int64_t> read_device_inputs(comm::Communicator &comm, Inputs &in, void *stream,
                                             const float *dloss_data, float *dloss,
                                             const float *bias_data, float *bias);

// The first local check of a CUDA ring call: the communicator has a device
// transport on CUDA device `device` (INVALID_ARGUMENT naming options.comm or
// q), and each given pointer (NULL: not given) is memory of that device
// (INVALID_ARGUMENT naming it).
struct NamedPointer {
  const void *pointer;
  const char *name;
};
void check_device_tensors(comm::Communicator &comm, int device, std::initializer_list<NamedPointer> tensors);

void run_forward_cuda(flatmem_contrastive_s &handle, comm::Communicator &comm, const Layout &layout,
                      const Inputs &in, const ForwardOutputs &out, void *stream, Stats &stats);
void run_backward_cuda(flatmem_contrastive_s &handle, comm::Communicator &comm, const Layout &layout,
                       const Inputs &in, const BackwardArgs &args, void *stream, Stats &stats);
void run_sigmoid_cuda(flatmem_contrastive_s &handle, comm::Communicator &comm, const Layout &layout,
                      const Inputs &in, const SigmoidArgs &args, const char *phase, void *stream,
                      Stats &stats);

}  // namespace flatmem::contrastive::ring
