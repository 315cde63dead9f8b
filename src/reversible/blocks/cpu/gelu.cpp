// GELU over a buffer, compiled once per CPU ISA (core/isa_variants.hpp).
#ifndef FLATMEM_ISA_NS
#include "reversible/blocks/cpu/gelu.hpp"

#include "core/isa_variants.hpp"

#define FLATMEM_ISA_SELF "reversible/blocks/cpu/gelu.cpp"
#include "core/compile_per_isa.inc"

namespace flatmem::blocks::cpu {

void gelu(const float *u, std::int64_t n, float *g) { FLATMEM_ISA_CALL(gelu, u, n, g); }

void gelu_backward(const float *u, std::int64_t n, float *g, float *d) {
  FLATMEM_ISA_CALL(gelu_backward, u, n, g, d);
}

}  // namespace flatmem::blocks::cpu

#else  // ---- kernels, once per ISA ------------------------------------------------

namespace flatmem::blocks::cpu::FLATMEM_ISA_NS {

void gelu(const float *u, std::int64_t n, float *g) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) {
    float cdf, pdf;
    normal_cdf_pdf(u[i], cdf, pdf);
    g[i] = u[i] * cdf;
  }
}

void gelu_backward(const float *u, std::int64_t n, float *g, float *d) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) {
    float cdf, pdf;
    normal_cdf_pdf(u[i], cdf, pdf);
    g[i] = u[i] * cdf;
    d[i] *= cdf + u[i] * pdf;
  }
}

}  // namespace flatmem::blocks::cpu::FLATMEM_ISA_NS
#endif
