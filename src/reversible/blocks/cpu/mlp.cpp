// Pre-LayerNorm MLP on the CPU, G(x) = GELU(LN(x) W1 + b1) W2 + b2.
//
// Forward, per 64-row slab, all steps fused so a slab stays in cache:
//   ln = LN(x);  u = ln W1 + b1;  g = GELU(u);  y = g W2 + b2
// VJP (dy given):
//   du = (dy W2^T) o GELU'(u), g = GELU(u) recomputed;
//   dln = du W1^T;  dx += LN backward(dln)                       row slabs
//   dW2 += g^T dy, db2 += sum_r dy;  dW1 += ln^T du, db1 += sum_r du;
//   dgamma += sum_r dln o xhat, dbeta += sum_r dln               column slabs
// (one sgemm per item; the weight-gradient GEMMs reduce over all rows inside
// one call, so no element's sum depends on the thread count).
//
// Residuals, 64-byte aligned regions in this order: mean, rstd (rows),
// ln (rows x width), u (rows x hidden): (width + hidden + 2) rows floats.
// GELU(u) is recomputed by the VJP rather than kept (hidden rows floats
// less). The forward without residuals keeps ln and u of one slab per thread.
#include "core/workspace.hpp"
#include "reversible/blocks/cpu/gelu.hpp"
#include "reversible/blocks/cpu/kernels.hpp"
#include "reversible/blocks/cpu/layer_norm.hpp"
#include "reversible/blocks/cpu/linear.hpp"
#include "reversible/blocks/cpu/scratch.hpp"

namespace flatmem::blocks::cpu {
namespace {

enum { ln_weight, ln_bias, fc1_weight, fc1_bias, fc2_weight, fc2_bias };

struct Saved {
  float *mean, *rstd, *ln, *u;
};

// `rows` rows of each: all of them (residuals) or slab_rows per thread.
Saved carve_saved(WorkspaceCarver &c, const BlockShape &s, std::int64_t rows) {
  Saved b;
  b.mean = c.take<float>(rows);
  b.rstd = c.take<float>(rows);
  b.ln = c.take<float>(rows * s.width);
  b.u = c.take<float>(rows * s.hidden);
  return b;
}

struct Gradients {
  float *gelu;  // GELU(u), rows x hidden
  float *du;    // dy W2^T, then du, rows x hidden
  float *dln;   // rows x width
};

Gradients carve_gradients(WorkspaceCarver &c, const BlockShape &s) {
  Gradients g;
  g.gelu = c.take<float>(s.rows * s.hidden);
  g.du = c.take<float>(s.rows * s.hidden);
  g.dln = c.take<float>(s.rows * s.width);
  return g;
}

}  // namespace

std::size_t mlp_residual_bytes(const BlockShape &s) {
  WorkspaceCarver measure;
  carve_saved(measure, s, s.rows);
  return measure.bytes();
}

void mlp_forward(const Parallel &parallel, const BlockShape &s, const BlockParameters &p,
                 const float *x, float *y, void *residuals) {
  const std::int64_t W = s.width, Hd = s.hidden, threads = parallel.threads();
  const bool keep = residuals != nullptr;
  // Per-thread slabs: ln and u (when not kept) and GELU(u).
  const auto carve_scratch = [&](WorkspaceCarver &c, Saved &slabs, float *&gelu) {
    slabs = carve_saved(c, s, keep ? 0 : threads * slab_rows);
    gelu = c.take<float>(threads * slab_rows * Hd);
  };
  Saved slabs;
  float *gelu_slabs;
  WorkspaceCarver measure;
  carve_scratch(measure, slabs, gelu_slabs);
  Scratch scratch(measure.bytes());
  WorkspaceCarver carve(scratch.data());
  carve_scratch(carve, slabs, gelu_slabs);
  Saved kept{};
  if (keep) {
    WorkspaceCarver residual_carve(residuals);
    kept = carve_saved(residual_carve, s, s.rows);
  }

  parallel.run(slab_count(s.rows, slab_rows), [&](std::int64_t item, int thread) {
    const Range r = slab_range(item, s.rows, slab_rows);
    const std::int64_t at = keep ? r.begin : thread * slab_rows;  // row in `rows`
    const Saved &rows = keep ? kept : slabs;
    float *ln = rows.ln + at * W, *u = rows.u + at * Hd;
    float *gelu_rows = gelu_slabs + thread * slab_rows * Hd;
    layer_norm_rows(x + r.begin * W, r.size(), W, p.value[ln_weight], p.value[ln_bias], s.eps, ln,
                    rows.mean + at, rows.rstd + at);
    linear_rows(ln, r.size(), W, p.value[fc1_weight], p.value[fc1_bias], Hd, u);
    gelu(u, r.size() * Hd, gelu_rows);
    linear_rows(gelu_rows, r.size(), Hd, p.value[fc2_weight], p.value[fc2_bias], W,
                y + r.begin * W);
  });
}

void mlp_vjp(const Parallel &parallel, const BlockShape &s, const BlockParameters &p,
             const float *x, const void *residuals, const float *dy, float *dx) {
  const std::int64_t W = s.width, Hd = s.hidden;
  WorkspaceCarver saved_carve(const_cast<void *>(residuals));
  const Saved b = carve_saved(saved_carve, s, s.rows);
  WorkspaceCarver measure;
  carve_gradients(measure, s);
  Scratch scratch(measure.bytes());
  WorkspaceCarver carve(scratch.data());
  const Gradients g = carve_gradients(carve, s);

  parallel.run(slab_count(s.rows, slab_rows), [&](std::int64_t item, int) {
    const Range r = slab_range(item, s.rows, slab_rows);
    float *du = g.du + r.begin * Hd, *dln = g.dln + r.begin * W;
    linear_input_grad_rows(dy + r.begin * W, r.size(), W, p.value[fc2_weight], Hd, du, false);
    gelu_backward(b.u + r.begin * Hd, r.size() * Hd, g.gelu + r.begin * Hd, du);
    linear_input_grad_rows(du, r.size(), Hd, p.value[fc1_weight], W, dln, false);
    layer_norm_backward_rows(x + r.begin * W, b.mean + r.begin, b.rstd + r.begin, dln, r.size(),
                             W, p.value[ln_weight], dx + r.begin * W);
  });

  // Largest jobs first: fc2 (hidden x 64 per slab), then fc1, then LayerNorm.
  run_column_slabs<3>(parallel, {W, Hd, W}, [&](std::size_t task, Range cols) {
    switch (task) {
      case 0:
        linear_parameter_grads(g.gelu, dy, s.rows, Hd, W, cols.begin, cols.end,
                               p.grad[fc2_weight], p.grad[fc2_bias]);
        break;
      case 1:
        linear_parameter_grads(b.ln, g.du, s.rows, W, Hd, cols.begin, cols.end,
                               p.grad[fc1_weight], p.grad[fc1_bias]);
        break;
      default:
        layer_norm_parameter_grads(x, b.mean, b.rstd, g.dln, s.rows, W, cols.begin, cols.end,
                                   p.grad[ln_weight], p.grad[ln_bias]);
    }
  });
}

}  // namespace flatmem::blocks::cpu
