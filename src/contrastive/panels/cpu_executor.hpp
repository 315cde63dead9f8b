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
//
// The ring's blocks (cpu_fold_block, cpu_gradient_block) are the same walks
// over one block of a ring across ranks (docs/contrastive/ring.md): this
// rank's rows against the block of columns it holds at a step, with running
// states and accumulators that live across the steps and belong to the caller.
#pragma once

#include <cstdint>

#include "contrastive/panels/passes.hpp"
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

// One block of a ring step: this rank's rows q (rows x d; global rows
// row_offset ...) against a block of columns k (cols x d; global columns
// col_offset ...) of a global batch of global_c columns. Softmax losses only.
struct CpuBlock {
  const float *q = nullptr, *k = nullptr;         // (rows, d), (cols, d)
  std::int64_t rows = 0, cols = 0, d = 0;
  std::int64_t row_offset = 0, col_offset = 0;  // global index of q's first row, of k's first column
  std::int64_t global_c = 0;                      // the global column count (the labels' range)
  const std::int64_t *labels = nullptr;  // (rows,) this rank's rows' global positive columns (InfoNCE),
                                         // or nullptr: global row i's positive is global column i
  float scale = 1.0f;
  int g_bits = 32;
  cpu_isa::Isa isa = cpu_isa::Isa::baseline;
};

// The forward panel walk of one block (GEMM, fold, merge in walk order), with
// `plan` = plan_forward(rows, cols, d, loss, budget[, shape]): only its panel,
// row_parts and col_parts regions are used. row_state (rows): this rank's
// running row states, merged into (not reset). col_state (cols, symmetric;
// nullptr for InfoNCE): the block's column states, merged into (the caller
// resets them to empty_state() for a fresh block). The positives are not
// formed here (O(rows d) dot products, the finish's business).
void cpu_fold_block(const PanelPlan &plan, const CpuBlock &block, void *workspace, State *row_state,
                    State *col_state);

// The backward panel walk of one block, with `plan` = plan_backward(rows,
// cols, d, loss, ...): only its panel region is used (the accumulators are the
// caller's). Per panel: P, Gt in place (the gradient pass: positives on global
// indices, row_lse (rows) and col_lse (cols, symmetric; nullptr for InfoNCE)
// indexed locally, Gt rounded per g_bits), then both GEMMs:
//   dq_acc (rows x d fp32, unscaled) += Gt k      (nullptr: not wanted)
//   dk_acc (cols x d fp32, unscaled)  = Gt^T q    (overwritten; nullptr: not wanted)
//   ds_rows (rows doubles)           += each row's sum of Gt raw, in the pass's
//                                       lane tree order (nullptr: not wanted).
// The caller scales by s g / N (and g / N for ds) once the ring is complete.
void cpu_gradient_block(const PanelPlan &plan, const CpuBlock &block, const float *row_lse, const float *col_lse,
                        void *workspace, float *dq_acc, float *dk_acc, double *ds_rows);

}  // namespace flatmem::contrastive::panels
