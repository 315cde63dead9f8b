// Pre-LayerNorm multi-head self-attention on CUDA, F(x) = MHSA(LN(x)); the
// math of reversible/blocks/cpu/attention.cpp. The per-head products run as
// one strided-batched cuBLASLt call over all (batch, head) items, on q, k, v
// moved into the head layout (3, batch, heads, tokens, head_dim).
//
// Forward:  ln = LN(x); qkv = ln Wqkv + bqkv; heads <- qkv;
//           p = softmax(scale q k^T); a_h = p v; a <- heads; y = a Wproj + bproj
// VJP:      da = dy Wproj^T; dp = da_h v^T; dv = p^T da_h; ds = scale p o (dp - rowsum(p o dp));
//           dq = ds k; dk = ds^T q; dqkv <- heads; dln = dqkv Wqkv^T; dx += LN backward(dln);
//           dWproj += a^T dy, dbproj += colsum dy; dWqkv += ln^T dqkv, dbqkv += colsum dqkv;
//           dgamma, dbeta += LN column sums
//
// Residuals, 64-byte aligned regions: mean, rstd (rows), ln (rows x width),
// q, k, v in the head layout (3 rows width), a (rows x width), p (batch
// heads tokens^2): the CPU block's sizes, a different order of q, k, v.
#include <climits>
#include <cmath>

#include "core/cuda/device.hpp"
#include "core/error.hpp"
#include "core/workspace.hpp"
#include "reversible/blocks/cuda/blocks.hpp"
#include "reversible/blocks/cuda/kernels.hpp"
#include "reversible/blocks/cuda/matmul.hpp"
#include "reversible/blocks/cuda/scratch.hpp"

namespace flatmem::blocks::cuda {
namespace {

enum { ln_weight, ln_bias, qkv_weight, qkv_bias, proj_weight, proj_bias };

struct Saved {
  float *mean, *rstd, *ln, *q, *k, *v, *attn, *probs;
};

Saved carve_saved(WorkspaceCarver &c, const BlockShape &s) {
  Saved b;
  b.mean = c.take<float>(s.rows);
  b.rstd = c.take<float>(s.rows);
  b.ln = c.take<float>(s.rows * s.width);
  b.q = c.take<float>(3 * s.rows * s.width);
  b.k = b.q ? b.q + s.rows * s.width : nullptr;
  b.v = b.k ? b.k + s.rows * s.width : nullptr;
  b.attn = c.take<float>(s.rows * s.width);
  b.probs = c.take<float>(s.batch * s.heads * s.tokens * s.tokens);
  return b;
}

HeadLayout heads_of(const BlockShape &s, std::int64_t parts) {
  return {parts, s.batch, s.heads, s.tokens, s.head_dim};
}

float score_scale(const BlockShape &s) { return 1.0f / std::sqrt(float(s.head_dim)); }

// One (batch, head) item after another: (tokens x head_dim) in the head
// layout, (tokens x tokens) probability tiles.
Operand head_matrix(const float *data, const BlockShape &s, bool transposed = false) {
  return {data, s.head_dim, transposed, s.tokens * s.head_dim};
}
Operand tile_matrix(const float *data, const BlockShape &s, bool transposed = false) {
  return {data, s.tokens, transposed, s.tokens * s.tokens};
}

// The batched per-head product C = op(A) op(B) into head-layout outputs or
// probability tiles.
Product head_product(const BlockShape &s, std::int64_t m, std::int64_t n, std::int64_t k, Operand a,
                     Operand b, float *c, std::int64_t ldc, float alpha = 1.0f) {
  Product p;
  p.m = m, p.n = n, p.k = k;
  p.batch = s.batch * s.heads;
  p.a = a, p.b = b;
  p.c = c, p.ldc = ldc, p.c_batch_stride = ldc * m;
  p.alpha = alpha;
  return p;
}

void check_batch_count(const BlockShape &s) {
  if (s.batch * s.heads > INT_MAX)
    invalid("x: batch * heads = ", s.batch * s.heads, " exceeds cuBLASLt's batch count (2^31 - 1)");
}

}  // namespace

std::size_t attention_residual_bytes(const BlockShape &s) {
  WorkspaceCarver measure;
  carve_saved(measure, s);
  return measure.bytes();
}

void attention_forward(const DeviceCall &call, const BlockShape &s, const BlockParameters &p, const float *x,
                       float *y, void *residuals) {
  check_batch_count(s);
  flatmem::cuda::DeviceGuard guard(call.device, "x");
  const std::int64_t W = s.width, W3 = 3 * s.width, T = s.tokens, d = s.head_dim;
  Saved b{};
  float *qkv_rows = nullptr, *attn_heads = nullptr;
  CallScratch scratch(call, [&](WorkspaceCarver &c) {
    if (residuals == nullptr) b = carve_saved(c, s);
    qkv_rows = c.take<float>(s.rows * W3);
    attn_heads = c.take<float>(s.rows * W);
  });
  if (residuals != nullptr) {
    WorkspaceCarver kept(residuals);
    b = carve_saved(kept, s);
  }
  const MatmulContext &mm = scratch.matmul();
  const cudaStream_t stream = call.stream;

  layer_norm_forward(stream, x, s.rows, W, p.value[ln_weight], p.value[ln_bias], s.eps, b.ln, b.mean, b.rstd);
  matmul(mm, single_product(s.rows, W3, W, {b.ln, W}, {p.value[qkv_weight], W3}, qkv_rows, p.value[qkv_bias]));
  rows_to_heads(stream, heads_of(s, 3), qkv_rows, b.q);
  matmul(mm, head_product(s, T, T, d, head_matrix(b.q, s), head_matrix(b.k, s, true), b.probs, T,
                          score_scale(s)));
  softmax_rows(stream, b.probs, s.batch * s.heads * T, T);
  matmul(mm, head_product(s, T, d, T, tile_matrix(b.probs, s), head_matrix(b.v, s), attn_heads, d));
  heads_to_rows(stream, heads_of(s, 1), attn_heads, b.attn);
  matmul(mm, single_product(s.rows, W, W, {b.attn, W}, {p.value[proj_weight], W}, y, p.value[proj_bias]));
}

void attention_vjp(const DeviceCall &call, const BlockShape &s, const BlockParameters &p, const float *x,
                   const void *residuals, const float *dy, float *dx) {
  check_batch_count(s);
  flatmem::cuda::DeviceGuard guard(call.device, "x");
  const std::int64_t W = s.width, W3 = 3 * s.width, T = s.tokens, d = s.head_dim;
  WorkspaceCarver saved(const_cast<void *>(residuals));
  const Saved b = carve_saved(saved, s);
  float *da = nullptr, *da_heads = nullptr, *dprobs = nullptr, *dq = nullptr, *dqkv = nullptr,
        *columns = nullptr;
  CallScratch scratch(call, [&](WorkspaceCarver &c) {
    da = c.take<float>(s.rows * W);  // later dln
    da_heads = c.take<float>(s.rows * W);
    dprobs = c.take<float>(s.batch * s.heads * T * T);
    dq = c.take<float>(3 * s.rows * W);  // dq, dk, dv in the head layout
    dqkv = c.take<float>(s.rows * W3);
    columns = c.take<float>(column_sum_scratch(s.rows, W3));
  });
  float *dk = dq + s.rows * W, *dv = dk + s.rows * W;
  const MatmulContext &mm = scratch.matmul();
  const cudaStream_t stream = call.stream;

  matmul(mm, single_product(s.rows, W, W, {dy, W}, {p.value[proj_weight], W, true}, da));
  rows_to_heads(stream, heads_of(s, 1), da, da_heads);
  matmul(mm, head_product(s, T, T, d, head_matrix(da_heads, s), head_matrix(b.v, s, true), dprobs, T));
  matmul(mm, head_product(s, T, d, T, tile_matrix(b.probs, s, true), head_matrix(da_heads, s), dv, d));
  softmax_backward_rows(stream, b.probs, dprobs, s.batch * s.heads * T, T, score_scale(s));
  matmul(mm, head_product(s, T, d, T, tile_matrix(dprobs, s), head_matrix(b.k, s), dq, d));
  matmul(mm, head_product(s, T, d, T, tile_matrix(dprobs, s, true), head_matrix(b.q, s), dk, d));
  heads_to_rows(stream, heads_of(s, 3), dq, dqkv);
  float *dln = da;  // da is consumed (its head layout copy too)
  matmul(mm, single_product(s.rows, W, W3, {dqkv, W3}, {p.value[qkv_weight], W3, true}, dln));
  layer_norm_backward(stream, x, b.mean, b.rstd, dln, s.rows, W, p.value[ln_weight], dx);

  linear_parameter_grads(mm, b.attn, dy, s.rows, W, W, p.grad[proj_weight], p.grad[proj_bias], columns);
  linear_parameter_grads(mm, b.ln, dqkv, s.rows, W, W3, p.grad[qkv_weight], p.grad[qkv_bias], columns);
  layer_norm_parameter_grads(stream, x, b.mean, b.rstd, dln, s.rows, W, p.grad[ln_weight], p.grad[ln_bias],
                             columns);
}

}  // namespace flatmem::blocks::cuda
