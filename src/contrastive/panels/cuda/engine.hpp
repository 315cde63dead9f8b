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
#include "contrastive/panels/passes.hpp"
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

// Blocks of the ring (contrastive/ring/cuda/): `in` is this rank's rows q
// against one block of columns k, in.row_offset / in.col_offset their global
// offsets; the ring keeps the states and accumulators, `plan` (narrowed to
// in.c() columns) lends the panel, the fold parts and cuBLASLt's workspace.
//
// fold_block: the block's panels folded, in walk order, into row_state
// (in.b() states, running over the ring's blocks) and col_state (in.c(), the
// block's own states, reset by the caller; nullptr for InfoNCE). A forward
// plan. (cpu_fold_block in panels/cpu_executor.hpp is its CPU mirror.)
void fold_block(const PanelPlan &plan, const Options &options, const Inputs &in, State *row_state,
                State *col_state, void *workspace, void *stream);

// gradient_block: Gt of the block from row_lse (in.b()) and col_lse (in.c(),
// symmetric), positives by global indices (labels < global_c); then dq_acc
// (in.b() x d fp32) += Gt K, dk_acc (in.c() x d fp32) = Gt^T Q, ds_rows
// (in.b() doubles) += each row's sum of Gt raw; each nullptr when not wanted.
// Unscaled: the ring multiplies by s g / N when it stores. A backward plan.
// (cpu_gradient_block in panels/cpu_executor.hpp is its CPU mirror.)
void gradient_block(const PanelPlan &plan, const Options &options, const Inputs &in, std::int64_t global_c,
                    const float *row_lse, const float *col_lse, float *dq_acc, float *dk_acc, double *ds_rows,
                    void *workspace, void *stream);

// out (rows x d, its dtype and row stride) = s g inv_n acc (dense fp32): an
// accumulator of gradient_block stored once (dloss nullptr: g = 1; s and g
// read on the device).
void store_gradient(const float *acc, std::int64_t rows, const MatrixView &out, const float *scale,
                    const float *dloss, double inv_n, void *stream);

}  // namespace flatmem::contrastive::panels::cuda
