// The panel engine's passes (kernels.hpp). Layout of the work:
//   fold:     one CTA of 256 threads per fold tile (64 x 128): the tile is
//             staged in shared memory (coalesced rows, at passes.hpp's
//             fold_slot: no warp access has a bank conflict), thread (r, q) folds
//             row r's quarter q, thread (j, h) column j's half h
//             (passes.hpp), then warp shuffles merge them in passes.hpp's order.
//   merge:    one thread per panel row and per panel column.
//   gradient: one warp per panel row; lane l holds columns 4l .. 4l + 3 of
//             every 128-column chunk (passes.hpp's distribution), read as one
//             float4 and written as one packed store where aligned, the next
//             chunk loaded before this one is written; one kernel per Gt type.
//   store:    a grid-stride loop over the accumulator.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "contrastive/panels/cuda/kernels.hpp"

namespace flatmem::contrastive::panels::cuda {
namespace {

constexpr int fold_threads = 256;
constexpr unsigned full_mask = 0xffffffffu;
static_assert(fold_rows * fold_cols == 32 * fold_threads, "a fold tile is 32 entries per thread");
static_assert(fold_rows * 4 == fold_threads && fold_cols * 2 == fold_threads, "thread <-> segment maps");

__device__ State shuffle_down(State s, int delta) {
  return State{__shfl_down_sync(full_mask, s.max, delta), __shfl_down_sync(full_mask, s.sum, delta)};
}

__global__ void __launch_bounds__(fold_threads) fold_kernel(FoldParams p) {
  __shared__ float tile[fold_rows * fold_cols];
  const std::int64_t fi = blockIdx.y, fj = blockIdx.x;
  const int tr = int(p.rows - fi * fold_rows < fold_rows ? p.rows - fi * fold_rows : fold_rows);
  const int tc = int(p.cols - fj * fold_cols < fold_cols ? p.cols - fj * fold_cols : fold_cols);
  const float s = checked_scale(*p.scale);
  const float *src = p.panel + fi * fold_rows * p.pitch + fj * fold_cols;
  for (int e = threadIdx.x; e < int(fold_rows * fold_cols); e += fold_threads) {
    const int r = e / int(fold_cols), c = e % int(fold_cols);
    tile[fold_slot(r, c)] = (r < tr && c < tc) ? src[r * p.pitch + c] : 0.0f;
  }
  __syncthreads();
  const StagedTile view{tile};
  {
    const int r = threadIdx.x >> 2, q = threadIdx.x & 3;
    State st = r < tr ? fold_row_quarter(view, r, q, tc, s) : empty_state();
    State other = shuffle_down(st, 1);
    if ((q & 1) == 0) merge(st, other);  // q0 + q1, q2 + q3
    other = shuffle_down(st, 2);
    if (q == 0) merge(st, other);  // (q0 + q1) + (q2 + q3)
    if (q == 0 && r < tr) p.row_parts[(fi * fold_rows + r) * p.col_folds + fj] = st;
  }
  if (p.col_parts) {
    const int j = threadIdx.x >> 1, h = threadIdx.x & 1;
    State st = j < tc ? fold_col_half(view, j, h, tr, s) : empty_state();
    const State other = shuffle_down(st, 1);
    if (h == 0) merge(st, other);
    if (h == 0 && j < tc) p.col_parts[(fj * fold_cols + j) * p.row_folds + fi] = st;
  }
}

__global__ void merge_kernel(MergeParams p) {
  const std::int64_t idx = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx < p.rows) {
    const std::int64_t n = (p.cols + fold_cols - 1) / fold_cols;
    const State *parts = p.row_parts + idx * p.col_folds;
    State st = parts[0];
    for (std::int64_t f = 1; f < n; ++f) merge(st, parts[f]);
    merge(p.row_state[p.row0 + idx], st);
  } else if (p.col_parts && idx < p.rows + p.cols) {
    const std::int64_t c = idx - p.rows, n = (p.rows + fold_rows - 1) / fold_rows;
    const State *parts = p.col_parts + c * p.row_folds;
    State st = parts[0];
    for (std::int64_t f = 1; f < n; ++f) merge(st, parts[f]);
    merge(p.col_state[p.col0 + c], st);
  }
}

__global__ void reset_kernel(State *states, std::int64_t n) {
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x)
    states[i] = empty_state();
}

constexpr int gradient_warps = 8;

// One lane's pass_vector raw logits of a chunk (columns c .. c + 3 of `line`):
// one 16-byte load where the row is 16-byte aligned and all four are real,
// else element by element (missing columns read as 0).
__device__ void load_lane(const float *line, std::int64_t c, std::int64_t cols, bool vector_rows,
                          float (&raw)[pass_vector]) {
  if (vector_rows && c + pass_vector <= cols) {
    const float4 v = *reinterpret_cast<const float4 *>(line + c);
    raw[0] = v.x, raw[1] = v.y, raw[2] = v.z, raw[3] = v.w;
    return;
  }
#pragma unroll
  for (int v = 0; v < pass_vector; ++v) raw[v] = c + v < cols ? line[c + v] : 0.0f;
}

// Gt of columns c .. c + 3 into `line` as T: 16-bit types at element c of the
// row seen as 16-bit (its first half), fp32 over the raw logits. One 8- or
// 16-byte store where aligned and all four are real, else element by element.
template <GType T>
__device__ void store_lane(float *line, std::int64_t c, std::int64_t cols, bool vector_rows,
                           const float (&gt)[pass_vector]) {
  static_assert(pass_vector == 4, "packed stores of four");
  if (vector_rows && c + pass_vector <= cols) {
    if constexpr (T == GType::bf16) {
      const __nv_bfloat162 lo = __floats2bfloat162_rn(gt[0], gt[1]), hi = __floats2bfloat162_rn(gt[2], gt[3]);
      uint2 packed;
      packed.x = *reinterpret_cast<const unsigned *>(&lo), packed.y = *reinterpret_cast<const unsigned *>(&hi);
      *reinterpret_cast<uint2 *>(reinterpret_cast<__nv_bfloat16 *>(line) + c) = packed;
    } else if constexpr (T == GType::f16) {
      const __half2 lo = __floats2half2_rn(gt[0], gt[1]), hi = __floats2half2_rn(gt[2], gt[3]);
      uint2 packed;
      packed.x = *reinterpret_cast<const unsigned *>(&lo), packed.y = *reinterpret_cast<const unsigned *>(&hi);
      *reinterpret_cast<uint2 *>(reinterpret_cast<__half *>(line) + c) = packed;
    } else {
      *reinterpret_cast<float4 *>(line + c) = make_float4(gt[0], gt[1], gt[2], gt[3]);
    }
    return;
  }
#pragma unroll
  for (int v = 0; v < pass_vector; ++v) {
    if (c + v >= cols) break;
    if constexpr (T == GType::bf16) reinterpret_cast<__nv_bfloat16 *>(line)[c + v] = __float2bfloat16_rn(gt[v]);
    else if constexpr (T == GType::f16) reinterpret_cast<__half *>(line)[c + v] = __float2half_rn(gt[v]);
    else line[c + v] = gt[v];
  }
}

// target[row] += the warp's lane values added in a fixed tree (in double); a
// null target (not wanted: the same for the whole warp) adds nothing.
__device__ void add_row_sum(float lane_value, double *target, std::int64_t row, int lane) {
  if (!target) return;
  double sum = lane_value;
  for (int half = 16; half > 0; half >>= 1) {
    const double other = __shfl_down_sync(full_mask, sum, half);
    if (lane < half) sum += other;
  }
  if (lane == 0) target[row] += sum;
}

// Softmax (Sigmoid = false) or the sigmoid loss (Sigmoid = true: also the loss
// and dt row sums); T: the type Gt is written in. Lane l owns columns
// 4l .. 4l + 3 of every 128-column chunk (passes.hpp), so the bits are the CPU
// executor's. The next chunk is loaded before this one is written: a chunk's
// 16-bit Gt lands in fp32 columns [c0 / 2, c0 / 2 + 64), which every lane read
// before the __syncwarp of this chunk (chunk 0: of this very chunk), never in
// a chunk still to be read.
template <bool Sigmoid, GType T>
__global__ void __launch_bounds__(gradient_warps * 32) gradient_kernel(GradientParams p) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const std::int64_t r = std::int64_t(blockIdx.x) * gradient_warps + warp;
  if (r >= p.rows) return;  // the whole warp
  const std::int64_t row = p.row0 + r;
  const float s = checked_scale(*p.scale);
  float *line = p.panel + r * p.pitch;
  const bool vector_rows = p.pitch % pass_vector == 0;  // rows 16-byte aligned (the panel is 256-byte aligned)
  EntryTerms t;
  t.symmetric = p.symmetric;
  if constexpr (!Sigmoid) t.row_lse = p.row_lse[row];
  float bias = 0.0f, loss = 0.0f, dt = 0.0f;
  if constexpr (Sigmoid) bias = *p.bias;
  float ds = 0.0f;
  float raw[pass_vector], next[pass_vector];
  load_lane(line, std::int64_t(lane) * pass_vector, p.cols, vector_rows, raw);
  for (std::int64_t c0 = 0; c0 < p.cols; c0 += pass_chunk) {
    const std::int64_t first = c0 + lane * pass_vector;  // this lane's first column of the chunk
    const bool more = c0 + pass_chunk < p.cols;
    if (more) load_lane(line, first + pass_chunk, p.cols, vector_rows, next);
    __syncwarp();  // every lane has read this chunk before any lane writes over it
    float gt[pass_vector];
#pragma unroll
    for (int v = 0; v < pass_vector; ++v) {
      const std::int64_t c = first + v;
      gt[v] = 0.0f;
      if (c >= p.cols) continue;
      const std::int64_t col = p.col0 + c;
      if (p.symmetric) t.col_lse = p.col_lse[col];
      t.positive = positive_of(p.labels, row, col, p.row_offset, p.col_offset, p.c, &t.bad);
      if constexpr (Sigmoid) {
        const SigmoidEntry e = sigmoid_entry(s * raw[v] + bias, t.positive, t.bad);
        gt[v] = e.gt;
        loss += e.loss;
        dt += e.gt;
      } else {
        gt[v] = gradient_entry(s * raw[v], t);
      }
      ds += gt[v] * raw[v];
    }
    store_lane<T>(line, first, p.cols, vector_rows, gt);
    if (more) {
#pragma unroll
      for (int v = 0; v < pass_vector; ++v) raw[v] = next[v];
    }
  }
  // Each wanted sum: the lanes' fp32 sums added in passes.hpp's tree order, in double.
  add_row_sum(ds, p.ds_rows, row, lane);
  if constexpr (Sigmoid) {
    add_row_sum(loss, p.loss_rows, row, lane);
    add_row_sum(dt, p.dt_rows, row, lane);
  }
}

template <bool Sigmoid>
void launch_gradient_as(const GradientParams &p, unsigned blocks, cudaStream_t stream) {
  switch (p.g_type) {
    case GType::bf16: gradient_kernel<Sigmoid, GType::bf16><<<blocks, gradient_warps * 32, 0, stream>>>(p); break;
    case GType::f16: gradient_kernel<Sigmoid, GType::f16><<<blocks, gradient_warps * 32, 0, stream>>>(p); break;
    default: gradient_kernel<Sigmoid, GType::f32><<<blocks, gradient_warps * 32, 0, stream>>>(p); break;
  }
}

__global__ void store_kernel(StoreParams p) {
  const float s = checked_scale(*p.scale);
  const float g = p.dloss ? *p.dloss : 1.0f;
  const float mult = float(double(s) * double(g) * p.inv_n);
  const std::int64_t n = p.rows * p.d;
  for (std::int64_t e = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n;
       e += std::int64_t(gridDim.x) * blockDim.x) {
    const std::int64_t r = e / p.d, f = e % p.d;
    const float v = mult * p.acc[e];
    const std::int64_t at = r * p.out_ld + f;
    switch (p.out_type) {
      case GType::bf16: static_cast<__nv_bfloat16 *>(p.out)[at] = __float2bfloat16_rn(v); break;
      case GType::f16: static_cast<__half *>(p.out)[at] = __float2half_rn(v); break;
      default: static_cast<float *>(p.out)[at] = v; break;
    }
  }
}

int blocks_for(std::int64_t n, int threads) {
  const std::int64_t b = (n + threads - 1) / threads;
  return int(b < 4096 ? (b < 1 ? 1 : b) : 4096);
}

}  // namespace

cudaError_t launch_fold(const FoldParams &p, cudaStream_t stream) {
  const dim3 grid(unsigned((p.cols + fold_cols - 1) / fold_cols), unsigned((p.rows + fold_rows - 1) / fold_rows));
  fold_kernel<<<grid, fold_threads, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t launch_merge(const MergeParams &p, cudaStream_t stream) {
  const std::int64_t n = p.rows + (p.col_parts ? p.cols : 0);
  merge_kernel<<<unsigned((n + 255) / 256), 256, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t launch_reset(State *states, std::int64_t n, cudaStream_t stream) {
  reset_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(states, n);
  return cudaGetLastError();
}

cudaError_t launch_gradient(const GradientParams &p, cudaStream_t stream) {
  const unsigned blocks = unsigned((p.rows + gradient_warps - 1) / gradient_warps);
  if (p.sigmoid)
    launch_gradient_as<true>(p, blocks, stream);
  else
    launch_gradient_as<false>(p, blocks, stream);
  return cudaGetLastError();
}

cudaError_t launch_store(const StoreParams &p, cudaStream_t stream) {
  store_kernel<<<blocks_for(p.rows * p.d, 256), 256, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace flatmem::contrastive::panels::cuda
