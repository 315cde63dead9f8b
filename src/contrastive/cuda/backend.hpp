// The CUDA backend of the contrastive loss as the C API sees it: workspace
// queries and the two calls. Everything is enqueued on the caller's stream in
// the caller's workspace: no allocation, no synchronisation, no host read of
// device memory. Errors found before the first launch throw flatmem::Error
// (nothing written); a failed launch throws FLATMEM_STATUS_INTERNAL.
#pragma once

#include "contrastive/sigmoid_args.hpp"
#include "contrastive/problem.hpp"

namespace flatmem::contrastive::cuda {

std::size_t forward_workspace_bytes(const Options &options, const MatrixView &q, const MatrixView &k);

// dq / dk: data == nullptr for a size query that does not request them (only
// their presence matters); the tiles: the SM count of q's device sizes the
// accumulators; the panels: the plan of panels/plan.hpp.
std::size_t backward_workspace_bytes(const Options &options, const MatrixView &q, const MatrixView &k,
                                     bool want_dq, bool want_dk);

void forward(const Options &options, const Inputs &in, const ForwardOutputs &out,
             void *workspace, std::size_t workspace_bytes, void *stream);

void backward(const Options &options, const Inputs &in, const BackwardArgs &args,
              void *workspace, std::size_t workspace_bytes, void *stream);

// The sigmoid (SigLIP) loss (sigmoid_pass.cu): one call computes what `args`
// requests (loss and / or dq, dk, ds, dt, times dloss). On CUDA the scalars
// t and g are read on the device: args.bias_data (required) and
// args.dloss_data (nullptr: g = 1); args.bias / args.dloss are not used.
std::size_t sigmoid_workspace_bytes(const Options &options, const MatrixView &q, const MatrixView &k,
                                    bool want_dq, bool want_dk);

void sigmoid(const Options &options, const Inputs &in, const SigmoidArgs &args,
             void *workspace, std::size_t workspace_bytes, void *stream);

}  // namespace flatmem::contrastive::cuda
