// The contrastive loss as a ring across the ranks of a communicator
// (options.comm): every rank keeps its rows q_r and its columns k_r; column
// blocks travel rank -> rank + 1 while the current block is computed. See
// flatmem.h ("Ring across ranks") for the contract and ALGORITHMS.md §1.
#pragma once

#include <flatmem/flatmem.h>

#include "comm/communicator.hpp"
#include "contrastive/problem.hpp"
#include "contrastive/ring/agreement.hpp"
#include "contrastive/ring/stats.hpp"

struct flatmem_contrastive_s;

namespace flatmem::contrastive::ring {

// The C API's forward / backward when the handle has a communicator: local
// checks, the agreement of all ranks, then the ring. Collective.
void forward(flatmem_contrastive_s &handle, const DLTensor *q, const DLTensor *k,
             const DLTensor *labels, const DLTensor *logit_scale, DLTensor *loss,
             DLTensor *row_lse, DLTensor *col_lse, const void *workspace,
             std::size_t workspace_bytes);
void backward(flatmem_contrastive_s &handle, const DLTensor *q, const DLTensor *k,
              const DLTensor *labels, const DLTensor *logit_scale, const DLTensor *row_lse,
              const DLTensor *col_lse, const DLTensor *dloss, DLTensor *dq, DLTensor *dk,
              DLTensor *dlogit_scale, const void *workspace, std::size_t workspace_bytes);

// The rings themselves (ring_forward.cpp, ring_backward.cpp), after agree().
// Outputs are written only once every message has arrived.
void run_forward(flatmem_contrastive_s &handle, comm::Communicator &comm, const Layout &layout,
                 const Inputs &in, const ForwardOutputs &out, Stats &stats);
void run_backward(flatmem_contrastive_s &handle, comm::Communicator &comm, const Layout &layout,
                  const Inputs &in, const BackwardArgs &args, Stats &stats);

}  // namespace flatmem::contrastive::ring
