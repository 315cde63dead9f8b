// Pre-LayerNorm MLP on CUDA, G(x) = GELU(LN(x) W1 + b1) W2 + b2; the math of
// reversible/blocks/cpu/mlp.cpp.
//
// Forward:  ln = LN(x); u = ln W1 + b1; g = GELU(u); y = g W2 + b2
// VJP:      du = (dy W2^T) o GELU'(u), g = GELU(u) recomputed; dln = du W1^T;
//           dx += LN backward(dln); dW2 += g^T dy, db2 += colsum dy;
//           dW1 += ln^T du, db1 += colsum du; dgamma, dbeta += LN column sums
//
// Residuals, 64-byte aligned regions: mean, rstd (rows), ln (rows x width),
// u (rows x hidden): the CPU block's layout.
#include "core/cuda/device.hpp"
#include "core/workspace.hpp"
#include "reversible/blocks/cuda/blocks.hpp"
#include "reversible/blocks/cuda/kernels.hpp"
#include "reversible/blocks/cuda/matmul.hpp"
#include "reversible/blocks/cuda/scratch.hpp"

namespace flatmem::blocks::cuda {
namespace {

enum { ln_weight, ln_bias, fc1_weight, fc1_bias, fc2_weight, fc2_bias };

struct Saved {
  float *mean, *rstd, *ln, *u;
};

Saved carve_saved(WorkspaceCarver &c, const BlockShape &s) {
  Saved b;
  b.mean = c.take<float>(s.rows);
  b.rstd = c.take<float>(s.rows);
  b.ln = c.take<float>(s.rows * s.width);
  b.u = c.take<float>(s.rows * s.hidden);
  return b;
}

}  // namespace

std::size_t mlp_residual_bytes(const BlockShape &s) {
  WorkspaceCarver measure;
  carve_saved(measure, s);
  return measure.bytes();
}

void mlp_forward(const DeviceCall &call, const BlockShape &s, const BlockParameters &p, const float *x, float *y,
                 void *residuals) {
  flatmem::cuda::DeviceGuard guard(call.device, "x");
  const std::int64_t W = s.width, Hd = s.hidden;
  Saved b{};
  float *g = nullptr;
  CallScratch scratch(call, [&](WorkspaceCarver &c) {
    if (residuals == nullptr) b = carve_saved(c, s);
    g = c.take<float>(s.rows * Hd);
  });
  if (residuals != nullptr) {
    WorkspaceCarver kept(residuals);
    b = carve_saved(kept, s);
  }
  const MatmulContext &mm = scratch.matmul();

  layer_norm_forward(call.stream, x, s.rows, W, p.value[ln_weight], p.value[ln_bias], s.eps, b.ln, b.mean,
                     b.rstd);
  matmul(mm, single_product(s.rows, Hd, W, {b.ln, W}, {p.value[fc1_weight], Hd}, b.u, p.value[fc1_bias]));
  gelu(call.stream, b.u, s.rows * Hd, g);
  matmul(mm, single_product(s.rows, W, Hd, {g, Hd}, {p.value[fc2_weight], W}, y, p.value[fc2_bias]));
}

void mlp_vjp(const DeviceCall &call, const BlockShape &s, const BlockParameters &p, const float *x,
             const void *residuals, const float *dy, float *dx) {
  flatmem::cuda::DeviceGuard guard(call.device, "x");
  const std::int64_t W = s.width, Hd = s.hidden;
  WorkspaceCarver saved(const_cast<void *>(residuals));
  const Saved b = carve_saved(saved, s);
  float *g = nullptr, *du = nullptr, *dln = nullptr, *columns = nullptr;
  CallScratch scratch(call, [&](WorkspaceCarver &c) {
    g = c.take<float>(s.rows * Hd);
    du = c.take<float>(s.rows * Hd);
    dln = c.take<float>(s.rows * W);
    columns = c.take<float>(column_sum_scratch(s.rows, Hd > W ? Hd : W));
  });
  const MatmulContext &mm = scratch.matmul();
  const cudaStream_t stream = call.stream;

  matmul(mm, single_product(s.rows, Hd, W, {dy, W}, {p.value[fc2_weight], W, true}, du));
  gelu_backward(stream, b.u, s.rows * Hd, g, du);
  matmul(mm, single_product(s.rows, W, Hd, {du, Hd}, {p.value[fc1_weight], Hd, true}, dln));
  layer_norm_backward(stream, x, b.mean, b.rstd, dln, s.rows, W, p.value[ln_weight], dx);

  linear_parameter_grads(mm, g, dy, s.rows, Hd, W, p.grad[fc2_weight], p.grad[fc2_bias], columns);
  linear_parameter_grads(mm, b.ln, du, s.rows, W, Hd, p.grad[fc1_weight], p.grad[fc1_bias], columns);
  layer_norm_parameter_grads(stream, x, b.mean, b.rstd, dln, s.rows, W, p.grad[ln_weight], p.grad[ln_bias],
                             columns);
}

}  // namespace flatmem::blocks::cuda
