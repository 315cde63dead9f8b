// Row softmax and its backward, compiled once per CPU ISA (core/isa_variants.hpp).
#ifndef FLATMEM_ISA_NS
#include "reversible/blocks/cpu/softmax.hpp"

#include <limits>

#include "core/fast_exp.hpp"
#include "core/isa_variants.hpp"

#define FLATMEM_ISA_SELF "reversible/blocks/cpu/softmax.cpp"
#include "core/compile_per_isa.inc"

namespace flatmem::blocks::cpu {

void softmax_rows(float *scores, std::int64_t rows, std::int64_t cols) {
  FLATMEM_ISA_CALL(softmax_rows, scores, rows, cols);
}

void softmax_backward_rows(const float *p, float *dp, std::int64_t rows, std::int64_t cols,
                           float scale) {
  FLATMEM_ISA_CALL(softmax_backward_rows, p, dp, rows, cols, scale);
}

}  // namespace flatmem::blocks::cpu

#else  // ---- kernels, once per ISA ------------------------------------------------

namespace flatmem::blocks::cpu::FLATMEM_ISA_NS {


void softmax_rows(float *scores, std::int64_t rows, std::int64_t cols) {
  for (std::int64_t i = 0; i < rows; ++i) {
    float *s = scores + i * cols;
    float m = -std::numeric_limits<float>::infinity();
    float nan_probe = 0.0f;  // a max drops NaN: the probe puts it back
#pragma omp simd reduction(max : m) reduction(+ : nan_probe)
    for (std::int64_t j = 0; j < cols; ++j) {
      m = s[j] > m ? s[j] : m;
      nan_probe += s[j] * 0.0f;
    }
    if (nan_probe != nan_probe) m = nan_probe;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (std::int64_t j = 0; j < cols; ++j) {
      s[j] = fast_exp(s[j] - m);
      sum += s[j];
    }
    const float inv = 1.0f / sum;
#pragma omp simd
    for (std::int64_t j = 0; j < cols; ++j) s[j] *= inv;
  }
}

void softmax_backward_rows(const float *p, float *dp, std::int64_t rows, std::int64_t cols,
                           float scale) {
  for (std::int64_t i = 0; i < rows; ++i) {
    const float *pi = p + i * cols;
    float *di = dp + i * cols;
    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
    for (std::int64_t j = 0; j < cols; ++j) dot += pi[j] * di[j];
#pragma omp simd
    for (std::int64_t j = 0; j < cols; ++j) di[j] = scale * pi[j] * (di[j] - dot);
  }
}

}  // namespace flatmem::blocks::cpu::FLATMEM_ISA_NS
#endif
