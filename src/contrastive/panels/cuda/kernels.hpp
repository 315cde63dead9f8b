// The panel engine's own kernels (kernels.cu): the memory-bound passes over a
// panel of logits that cuBLASLt wrote. Each enqueues on `stream` and returns
// cudaGetLastError(); none synchronises. The work of one thread is a function
// of contrastive/panels/passes.hpp, which the CPU executor runs too.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "contrastive/panels/passes.hpp"

namespace flatmem::contrastive::panels::cuda {

enum class GType : int { f32 = 0, bf16 = 1, f16 = 2 };

// Forward fold of one panel (rows x cols entries at `pitch` floats): the
// fold tiles' row parts [rows][col_folds] and, when col_parts is set, column
// parts [cols][row_folds].
struct FoldParams {
  const float *panel = nullptr;
  std::int64_t pitch = 0, rows = 0, cols = 0;
  const float *scale = nullptr;  // device scalar s
  State *row_parts = nullptr, *col_parts = nullptr;
  std::int64_t row_folds = 0, col_folds = 0;  // the plan's part strides
};
cudaError_t launch_fold(const FoldParams &p, cudaStream_t stream);

// The parts of a folded panel into the running states: row_state[row0 + r]
// (+)= merge of row r's ceil(cols / fold_cols) parts in order; likewise the
// columns (col_parts set) into col_state[col0 + c].
struct MergeParams {
  const State *row_parts = nullptr, *col_parts = nullptr;
  std::int64_t rows = 0, cols = 0, row_folds = 0, col_folds = 0;
  State *row_state = nullptr, *col_state = nullptr;
  std::int64_t row0 = 0, col0 = 0;
};
cudaError_t launch_merge(const MergeParams &p, cudaStream_t stream);

cudaError_t launch_reset(State *states, std::int64_t n, cudaStream_t stream);

// Backward: panel (rows x cols raw logits at `pitch` floats) -> Gt in place
// (GType::f32 at `pitch`; 16-bit types at 2 pitch elements: each row's
// first half), and ds_rows[row0 + r] += the row's sum of Gt raw (when set).
// sigmoid: Gt = -z sigmoid(v), x = s raw + t (no LSE vectors), and also
// loss_rows += the row's sum of softplus(v), dt_rows += its sum of Gt.
struct GradientParams {
  float *panel = nullptr;
  std::int64_t pitch = 0, rows = 0, cols = 0;
  std::int64_t row0 = 0, col0 = 0;  // the panel's first row / column in the call's rows and columns
  std::int64_t row_offset = 0, col_offset = 0;  // the call's first row / column globally (ring blocks)
  std::int64_t c = 0;               // columns in all, globally (the label bound)
  bool symmetric = true;
  const float *scale = nullptr;
  const float *row_lse = nullptr, *col_lse = nullptr;  // (b,), (c,) symmetric
  const std::int64_t *labels = nullptr;                // (b,) or nullptr: y_i = i
  GType g_type = GType::f32;
  double *ds_rows = nullptr;
  bool sigmoid = false;
  const float *bias = nullptr;  // device scalar t (sigmoid)
  double *loss_rows = nullptr, *dt_rows = nullptr;
};
cudaError_t launch_gradient(const GradientParams &p, cudaStream_t stream);

// out (rows x d at out_ld, of out_type) = s g inv_n acc (rows x d fp32, dense).
struct StoreParams {
  const float *acc = nullptr;
  std::int64_t rows = 0, d = 0;
  void *out = nullptr;
  std::int64_t out_ld = 0;
  GType out_type = GType::f32;
  const float *scale = nullptr, *dloss = nullptr;  // dloss nullptr: g = 1
  double inv_n = 1.0;
};
cudaError_t launch_store(const StoreParams &p, cudaStream_t stream);

}  // namespace flatmem::contrastive::panels::cuda
