#include "reversible/blocks/cpu/gelu.hpp"

#include "reversible/blocks/cpu/simd.hpp"

namespace flatmem::blocks::cpu {

FLATMEM_BLOCK_SIMD
void gelu(const float *u, std::int64_t n, float *g) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) {
    float cdf, pdf;
    normal_cdf_pdf(u[i], cdf, pdf);
    g[i] = u[i] * cdf;
  }
}

FLATMEM_BLOCK_SIMD
void gelu_backward(const float *u, std::int64_t n, float *g, float *d) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) {
    float cdf, pdf;
    normal_cdf_pdf(u[i], cdf, pdf);
    g[i] = u[i] * cdf;
    d[i] *= cdf + u[i] * pdf;
  }
}

}  // namespace flatmem::blocks::cpu
