// The panel engine's element and segment work, written once: the CUDA kernels
// (panels/cuda/kernels.cu) call these per thread, the CPU executor
// (panels/cpu_executor.cpp) per loop iteration, in the same decomposition, so
// that the engine proven on every CI machine is the one the GPU runs.
//
// A state (m, s) stands for log-sum-exp = m + log(s); merges rescale both sums
// to the larger maximum. NaN in a logit makes the sum NaN (fmaxf ignores it in
// the maximum, exp(NaN) does not); -inf entries contribute 0.
//
// Forward fold of one fold tile (fold_rows x fold_cols of the panel, raw
// logits, row-major at `pitch`): row r's part is the merge, in the order
// ((q0 + q1) + (q2 + q3)), of its four quarters of fold_cols / 4 columns;
// column j's part is (h0 + h1) of its two halves of fold_rows / 2 rows.
// A tile at the panel's edge passes its real extents; missing entries are
// skipped (an all-missing segment is the empty state (-inf, 0)). The tile is
// read from its staged copy (fold_slot below).
#pragma once

#include <cmath>
#include <cstdint>

#include "contrastive/panels/plan.hpp"

#if defined(__CUDACC__)
#define FLATMEM_HD __host__ __device__ __forceinline__
#else
#define FLATMEM_HD inline
#endif

namespace flatmem::contrastive::panels {

struct alignas(8) State {
  float max, sum;
};

constexpr int row_quarter = int(fold_cols / 4);  // columns per row segment
constexpr int col_half = int(fold_rows / 2);     // rows per column segment

FLATMEM_HD float neg_inf() { return -INFINITY; }
FLATMEM_HD State empty_state() { return State{neg_inf(), 0.0f}; }

FLATMEM_HD float exp_of(float x) {
#if defined(__CUDA_ARCH__)
  return expf(x);
#else
  return std::exp(x);
#endif
}

// exp(x - m) with an empty state's m = -inf read as 0, so -inf entries give 0.
FLATMEM_HD float exp_shifted(float x, float m) { return exp_of(x - (m == neg_inf() ? 0.0f : m)); }

FLATMEM_HD float max_of(float a, float b) { return fmaxf(a, b); }

// a <- a merged with b (a first: the order is part of the result's bits).
FLATMEM_HD void merge(State &a, State b) {
  const float m = max_of(a.max, b.max);
  a.sum = a.sum * exp_shifted(a.max, m) + b.sum * exp_shifted(b.max, m);
  a.max = m;
}

// The state of s at(0), s at(1), ... s at(n - 1): maximum first, then the sum.
template <typename At>
FLATMEM_HD State fold_segment(const At &at, int n, float s) {
  State st = empty_state();
  for (int i = 0; i < n; ++i) st.max = max_of(st.max, s * at(i));
  for (int i = 0; i < n; ++i) st.sum += exp_shifted(s * at(i), st.max);
  return st;
}

// Where entry (r, c) of a fold tile is staged before it is folded (the GPU's
// shared memory; the CPU executor stages the same way): row r at r *
// fold_cols, column c XOR-ed in its low five bits (its 32-column group is
// kept) with (r mod 8) | (c's quarter << 3), bit 4 flipped again for rows
// 32 .. 63. On the GPU every warp access is then free of bank conflicts: the
// row fold's 8 rows x 4 quarters at one step, the column fold's 16 columns x
// 2 halves, the staging writes' 32 consecutive columns of one row
// (test_panel_engine checks all three, and that it is a permutation).
static_assert(fold_rows == 64 && fold_cols == 128, "the staging swizzle's shape");
FLATMEM_HD int fold_slot(int r, int c) {
  const int quarter = (c >> 5) & 3, half = (r >> 5) & 1;
  return r * int(fold_cols) + (c ^ (((r & 7) | (quarter << 3)) ^ (half << 4)));
}

// A staged fold tile: entry (r, c) at slots[fold_slot(r, c)].
struct StagedTile {
  const float *slots;
  FLATMEM_HD float operator()(int r, int c) const { return slots[fold_slot(r, c)]; }
};

// Row `r` of a fold tile, quarter q (0..3), of a tile with `cols` real columns.
template <typename Tile>
FLATMEM_HD State fold_row_quarter(const Tile &tile, int r, int q, int cols, float s) {
  const int begin = q * row_quarter;
  const int n = cols - begin < row_quarter ? cols - begin : row_quarter;
  return n > 0 ? fold_segment([&](int i) { return tile(r, begin + i); }, n, s) : empty_state();
}

// Column `j` of a fold tile, half h (0..1), of a tile with `rows` real rows.
template <typename Tile>
FLATMEM_HD State fold_col_half(const Tile &tile, int j, int h, int rows, float s) {
  const int begin = h * col_half;
  const int n = rows - begin < col_half ? rows - begin : col_half;
  return n > 0 ? fold_segment([&](int i) { return tile(begin + i, j); }, n, s) : empty_state();
}

// The logit scale as the kernels use it: s outside (0, FLT_MAX] is NaN (the
// tile kernels' rule; the host validates CPU scales before this).
FLATMEM_HD float checked_scale(float s) { return (s > 0.0f && s <= 3.402823466e38f) ? s : NAN; }

// Gt of one element (N G / g): the softmax terms of the loss and the positive.
//   InfoNCE:   exp(x - row_lse) - [positive]
//   Symmetric: exp(x - row_lse) + exp(x - col_lse) - 2 [positive]
// `bad` (an out-of-range label) makes it NaN.
struct EntryTerms {
  bool symmetric = true;
  float row_lse = 0.0f, col_lse = 0.0f;
  bool positive = false, bad = false;
};
FLATMEM_HD float gradient_entry(float x, const EntryTerms &t) {
  if (t.bad) return NAN;
  float gt = exp_of(x - t.row_lse);
  if (t.symmetric) gt += exp_of(x - t.col_lse);
  if (t.positive) gt -= t.symmetric ? 2.0f : 1.0f;
  return gt;
}

// The sigmoid loss's element (SigLIP): x = s raw + t, z = +1 at the positive
// and -1 elsewhere, v = -z x; loss term softplus(v) = max(v, 0) +
// log1p(exp(-|v|)); Gt = -z sigmoid(v) (G without its g / b). `bad` (an
// out-of-range label) makes both NaN.
struct SigmoidEntry {
  float loss, gt;
};
FLATMEM_HD float log1p_of(float x) {
#if defined(__CUDA_ARCH__)
  return log1pf(x);
#else
  return std::log1p(x);
#endif
}
FLATMEM_HD SigmoidEntry sigmoid_entry(float x, bool positive, bool bad) {
  if (bad) return SigmoidEntry{NAN, NAN};
  const float v = positive ? -x : x;
  const float e = exp_of(-fabsf(v));
  const float sig = v >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
  return SigmoidEntry{fmaxf(v, 0.0f) + log1p_of(e), positive ? -sig : sig};  // Gt = -z sigmoid(v)
}

// Whether column `col` is row `row`'s positive, and whether its label is out
// of range. `row` and `col` index the call's own rows (and labels) and
// columns; row_offset / col_offset are their global offsets (a ring block:
// this rank's first row, the block's first column; 0 on one device). Labels
// hold global columns in [0, c); labels == nullptr pairs global row i with
// global column i.
FLATMEM_HD bool positive_of(const std::int64_t *labels, std::int64_t row, std::int64_t col, std::int64_t row_offset,
                            std::int64_t col_offset, std::int64_t c, bool *bad) {
  if (labels == nullptr) {
    *bad = false;
    return row + row_offset == col + col_offset;
  }
  const std::int64_t y = labels[row];
  *bad = y < 0 || y >= c;
  return y == col + col_offset;
}

// The gradient pass's per-element work distribution: a row of C entries is
// walked in chunks of pass_chunk columns; within a chunk, "lane" l (0..31)
// holds the pass_vector columns l * pass_vector ... Each lane sums Gt raw of
// its columns in fp32 in walk order; the row's ds part is the lanes' sums added
// by the tree ((l + l^16) ... pairwise halving) in double.
constexpr int pass_lanes = 32, pass_vector = 4, pass_chunk = pass_lanes * pass_vector;

}  // namespace flatmem::contrastive::panels
