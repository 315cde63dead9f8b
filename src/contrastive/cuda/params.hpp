// The plain parameter structs handed from the host launchers (dispatch.cpp) to the
// kernels, and the fixed tile geometry of the CUDA backend. Host and device
// both include this header; it uses no CUDA types.
//
// Geometry: a CTA of 4 warps works on a tile of 64 rows x 128 columns of the
// logit matrix; warp w owns rows 16w..16w+15 and all 128 columns (the
// FlashAttention-2 layout: a row's statistics stay inside one warp). The
// products <q_i, k_j> are accumulated over d in chunks of 32 features, so any
// d fits; chunks past d are zero-filled in shared memory.
#pragma once

#include <cstdint>

namespace flatmem::contrastive::cuda {

constexpr int tile_rows = 64;    // BM: rows of q (or of k in the dk pass) per CTA tile
constexpr int tile_cols = 128;   // BN: columns per CTA tile
constexpr int chunk_d = 32;      // BK: features per step of the logit GEMM
constexpr int chunk_out = 64;    // DN: gradient features per step of the G·K GEMM
constexpr int warps = tile_rows / 16;
constexpr int threads = warps * 32;
// forward: at most 32 row groups x 16 column groups (see forward_tiles.cu);
// the partial states take (16 b + 32 c) * 8 bytes of workspace.
constexpr int max_row_groups = 32, max_col_groups = 16;

// How the tensor cores see the inputs. fp32 inputs run either as TF32
// (10-bit mantissa products, fp32 accumulation) or as "3xTF32": each operand
// split into a TF32 head and a TF32 tail, three MMAs per product, which
// restores about fp32 accuracy at 3x the tensor-core work.
enum class Operand : int { bf16 = 0, f16 = 1, tf32 = 2, f32x3 = 3 };

// Output element types of dq / dk.
enum class OutType : int { f32 = 0, bf16 = 1, f16 = 2 };

// A row-major feature matrix in device memory (rows x cols elements, row r at
// data + r * ld elements). vector_loads: data and ld * element size are
// 16-byte aligned, so 16-byte cp.async loads may be used; otherwise the
// loaders fall back to element loads.
struct Matrix {
  const void *data = nullptr;
  std::int64_t rows = 0, cols = 0, ld = 0;
  bool vector_loads = false;
};

// A running log-sum-exp state: LSE = max + log(sum), sum = sum_j exp(x_j - max).
struct alignas(8) MaxSum {
  float max, sum;
};

// Which label tensor, if any, names the positive of a (row, column) pair of a
// backward pass: none (identity: row i pairs with column i), labels[row]
// (dq pass of InfoNCE), or labels[column] (dk pass of InfoNCE: the pass's
// columns are the rows of q).
enum class LabelSide : int { identity = 0, of_row = 1, of_col = 2 };

// Where a pass's rows and columns sit in the loss's global index space, for
// the positive test (the ring computes one column block at a time):
//   identity: (r, col) is positive iff rows_offset + r == cols_offset + col
//   of_row:   iff labels[r] == cols_offset + col
//   of_col:   iff labels[col] == rows_offset + r
// A label outside [0, label_bound) makes the element NaN (the host cannot
// check device values in a single-device call; the ring checks them first).
// Single device: both offsets 0, label_bound = c.
struct PairIndex {
  std::int64_t rows_offset = 0, cols_offset = 0;
  std::int64_t label_bound = 0;
};

struct ForwardTileParams {
  Matrix q, k;                   // (b, d), (c, d)
  const float *scale = nullptr;  // device scalar s
  bool symmetric = true;
  int row_groups = 1, col_groups = 1;  // P_r, P_c
  MaxSum *row_partial = nullptr;       // [P_c][b]: row state over column group J
  MaxSum *col_partial = nullptr;       // [P_r][c]: column state over row group I (symmetric)
};

struct ForwardFinishParams {
  Matrix q, k;
  const float *scale = nullptr;
  const std::int64_t *labels = nullptr;  // (b,) or nullptr: y_i = i
  bool symmetric = true;
  bool tf32_positive = false;  // round q, k to TF32 for the positive logit (as the tiles did)
  int row_groups = 1, col_groups = 1;
  const MaxSum *row_partial = nullptr, *col_partial = nullptr;
  // The ring's finish: x_{i,y_i} already formed (ring_kernels.cu), nullptr:
  // computed here from q and k.
  const float *positive = nullptr;
  float *row_lse = nullptr, *col_lse = nullptr;  // col_lse: symmetric only
  double *loss_partial = nullptr;               // [gridDim.x]
};

struct LossSumParams {
  const double *partial = nullptr;
  int count = 0;
  double inv_count = 1.0;  // 1 / (2b) symmetric, 1 / b InfoNCE
  float *loss = nullptr;
};

// One backward pass: the output side ("rows", whose gradient is written) and
// the other side ("cols"). The dq pass has rows = q, cols = k; the dk pass
// rows = k, cols = q, with every per-row quantity swapped with its per-column
// counterpart, since dk = s G^T q is the dq formula applied to G^T.
//
//   Gt_rc = w_row exp(x_rc - lse_rows[r]) + w_col exp(x_rc - lse_cols[c])
//           - positive_weight [c is r's positive]
//   out_r = s g / N sum_c Gt_rc cols_c,    ds += g / N sum Gt_rc <rows_r, cols_c>
// (Gt = N G / g is G without its 1/N and g factors: entries in [-2, 2], so
// rounding them to the operand type keeps relative precision.)
struct PassParams {
  Matrix rows, cols;
  const float *scale = nullptr;
  const float *dloss = nullptr;  // nullptr: g = 1
  double inv_n = 1.0;            // 1 / N
  const float *lse_rows = nullptr, *lse_cols = nullptr;  // nullptr: the term is absent
  const std::int64_t *labels = nullptr;
  LabelSide label_side = LabelSide::identity;
  PairIndex pairs;
  float positive_weight = 1.0f;
  float *slots = nullptr;  // [gridDim.x][tile_rows][slot_pitch] fp32 accumulators
  int slot_pitch = 0;      // d rounded up to chunk_out
  void *out = nullptr;     // nullptr: no gradient matrix from this pass
  std::int64_t out_ld = 0;
  OutType out_type = OutType::f32;
  bool out_accumulate = false;  // out (f32 only) += the pass's result instead of =
  double *ds_partial = nullptr;  // [row tiles] or nullptr: no ds from this pass
};

// One pass of the sigmoid loss (sigmoid_pass.cu): as PassParams, the output
// side "rows" and the other side "cols" (row pass: q, k; column pass: k, q),
// with the SigLIP element terms instead of the softmax ones:
//   x = s raw + t,  v = -z x,  Gt = -z sigmoid(v)   (z = +1 at the positive)
//   out_r = s g / b sum_c Gt_rc cols_c
// and the row tile's sums of softplus(v), Gt raw and Gt (each in double) into
// loss_partial / ds_partial / dt_partial [row tile] when those are set. Gt is
// G without its g / b factor: entries in [-1, 1].
struct SigmoidPassParams {
  Matrix rows, cols;
  const float *scale = nullptr;  // device scalar s
  const float *bias = nullptr;   // device scalar t
  const float *dloss = nullptr;  // nullptr: g = 1
  double inv_n = 1.0;            // 1 / b (b: rows of q)
  const std::int64_t *labels = nullptr;
  LabelSide label_side = LabelSide::identity;
  PairIndex pairs;
  float *slots = nullptr;  // [gridDim.x][tile_rows][slot_pitch] fp32 accumulators
  int slot_pitch = 0;      // d rounded up to chunk_out
  void *out = nullptr;     // nullptr: no gradient matrix from this pass
  std::int64_t out_ld = 0;
  OutType out_type = OutType::f32;
  bool out_accumulate = false;  // out (f32 only) += the pass's result instead of =
  double *loss_partial = nullptr, *ds_partial = nullptr, *dt_partial = nullptr;
};

// The ring's positives of one column block (ring_kernels.cu): for each row i
// of q whose positive column y_i (labels[i], or rows_offset + i without
// labels) lies in [col_offset, col_offset + k.rows):
//   positive[i] = s <q_i, k_{y_i - col_offset}>   (positive_dot.cuh's rounding)
// Other rows are left alone.
struct BlockPositiveParams {
  Matrix q, k;
  const float *scale = nullptr;
  const std::int64_t *labels = nullptr;
  std::int64_t rows_offset = 0, col_offset = 0;
  Operand op = Operand::tf32;
  bool tf32_positive = false;
  float *positive = nullptr;
};

struct DsSumParams {
  const double *partial = nullptr;
  int count = 0;
  double inv_n = 1.0;
  const float *dloss = nullptr;
  float *dscale = nullptr;
};

}  // namespace flatmem::contrastive::cuda
