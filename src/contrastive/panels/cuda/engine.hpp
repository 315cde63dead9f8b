// The panel engine on CUDA: the plan of panels/plan.hpp walked with cuBLASLt
// GEMMs (core/cuda/lt_matmul.hpp) and the passes of kernels.hpp, in the
// caller's workspace, on the caller's stream. contrastive/cuda/backend.cpp
// calls these after its checks (pointers on the device, workspace given and
// large enough for plan.bytes); nothing here allocates or synchronises.
//
// Per panel (I, J) of the forward: GEMM P = Q_I K_J^T (fp32 out, TF32 for
// fp32 inputs unless FLATMEM_FP32_PRECISION_FULL), fold, merge; then the tile
// engine's forward_finish and loss_sum over the running states. Backward:
// per panel GEMM P, the gradient pass (Gt in place), and GEMMs
// row_acc += Gt K_J / col_acc += Gt^T Q_I, fixed-order reductions only; the
// accumulators are scaled by s g / N and rounded to dq / dk's type once.
#pragma once

#include <cstddef>

#include "contrastive/sigmoid_args.hpp"
#include "contrastive/panels/plan.hpp"
#include "contrastive/problem.hpp"

namespace flatmem::contrastive::panels::cuda {

void forward(const PanelPlan &plan, const Options &options, const Inputs &in, const ForwardOutputs &out,
             void *workspace, void *stream);

void backward(const PanelPlan &plan, const Options &options, const Inputs &in, const BackwardArgs &args,
              void *workspace, void *stream);

// The sigmoid loss's value_and_grad (a sigmoid plan_backward): what `args`
// requests; t and g read on the device (args.bias_data, args.dloss_data).
void sigmoid(const PanelPlan &plan, const Options &options, const Inputs &in, const SigmoidArgs &args,
             void *workspace, void *stream);

}  // namespace flatmem::contrastive::panels::cuda
