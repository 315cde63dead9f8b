#include "contrastive/cpu/tile_gemm.hpp"

#include <cblas.h>

namespace flatmem::contrastive::cpu {
namespace {

template <typename Widen>
void widen_rows(const MatrixView &m, Range range, float *out, Widen widen) {
  for (std::int64_t r = range.begin; r < range.end; ++r) {
    const auto *src = m.row<const std::uint16_t>(r);
    float *dst = out + (r - range.begin) * m.cols;
    for (std::int64_t j = 0; j < m.cols; ++j) dst[j] = widen(src[j]);
  }
}

}  // namespace

Fp32Rows fp32_rows(const MatrixView &m, Range range, float *scratch) {
  switch (m.dtype) {
    case Dtype::bf16: widen_rows(m, range, scratch, bf16_to_f32); return {scratch, m.cols};
    case Dtype::f16: widen_rows(m, range, scratch, f16_to_f32); return {scratch, m.cols};
    default: return {m.row<const float>(range.begin), m.row_stride};
  }
}

void tile_logits(const Fp32Rows &q, const Fp32Rows &k, std::int64_t rows, std::int64_t cols,
                 std::int64_t d, float *raw) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(rows), int(cols), int(d), 1.0f, q.data,
              int(q.ld), k.data, int(k.ld), 0.0f, raw, int(cols));
}

void accumulate_rows_times(const float *g, const Fp32Rows &k, std::int64_t rows, std::int64_t cols,
                           std::int64_t d, float *out, std::int64_t out_ld) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(rows), int(d), int(cols), 1.0f, g,
              int(cols), k.data, int(k.ld), 1.0f, out, int(out_ld));
}

void accumulate_cols_times(const float *g, const Fp32Rows &q, std::int64_t rows, std::int64_t cols,
                           std::int64_t d, float *out, std::int64_t out_ld) {
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(cols), int(d), int(rows), 1.0f, g,
              int(cols), q.data, int(q.ld), 1.0f, out, int(out_ld));
}

}  // namespace flatmem::contrastive::cpu
