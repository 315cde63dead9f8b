// The affine maps of the blocks: GEMMs in flatmem's sgemm (core/gemm/sgemm.hpp)
// at the active CPU ISA; the bias broadcast and column sums compiled once per
// CPU ISA (core/isa_variants.hpp).
#ifndef FLATMEM_ISA_NS
#include "reversible/blocks/cpu/linear.hpp"

#include <algorithm>

#include "core/gemm/sgemm.hpp"
#include "core/isa_variants.hpp"

#define FLATMEM_ISA_SELF "reversible/blocks/cpu/linear.cpp"
#include "core/compile_per_isa.inc"

namespace flatmem::blocks::cpu {
namespace {

void broadcast_rows_isa(const float *bias, std::int64_t rows, std::int64_t out, float *y) {
  FLATMEM_ISA_CALL(broadcast_rows, bias, rows, out, y);
}

void column_sums_isa(const float *a, std::int64_t rows, std::int64_t ld, std::int64_t col_begin,
                     std::int64_t col_end, float *sums) {
  FLATMEM_ISA_CALL(column_sums, a, rows, ld, col_begin, col_end, sums);
}

}  // namespace

void linear_rows(const float *x, std::int64_t rows, std::int64_t in, const float *weight,
                 const float *bias, std::int64_t out, float *y) {
  broadcast_rows_isa(bias, rows, out, y);
  gemm::sgemm(cpu_isa::for_kernels(), gemm::Op::none, gemm::Op::none, rows, out, in, 1.0f, x, in, weight,
              out, 1.0f, y, out);
}

void linear_input_grad_rows(const float *dy, std::int64_t rows, std::int64_t out,
                            const float *weight, std::int64_t in, float *dx, bool accumulate) {
  gemm::sgemm(cpu_isa::for_kernels(), gemm::Op::none, gemm::Op::transpose, rows, in, out, 1.0f, dy, out,
              weight, out, accumulate ? 1.0f : 0.0f, dx, in);
}

void linear_parameter_grads(const float *x, const float *dy, std::int64_t rows, std::int64_t in,
                            std::int64_t out, std::int64_t col_begin, std::int64_t col_end,
                            float *dweight, float *dbias) {
  gemm::sgemm(cpu_isa::for_kernels(), gemm::Op::transpose, gemm::Op::none, in, col_end - col_begin, rows,
              1.0f, x, in, dy + col_begin, out, 1.0f, dweight + col_begin, out);
  column_sums_isa(dy, rows, out, col_begin, col_end, dbias);
}

}  // namespace flatmem::blocks::cpu

#else  // ---- kernels, once per ISA ------------------------------------------------

namespace flatmem::blocks::cpu::FLATMEM_ISA_NS {


void broadcast_rows(const float *bias, std::int64_t rows, std::int64_t out, float *y) {
  for (std::int64_t r = 0; r < rows; ++r) {
    float *yr = y + r * out;
#pragma omp simd
    for (std::int64_t c = 0; c < out; ++c) yr[c] = bias[c];
  }
}

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

}  // namespace flatmem::blocks::cpu::FLATMEM_ISA_NS
#endif
