// The blocks' fp32 products on the shared cuBLASLt wrapper (core/cuda/lt_matmul.hpp).
#include "reversible/blocks/cuda/matmul.hpp"

#include "core/cuda/lt_matmul.hpp"
#include "reversible/blocks/cuda/kernels.hpp"

namespace flatmem::blocks::cuda {
namespace {

namespace lt = flatmem::cuda::lt;

lt::MatrixArg operand(const Operand &o) {
  lt::MatrixArg m;
  m.data = o.data;
  m.type = lt::Type::f32;
  m.ld = o.ld;
  m.transposed = o.transposed;
  m.batch_stride = o.batch_stride;
  return m;
}

}  // namespace

void matmul(const MatmulContext &context, const Product &p) {
  lt::Gemm g;
  g.m = p.m, g.n = p.n, g.k = p.k, g.batch = p.batch;
  g.a = operand(p.a), g.b = operand(p.b);
  g.c = p.c, g.ldc = p.ldc, g.c_batch_stride = p.c_batch_stride;
  g.alpha = p.alpha, g.beta = p.beta, g.bias = p.bias;
  lt::Context c;
  c.device = context.device, c.tf32 = context.tf32, c.stream = context.stream;
  c.workspace = context.workspace, c.workspace_bytes = context.workspace_bytes;
  lt::matmul(c, g);
}

void linear_parameter_grads(const MatmulContext &context, const float *input, const float *dy, std::int64_t rows,
                            std::int64_t in, std::int64_t out, float *dW, float *db, float *columns) {
  matmul(context, single_product(in, out, rows, {input, in, true}, {dy, out}, dW, nullptr, 1.0f));
  column_sums(context.stream, dy, rows, out, db, columns);
}

}  // namespace flatmem::blocks::cuda
