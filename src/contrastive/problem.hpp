// A validated contrastive-loss call: what the CPU and CUDA drivers receive
// after src/contrastive/validate.cpp has checked every argument. For tensors
// on kDLCUDA every pointer is a device pointer and the host reads no value
// behind it (scale, labels, dloss are read by the kernels).
#pragma once

#include <flatmem/flatmem.h>

#include <cstddef>
#include <cstdint>

#include "core/tensor.hpp"

namespace flatmem::contrastive {

// sigmoid: the pairwise SigLIP loss (cpu/sigmoid.hpp); it validates like
// InfoNCE (labels optional, c != b allowed) but runs its own entry points.
enum class Loss { symmetric, infonce, sigmoid };

// How fp32 products run on tensor cores (CUDA); the CPU is always full fp32.
// unspecified (FLATMEM_FP32_PRECISION_DEFAULT): TF32 on CUDA; on the CPU the
// bf16 kernels' G as hi + lo (the CPU's products stay about full fp32).
enum class Fp32Precision { unspecified, tf32, full };

// Which CUDA engine runs the softmax losses on one device (panels/plan.hpp
// and contrastive/cuda/): the tile kernels, or cuBLASLt panels with fused
// passes. automatic: the handle's default for the shape (see
// panels::choose_engine). Forced by FLATMEM_CUDA_ENGINE=tiles|panels, read
// once when the handle is created. The sigmoid loss and the ring always run
// the tile kernels.
enum class CudaEngine { automatic, tiles, panels };

struct Options {
  Loss loss = Loss::symmetric;
  int num_threads = 1;
  int tile_rows = 512, tile_cols = 512;
  flatmem_nonfinite_policy nonfinite = FLATMEM_NONFINITE_ERROR;
  Fp32Precision fp32_precision = Fp32Precision::unspecified;
  flatmem_comm_t *comm = nullptr;  // non-null: the ring across its ranks (src/contrastive/ring/)
  std::size_t logit_cache_bytes = 0;  // CPU: raw logit tiles kept for the backward (cpu/logit_cache.hpp)
  CudaEngine cuda_engine = CudaEngine::automatic;  // FLATMEM_CUDA_ENGINE
  std::size_t panel_budget = 0;  // the panel engine's workspace dial, FLATMEM_CUDA_PANEL_BYTES (0: default)
  std::int64_t panel_rows = 0, panel_cols = 0;  // FLATMEM_CUDA_PANEL_SHAPE (0: the plan chooses)
};

// Inputs shared by forward and backward.
struct Inputs {
  Loss loss = Loss::symmetric;
  MatrixView q, k;                         // (b, d), (c, d)
  const std::int64_t *labels = nullptr;    // (b,) or nullptr: y_i = i
  // Global index of q's row 0 and of k's column 0: the rank offsets of the
  // ring, 0 in a single process. Labels are global column indices.
  std::int64_t row_offset = 0, col_offset = 0;
  float scale = 1.0f;                      // s (CPU tensors only)
  const float *scale_data = nullptr;       // where s lives (device pointer on CUDA)
  std::int64_t b() const { return q.rows; }
  std::int64_t c() const { return k.rows; }
  std::int64_t d() const { return q.cols; }
  // Positive column of row i, counted from k's column 0: outside [0, c) when
  // it lies in another rank's block of the ring.
  std::int64_t positive(std::int64_t i) const {
    return (labels ? labels[i] : row_offset + i) - col_offset;
  }
};

struct ForwardOutputs {
  float *loss = nullptr;      // 1
  float *row_lse = nullptr;   // (b,)
  float *col_lse = nullptr;   // (c,) symmetric only
};

struct BackwardArgs {
  const float *row_lse = nullptr;
  const float *col_lse = nullptr;  // symmetric only
  float dloss = 1.0f;               // g (CPU tensors only)
  const float *dloss_data = nullptr;  // where g lives, or nullptr: g = 1
  MatrixView dq, dk;               // data == nullptr: not requested
  float *dscale = nullptr;         // nullptr: not requested
};

}  // namespace flatmem::contrastive
