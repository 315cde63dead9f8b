// The contrastive loss as a ring across the ranks of a communicator
// (options.comm): every rank keeps its rows q_r and its columns k_r; column
// blocks travel rank -> rank + 1 while the current block is computed. See
// flatmem.h ("Ring across ranks") for the contract and docs/contrastive/ring.md
// for the algorithm.
// One schedule (schedule.hpp) drives every ring: on CPU tensors with the CPU
// tile code and the host transport (ring_*.cpp here), on CUDA tensors with
// the CUDA kernels and NCCL (cuda/).
#pragma once

#include <flatmem/flatmem.h>

#include <functional>

#include "comm/communicator.hpp"
#include "contrastive/cpu/sigmoid.hpp"
#include "contrastive/problem.hpp"
#include "contrastive/ring/agreement.hpp"
#include "contrastive/ring/stats.hpp"

struct flatmem_contrastive_s;

namespace flatmem::contrastive::ring {

// The C API's forward / backward when the handle has a communicator: local
// checks, the agreement of all ranks, then the ring: on CPU tensors below, on
// kDLCUDA tensors in cuda/ring_cuda.hpp (on `stream`). Collective.
void forward(flatmem_contrastive_s &handle, const DLTensor *q, const DLTensor *k,
             const DLTensor *labels, const DLTensor *logit_scale, DLTensor *loss,
             DLTensor *row_lse, DLTensor *col_lse, const void *workspace,
             std::size_t workspace_bytes, void *stream);
void backward(flatmem_contrastive_s &handle, const DLTensor *q, const DLTensor *k,
              const DLTensor *labels, const DLTensor *logit_scale, const DLTensor *row_lse,
              const DLTensor *col_lse, const DLTensor *dloss, DLTensor *dq, DLTensor *dk,
              DLTensor *dlogit_scale, const void *workspace, std::size_t workspace_bytes,
              void *stream);

// The sigmoid calls (capi/contrastive_sigmoid.cpp) when the handle has a communicator:
// `local_check` runs this rank's argument checks (Scope::ring) and fills in
// `in` and `args`; then the agreement of all ranks and the sigmoid ring.
// `call` names the C function. Collective.
void sigmoid(flatmem_contrastive_s &handle, const char *call,
             const std::function<void(Inputs &, SigmoidArgs &)> &local_check,
             const void *workspace, std::size_t workspace_bytes, void *stream);

// The rings themselves on CPU tensors (ring_forward.cpp, ring_backward.cpp), after agree().
// Outputs are written only once every message has arrived.
void run_forward(flatmem_contrastive_s &handle, comm::Communicator &comm, const Layout &layout,
                 const Inputs &in, const ForwardOutputs &out, Stats &stats);
void run_backward(flatmem_contrastive_s &handle, comm::Communicator &comm, const Layout &layout,
                  const Inputs &in, const BackwardArgs &args, Stats &stats);
// ring_sigmoid.cpp: the loss and / or gradients of args in one pass; `phase`
// names it in messages ("contrastive sigmoid ring").
void run_sigmoid(flatmem_contrastive_s &handle, comm::Communicator &comm, const Layout &layout,
                 const Inputs &in, const SigmoidArgs &args, const char *phase, Stats &stats);

}  // namespace flatmem::contrastive::ring
