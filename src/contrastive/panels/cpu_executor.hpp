// The panel engine on the CPU: the plan (plan.hpp) walked with flatmem's own
// sgemm as the GEMM and the passes of passes.hpp as loops, in the workspace
// regions the plan carves. It is the test vehicle of the CUDA engine's
// algorithm (tests/contrastive/test_panel_engine.cpp checks it against the
// float64 reference on every CI machine), not a product: the CPU loss runs on
// the tile engine (cpu/), which is faster on a CPU.
//
// Inputs are fp32, row-major, contiguous. `g_bits` models the GPU's rounding
// of Gt to the operand type before the two gradient GEMMs: 32 (fp32 / TF32
// operand: kept), 16 (bf16: rounded to nearest even, 8 significant bits).
#pragma once

#include <cstdint>

#include "contrastive/panels/plan.hpp"
#include "core/cpu_isa.hpp"

namespace flatmem::contrastive::panels {

struct CpuProblem {
  const float *q = nullptr, *k = nullptr;  // (b, d), (c, d)
  const std::int64_t *labels = nullptr;    // (b,) InfoNCE or nullptr: y_i = i
  float scale = 1.0f;
  float bias = 0.0f;  // t: the sigmoid loss only
  int g_bits = 32;
  cpu_isa::Isa isa = cpu_isa::Isa::baseline;  // sgemm's variant (one the processor runs)
};

// The forward of `plan` (a plan_forward): loss (1 float), row_lse (b), col_lse
// (c, symmetric only). `workspace` holds plan.bytes bytes, any alignment.
void cpu_forward(const PanelPlan &plan, const CpuProblem &problem, void *workspace, float *loss,
                 float *row_lse, float *col_lse);

// The backward of `plan` (a plan_backward): dq (b x d), dk (c x d), dscale (1)
// as the plan wants them (others may be nullptr), times dloss.
void cpu_backward(const PanelPlan &plan, const CpuProblem &problem, const float *row_lse,
                  const float *col_lse, float dloss, void *workspace, float *dq, float *dk, float *dscale);

// The sigmoid loss's value_and_grad of `plan` (a sigmoid plan_backward):
// loss, dq, dk, dscale, dbias as wanted (nullptr: not), times dloss.
void cpu_sigmoid(const PanelPlan &plan, const CpuProblem &problem, float dloss, void *workspace, float *loss,
                 float *dq, float *dk, float *dscale, float *dbias);

}  // namespace flatmem::contrastive::panels
