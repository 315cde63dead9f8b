// The affine maps of the blocks, y = x W + b with x (rows, in), W (in, out)
// row-major, b (out), and their gradients. GEMMs go to the single-threaded
// GEMM (core/gemm/sgemm.hpp); the callers split the work into fixed slabs.
#pragma once

#include <cstdint>

namespace flatmem::blocks::cpu {

// y (rows, out) = x (rows, in) W + b. Leading dimensions are the widths.
void linear_rows(const float *x, std::int64_t rows, std::int64_t in, const float *weight,
                 const float *bias, std::int64_t out, float *y);

// dx (rows, in) = [accumulate ? dx : 0] + dy (rows, out) W^T.
void linear_input_grad_rows(const float *dy, std::int64_t rows, std::int64_t out,
                            const float *weight, std::int64_t in, float *dx, bool accumulate);

// Output columns [col_begin, col_end) of the parameter gradients:
//   dW[:, cols] += x^T dy[:, cols]    (one GEMM: the sum over all rows)
//   db[cols]    += sum_r dy[r, cols]  (in double, rows in order)
void linear_parameter_grads(const float *x, const float *dy, std::int64_t rows, std::int64_t in,
                            std::int64_t out, std::int64_t col_begin, std::int64_t col_end,
                            float *dweight, float *dbias);

}  // namespace flatmem::blocks::cpu
