#include "reversible/blocks/cpu/linear.hpp"

#include <cblas.h>

#include <algorithm>

#include "reversible/blocks/cpu/simd.hpp"

namespace flatmem::blocks::cpu {
namespace {

FLATMEM_BLOCK_SIMD
void broadcast_rows(const float *bias, std::int64_t rows, std::int64_t out, float *y) {
  for (std::int64_t r = 0; r < rows; ++r) {
    float *yr = y + r * out;
#pragma omp simd
    for (std::int64_t c = 0; c < out; ++c) yr[c] = bias[c];
  }
}

FLATMEM_BLOCK_SIMD
void column_sums(const float *a, std::int64_t rows, std::int64_t ld, std::int64_t col_begin,
                 std::int64_t col_end, float *sums) {
  constexpr std::int64_t chunk = 64;
  for (std::int64_t c0 = col_begin; c0 < col_end; c0 += chunk) {
    const std::int64_t n = std::min(chunk, col_end - c0);
    double acc[chunk] = {};
    for (std::int64_t r = 0; r < rows; ++r) {
      const float *ar = a + r * ld + c0;
#pragma omp simd
      for (std::int64_t c = 0; c < n; ++c) acc[c] += double(ar[c]);
    }
    for (std::int64_t c = 0; c < n; ++c) sums[c0 + c] += float(acc[c]);
  }
}

}  // namespace

void linear_rows(const float *x, std::int64_t rows, std::int64_t in, const float *weight,
                 const float *bias, std::int64_t out, float *y) {
  broadcast_rows(bias, rows, out, y);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(rows), int(out), int(in), 1.0f, x,
              int(in), weight, int(out), 1.0f, y, int(out));
}

void linear_input_grad_rows(const float *dy, std::int64_t rows, std::int64_t out,
                            const float *weight, std::int64_t in, float *dx, bool accumulate) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(rows), int(in), int(out), 1.0f, dy,
              int(out), weight, int(out), accumulate ? 1.0f : 0.0f, dx, int(in));
}

void linear_parameter_grads(const float *x, const float *dy, std::int64_t rows, std::int64_t in,
                            std::int64_t out, std::int64_t col_begin, std::int64_t col_end,
                            float *dweight, float *dbias) {
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(in), int(col_end - col_begin),
              int(rows), 1.0f, x, int(in), dy + col_begin, int(out), 1.0f, dweight + col_begin,
              int(out));
  column_sums(dy, rows, out, col_begin, col_end, dbias);
}

}  // namespace flatmem::blocks::cpu
