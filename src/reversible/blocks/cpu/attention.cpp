// Pre-LayerNorm multi-head self-attention on the CPU, F(x) = MHSA(LN(x)).
//
// Forward, token rows r, heads h of d = width / heads columns:
//   ln = LN(x);  [q k v] = ln Wqkv + bqkv                       row slabs
//   p_h = softmax(q_h k_h^T / sqrt d);  a_h = p_h v_h           (batch, head) items
//   y = a Wproj + bproj                                          row slabs
// VJP (dy given):
//   da = dy Wproj^T                                              row slabs
//   dv_h = p_h^T da_h;  dp_h = da_h v_h^T;
//   ds_h = p_h o (dp_h - rowsum(p_h o dp_h)) / sqrt d;
//   dq_h = ds_h k_h;  dk_h = ds_h^T q_h                          (batch, head) items
//   dln = dqkv Wqkv^T;  dx += LN backward(dln)                   row slabs
//   dWproj += a^T dy, dbproj += sum_r dy;  dWqkv += ln^T dqkv, dbqkv += sum_r dqkv;
//   dgamma += sum_r dln o xhat, dbeta += sum_r dln               column slabs
// Every product is one sgemm per item (QK^T and PV per (batch, head), the
// projections per 64-row slab, the weight gradients per 64-column slab with
// the whole reduction over rows inside one call), so no element's sum depends
// on the thread count.
//
// Residuals, 64-byte aligned regions in this order: mean, rstd (rows),
// ln (rows x width), qkv (rows x 3 width), a (rows x width),
// p (batch x heads x tokens x tokens): (5 width + 2) rows + batch heads tokens^2
// floats. The forward without residuals uses the same layout in scratch, with
// one tokens^2 tile of p per thread instead.
#include <cmath>

#include "core/gemm/sgemm.hpp"
#include "core/workspace.hpp"
#include "reversible/blocks/cpu/kernels.hpp"
#include "reversible/blocks/cpu/layer_norm.hpp"
#include "reversible/blocks/cpu/linear.hpp"
#include "reversible/blocks/cpu/scratch.hpp"
#include "reversible/blocks/cpu/softmax.hpp"

namespace flatmem::blocks::cpu {
namespace {

enum { ln_weight, ln_bias, qkv_weight, qkv_bias, proj_weight, proj_bias };

struct Saved {
  float *mean, *rstd, *ln, *qkv, *attn, *probs;
};

// keep_probs: one probability tile per (batch, head) (residuals), else one per thread.
Saved carve_saved(WorkspaceCarver &c, const BlockShape &s, bool keep_probs, int threads) {
  Saved b;
  b.mean = c.take<float>(s.rows);
  b.rstd = c.take<float>(s.rows);
  b.ln = c.take<float>(s.rows * s.width);
  b.qkv = c.take<float>(s.rows * 3 * s.width);
  b.attn = c.take<float>(s.rows * s.width);
  b.probs = c.take<float>((keep_probs ? s.batch * s.heads : threads) * s.tokens * s.tokens);
  return b;
}

// What the VJP adds to the residuals.
struct Gradients {
  float *dattn;  // da, later dln (same shape, da is dead by then)
  float *dqkv;
  float *dprobs;  // one tokens^2 tile per thread
};

Gradients carve_gradients(WorkspaceCarver &c, const BlockShape &s, int threads) {
  Gradients g;
  g.dattn = c.take<float>(s.rows * s.width);
  g.dqkv = c.take<float>(s.rows * 3 * s.width);
  g.dprobs = c.take<float>(threads * s.tokens * s.tokens);
  return g;
}

float score_scale(const BlockShape &s) { return 1.0f / std::sqrt(float(s.head_dim)); }

}  // namespace

std::size_t attention_residual_bytes(const BlockShape &s) {
  WorkspaceCarver measure;
  carve_saved(measure, s, true, 1);
  return measure.bytes();
}

void attention_forward(const Parallel &parallel, const BlockShape &s, const BlockParameters &p,
                       const float *x, float *y, void *residuals) {
  const std::int64_t T = s.tokens, W = s.width, W3 = 3 * s.width, H = s.heads, d = s.head_dim;
  const bool keep = residuals != nullptr;
  WorkspaceCarver measure;
  carve_saved(measure, s, keep, parallel.threads());
  Scratch scratch(keep ? 0 : measure.bytes());
  WorkspaceCarver carve(keep ? residuals : scratch.data());
  const Saved b = carve_saved(carve, s, keep, parallel.threads());

  parallel.run(slab_count(s.rows, slab_rows), [&](std::int64_t item, int) {
    const Range r = slab_range(item, s.rows, slab_rows);
    layer_norm_rows(x + r.begin * W, r.size(), W, p.value[ln_weight], p.value[ln_bias], s.eps,
                    b.ln + r.begin * W, b.mean + r.begin, b.rstd + r.begin);
    linear_rows(b.ln + r.begin * W, r.size(), W, p.value[qkv_weight], p.value[qkv_bias], W3,
                b.qkv + r.begin * W3);
  });

  const float scale = score_scale(s);
  const cpu_isa::Isa isa = cpu_isa::for_kernels();
  parallel.run(s.batch * H, [&](std::int64_t item, int thread) {
    const std::int64_t batch = item / H, head = item % H;
    const float *q = b.qkv + batch * T * W3 + head * d, *k = q + W, *v = q + 2 * W;
    float *probs = b.probs + (keep ? item : thread) * T * T;
    gemm::sgemm(isa, gemm::Op::none, gemm::Op::transpose, T, T, d, scale, q, W3, k, W3, 0.0f, probs, T);
    softmax_rows(probs, T, T);
    gemm::sgemm(isa, gemm::Op::none, gemm::Op::none, T, d, T, 1.0f, probs, T, v, W3, 0.0f,
                b.attn + batch * T * W + head * d, W);
  });

  parallel.run(slab_count(s.rows, slab_rows), [&](std::int64_t item, int) {
    const Range r = slab_range(item, s.rows, slab_rows);
    linear_rows(b.attn + r.begin * W, r.size(), W, p.value[proj_weight], p.value[proj_bias], W,
                y + r.begin * W);
  });
}

void attention_vjp(const Parallel &parallel, const BlockShape &s, const BlockParameters &p,
                   const float *x, const void *residuals, const float *dy, float *dx) {
  const std::int64_t T = s.tokens, W = s.width, W3 = 3 * s.width, H = s.heads, d = s.head_dim;
  WorkspaceCarver saved_carve(const_cast<void *>(residuals));
  const Saved b = carve_saved(saved_carve, s, true, 1);
  WorkspaceCarver measure;
  carve_gradients(measure, s, parallel.threads());
  Scratch scratch(measure.bytes());
  WorkspaceCarver carve(scratch.data());
  const Gradients g = carve_gradients(carve, s, parallel.threads());

  parallel.run(slab_count(s.rows, slab_rows), [&](std::int64_t item, int) {
    const Range r = slab_range(item, s.rows, slab_rows);
    linear_input_grad_rows(dy + r.begin * W, r.size(), W, p.value[proj_weight], W,
                           g.dattn + r.begin * W, false);
  });

  const float scale = score_scale(s);
  const cpu_isa::Isa isa = cpu_isa::for_kernels();
  parallel.run(s.batch * H, [&](std::int64_t item, int thread) {
    const std::int64_t batch = item / H, head = item % H;
    const std::int64_t offset = batch * T * W3 + head * d;
    const float *q = b.qkv + offset, *k = q + W, *v = q + 2 * W;
    float *dq = g.dqkv + offset, *dk = dq + W, *dv = dq + 2 * W;
    const float *probs = b.probs + item * T * T;
    const float *da = g.dattn + batch * T * W + head * d;
    float *dprobs = g.dprobs + thread * T * T;
    gemm::sgemm(isa, gemm::Op::none, gemm::Op::transpose, T, T, d, 1.0f, da, W, v, W3, 0.0f, dprobs, T);
    gemm::sgemm(isa, gemm::Op::transpose, gemm::Op::none, T, d, T, 1.0f, probs, T, da, W, 0.0f, dv, W3);
    softmax_backward_rows(probs, dprobs, T, T, scale);
    gemm::sgemm(isa, gemm::Op::none, gemm::Op::none, T, d, T, 1.0f, dprobs, T, k, W3, 0.0f, dq, W3);
    gemm::sgemm(isa, gemm::Op::transpose, gemm::Op::none, T, d, T, 1.0f, dprobs, T, q, W3, 0.0f, dk, W3);
  });

  float *dln = g.dattn;  // da is consumed: reuse its rows for dln
  parallel.run(slab_count(s.rows, slab_rows), [&](std::int64_t item, int) {
    const Range r = slab_range(item, s.rows, slab_rows);
    linear_input_grad_rows(g.dqkv + r.begin * W3, r.size(), W3, p.value[qkv_weight], W,
                           dln + r.begin * W, false);
    layer_norm_backward_rows(x + r.begin * W, b.mean + r.begin, b.rstd + r.begin,
                             dln + r.begin * W, r.size(), W, p.value[ln_weight], dx + r.begin * W);
  });

  // Largest jobs first: qkv (3 width columns), then proj, then LayerNorm.
  run_column_slabs<3>(parallel, {W3, W, W}, [&](std::size_t task, Range cols) {
    switch (task) {
      case 0:
        linear_parameter_grads(b.ln, g.dqkv, s.rows, W, W3, cols.begin, cols.end,
                               p.grad[qkv_weight], p.grad[qkv_bias]);
        break;
      case 1:
        linear_parameter_grads(b.attn, dy, s.rows, W, W, cols.begin, cols.end,
                               p.grad[proj_weight], p.grad[proj_bias]);
        break;
      default:
        layer_norm_parameter_grads(x, b.mean, b.rstd, dln, s.rows, W, cols.begin, cols.end,
                                   p.grad[ln_weight], p.grad[ln_bias]);
    }
  });
}

}  // namespace flatmem::blocks::cpu
