// LayerNorm rows, their backward and parameter gradients, compiled once per
// CPU ISA (core/isa_variants.hpp).
#ifndef FLATMEM_ISA_NS
#include "reversible/blocks/cpu/layer_norm.hpp"

#include <algorithm>
#include <cmath>

#include "core/isa_variants.hpp"

#define FLATMEM_ISA_SELF "reversible/blocks/cpu/layer_norm.cpp"
#include "core/compile_per_isa.inc"

namespace flatmem::blocks::cpu {

void layer_norm_rows(const float *x, std::int64_t rows, std::int64_t width, const float *gamma,
                     const float *beta, float eps, float *y, float *mean, float *rstd) {
  FLATMEM_ISA_CALL(layer_norm_rows, x, rows, width, gamma, beta, eps, y, mean, rstd);
}

void layer_norm_backward_rows(const float *x, const float *mean, const float *rstd,
                              const float *dy, std::int64_t rows, std::int64_t width,
                              const float *gamma, float *dx) {
  FLATMEM_ISA_CALL(layer_norm_backward_rows, x, mean, rstd, dy, rows, width, gamma, dx);
}

void layer_norm_parameter_grads(const float *x, const float *mean, const float *rstd,
                                const float *dy, std::int64_t rows, std::int64_t width,
                                std::int64_t col_begin, std::int64_t col_end, float *dgamma,
                                float *dbeta) {
  FLATMEM_ISA_CALL(layer_norm_parameter_grads, x, mean, rstd, dy, rows, width, col_begin, col_end,
                   dgamma, dbeta);
}

}  // namespace flatmem::blocks::cpu

#else  // ---- kernels, once per ISA ------------------------------------------------

namespace flatmem::blocks::cpu::FLATMEM_ISA_NS {


void layer_norm_rows(const float *x, std::int64_t rows, std::int64_t width, const float *gamma,
                     const float *beta, float eps, float *y, float *mean, float *rstd) {
  const float inv_width = 1.0f / float(width);
  for (std::int64_t r = 0; r < rows; ++r) {
    const float *xr = x + r * width;
    float *yr = y + r * width;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (std::int64_t c = 0; c < width; ++c) sum += xr[c];
    const float m = sum * inv_width;
    float squares = 0.0f;  // two passes: no cancellation when |mean| >> std
#pragma omp simd reduction(+ : squares)
    for (std::int64_t c = 0; c < width; ++c) squares += (xr[c] - m) * (xr[c] - m);
    const float s = 1.0f / std::sqrt(squares * inv_width + eps);
#pragma omp simd
    for (std::int64_t c = 0; c < width; ++c) yr[c] = (xr[c] - m) * s * gamma[c] + beta[c];
    mean[r] = m;
    rstd[r] = s;
  }
}

void layer_norm_backward_rows(const float *x, const float *mean, const float *rstd,
                              const float *dy, std::int64_t rows, std::int64_t width,
                              const float *gamma, float *dx) {
  const float inv_width = 1.0f / float(width);
  for (std::int64_t r = 0; r < rows; ++r) {
    const float *xr = x + r * width, *dyr = dy + r * width;
    float *dxr = dx + r * width;
    const float m = mean[r], s = rstd[r];
    float sum_g = 0.0f, sum_g_xhat = 0.0f;
#pragma omp simd reduction(+ : sum_g, sum_g_xhat)
    for (std::int64_t c = 0; c < width; ++c) {
      const float g = dyr[c] * gamma[c];
      sum_g += g;
      sum_g_xhat += g * ((xr[c] - m) * s);
    }
    const float mean_g = sum_g * inv_width, mean_g_xhat = sum_g_xhat * inv_width;
#pragma omp simd
    for (std::int64_t c = 0; c < width; ++c) {
      const float xhat = (xr[c] - m) * s;
      dxr[c] += s * (dyr[c] * gamma[c] - mean_g - xhat * mean_g_xhat);
    }
  }
}

void layer_norm_parameter_grads(const float *x, const float *mean, const float *rstd,
                                const float *dy, std::int64_t rows, std::int64_t width,
                                std::int64_t col_begin, std::int64_t col_end, float *dgamma,
                                float *dbeta) {
  // Sums over rows in double (cheap next to the GEMMs), columns in chunks.
  constexpr std::int64_t chunk = 64;
  for (std::int64_t c0 = col_begin; c0 < col_end; c0 += chunk) {
    const std::int64_t n = std::min(chunk, col_end - c0);
    double sg[chunk] = {}, sb[chunk] = {};
    for (std::int64_t r = 0; r < rows; ++r) {
      const float *xr = x + r * width + c0, *dyr = dy + r * width + c0;
      const float m = mean[r], s = rstd[r];
#pragma omp simd
      for (std::int64_t c = 0; c < n; ++c) {
        sg[c] += double(dyr[c] * ((xr[c] - m) * s));
        sb[c] += double(dyr[c]);
      }
    }
    for (std::int64_t c = 0; c < n; ++c) {
      dgamma[c0 + c] += float(sg[c]);
      dbeta[c0 + c] += float(sb[c]);
    }
  }
}

}  // namespace flatmem::blocks::cpu::FLATMEM_ISA_NS
#endif
