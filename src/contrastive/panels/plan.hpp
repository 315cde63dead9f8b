// The panel engine's plan: how the b x c logit matrix is cut into panels of
// R rows x C columns, in what order they are visited, and where every buffer
// lives in the call's workspace. Plain C++ (no CUDA types): the CUDA engine
// (panels/cuda/) and the CPU executor (panels/cpu_executor.hpp) both run it,
// and tests/contrastive/test_panel_engine.cpp checks every byte.
//
// Forward (one sweep, row panels outer, column panels inner):
//   P = Q_I K_J^T                        a GEMM into `panel` (fp32, raw <q, k>)
//   fold: row / column (max, sum) of s P over fold tiles -> row_parts, col_parts
//   merge: the parts into the running row / column states, in order
// then the states give the LSE vectors and the loss (as the tile kernels'
// partial states do: forward_finish with one group each).
//
// The sigmoid loss's value_and_grad is a backward plan: no LSE, the gradient
// pass forms Gt = -z sigmoid(-z x) and each row's sums of softplus(-z x), Gt raw
// and Gt (loss, ds, dt) instead.
//
// Backward, sweep "rows" (row panels outer): per panel P again, then the
// gradient pass turns it, in place, into Gt (the operand type: bf16 / fp16
// rows at a pitch of 2C elements, fp32 at C) and adds sum_c Gt raw to ds_rows;
// row_acc (R x d fp32) += Gt K_J; at the end of row panel I, dq_I = s g / N
// row_acc. Sweep "cols" (column panels outer) does the same with
// col_acc (C x d) += Gt^T Q_I for dk. When the dial holds a c x d fp32
// accumulator (dk_resident), dk is accumulated in the rows sweep too and the
// second sweep (its logit GEMMs) is skipped: 4 GEMMs per panel instead of 5.
//
// The dial: the whole workspace of a call stays within `budget` bytes (0 =
// default_budget) unless the smallest panel (min_extent x min_extent) does not
// fit in it; then the smallest panel is used and the size query says so.
#pragma once

#include <cstddef>
#include <cstdint>

#include "contrastive/problem.hpp"

namespace flatmem::contrastive::panels {

constexpr std::size_t default_budget = std::size_t(64) << 20;
// cuBLASLt's own workspace inside ours (split-K partials; 256-byte aligned).
constexpr std::size_t lt_workspace_bytes = std::size_t(4) << 20;
constexpr std::size_t lt_alignment = 256;
// The forward fold's tile (one CTA on the GPU, one loop nest on the CPU).
constexpr std::int64_t fold_rows = 64, fold_cols = 128;
// Panel extents are multiples of this (or the whole extent when smaller).
constexpr std::int64_t min_extent = 128;
constexpr std::int64_t max_extent = 16384;
// A panel this large (4096 x 2048) keeps cuBLASLt's GEMMs at their rate.
constexpr std::int64_t preferred_area = std::int64_t(4096) * 2048;

struct Region {
  std::size_t offset = 0, bytes = 0;  // bytes == 0: not used by this call
  std::size_t end() const { return offset + bytes; }
};

enum class Call { forward, backward };

struct PanelPlan {
  Call call = Call::forward;
  Loss loss = Loss::symmetric;
  std::int64_t b = 0, c = 0, d = 0;
  std::int64_t rows = 0, cols = 0;              // R, C (the last panel of each may be short)
  std::int64_t row_panels = 0, col_panels = 0;  // ceil(b / R), ceil(c / C)
  std::int64_t row_folds = 0, col_folds = 0;    // fold tiles per panel: ceil(R / fold_rows), ceil(C / fold_cols)
  bool want_dq = false, want_dk = false, want_ds = false;
  bool rows_sweep = false, cols_sweep = false;  // backward: which sweeps run
  bool dk_resident = false;                     // backward: dk accumulated in the rows sweep
  std::size_t budget = 0;                       // the dial as resolved (bytes)
  bool over_budget = false;                     // the smallest panel did not fit in `budget`

  // Workspace (offsets from a base aligned to lt_alignment; `bytes` includes
  // the slack to align an arbitrary base).
  Region panel;       // R x C fp32: the raw logits, then Gt in place
  Region row_parts;   // forward: [R][col_folds] (max, sum) pairs
  Region col_parts;   // forward: [C][row_folds] (max, sum) pairs (symmetric only)
  Region row_state;   // forward: b (max, sum) pairs
  Region col_state;   // forward: c (max, sum) pairs (symmetric only)
  Region loss_parts;  // forward: finish partials (doubles)
  Region row_acc;     // backward: R x d fp32 (rows sweep, dq wanted)
  Region col_acc;     // backward: C x d fp32 (cols sweep), or c x d when dk_resident
  Region ds_rows;     // backward: b doubles (ds wanted); sigmoid: 3 b (loss, ds, dt per row)
  Region lt;          // cuBLASLt workspace
  std::size_t bytes = 0;

  std::int64_t row_begin(std::int64_t i) const { return i * rows; }
  std::int64_t row_count(std::int64_t i) const { return (i + 1) * rows < b ? rows : b - i * rows; }
  std::int64_t col_begin(std::int64_t j) const { return j * cols; }
  std::int64_t col_count(std::int64_t j) const { return (j + 1) * cols < c ? cols : c - j * cols; }
};

// Finish blocks of the forward's loss sum (as the tile kernels' forward_grid).
std::int64_t finish_blocks(std::int64_t b);

// Panel extents forced by FLATMEM_CUDA_PANEL_SHAPE (0 x 0: the plan chooses).
struct Shape {
  std::int64_t rows = 0, cols = 0;
};

// budget 0: default_budget. `forced`: extents to use (clamped to b and c)
// instead of the largest that fit; the plan then may exceed the budget
// (over_budget says so). Throws flatmem::Error (INVALID_ARGUMENT) when the
// sizes overflow.
PanelPlan plan_forward(std::int64_t b, std::int64_t c, std::int64_t d, Loss loss, std::size_t budget,
                       Shape forced = {});
PanelPlan plan_backward(std::int64_t b, std::int64_t c, std::int64_t d, Loss loss, bool want_dq,
                        bool want_dk, bool want_ds, std::size_t budget, Shape forced = {});

// `plan` walking only its first c columns (1 <= c <= plan.c): the same panels
// and workspace, fewer column panels. The ring plans once for its widest block
// and narrows the plan to each step's block.
PanelPlan narrowed(const PanelPlan &plan, std::int64_t c);

// FLATMEM_CUDA_PANEL_SHAPE: "<rows>x<cols>" (each 1 .. max_extent), a tuning
// knob for benchmarks; unset or empty: 0 x 0. INVALID_ARGUMENT naming the
// variable when it does not parse.
Shape shape_from_environment();

// FLATMEM_CUDA_ENGINE: unset, empty or "auto" -> automatic; "tiles", "panels";
// anything else is INVALID_ARGUMENT naming the variable and the choices.
CudaEngine engine_from_environment();

// Whether a softmax call on one CUDA device runs the panels. Forced by the
// option (engine tiles / panels); automatic: the panels where a GPU run has
// measured them faster than the tile kernels and correct -- bf16 features,
// b and c >= auto_min_extent, compute capability 9.0 or newer (bench/gpu/run5
// on an H200 at cdb2b93: 3.0-4.0x the tiles' speed at b = 16384..262144,
// d = 512 and 768); everything else keeps the tile kernels until measured.
// The sigmoid loss runs on panels only when forced (not yet run on a GPU).
constexpr std::int64_t auto_min_extent = 16384;
bool use_panels(CudaEngine engine, Loss loss, bool bf16, std::int64_t b, std::int64_t c, int sm_major);

// The dial from FLATMEM_CUDA_PANEL_BYTES (bytes, suffix K / M / G allowed), 0
// when unset; INVALID_ARGUMENT naming the variable when it does not parse.
std::size_t budget_from_environment();

}  // namespace flatmem::contrastive::panels
