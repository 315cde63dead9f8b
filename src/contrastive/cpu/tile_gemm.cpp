#include "contrastive/cpu/tile_gemm.hpp"

#include "core/gemm/sgemm.hpp"

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

TileProducts tile_products(const Plan &plan, Dtype input) {
  TileProducts p;
  p.isa = cpu_isa::for_kernels();
  if (input == Dtype::bf16) p.bf16 = amx::active() ? Bf16Engine::amx : bf16::active() ? Bf16Engine::vdpbf16ps
                                                                                       : Bf16Engine::widened;
  p.split_gradient = plan.split_gradient;
  return p;
}

TileRows tile_rows(const TileProducts &engine, const MatrixView &m, Range range, float *scratch) {
  TileRows t;
  if (engine.bf16 != Bf16Engine::widened) {
    t.bf16 = {m.row<const std::uint16_t>(range.begin), m.row_stride};
    return t;
  }
  switch (m.dtype) {
    case Dtype::bf16: widen_rows(m, range, scratch, bf16_to_f32); t.data = scratch, t.ld = m.cols; break;
    case Dtype::f16: widen_rows(m, range, scratch, f16_to_f32); t.data = scratch, t.ld = m.cols; break;
    default: t.data = m.row<const float>(range.begin), t.ld = m.row_stride;
  }
  return t;
}

void tile_logits(const TileProducts &engine, const TileRows &q, const TileRows &k, std::int64_t rows,
                 std::int64_t cols, std::int64_t d, float *raw, std::uint32_t *pack) {
  if (engine.bf16 == Bf16Engine::amx) return amx::tile_logits(q.bf16, k.bf16, rows, cols, d, raw, pack);
  if (q.bf16.data) return bf16::tile_logits(q.bf16, k.bf16, rows, cols, d, raw, pack);
  gemm::sgemm(engine.isa, gemm::Op::none, gemm::Op::transpose, rows, cols, d, 1.0f, q.data, q.ld, k.data,
              k.ld, 0.0f, raw, cols);
}

void accumulate_rows_times(const TileProducts &engine, const float *g, const TileRows &k,
                           std::int64_t rows, std::int64_t cols, std::int64_t d, float *out,
                           std::int64_t out_ld, std::uint32_t *pack) {
  if (engine.bf16 == Bf16Engine::amx)
    return amx::accumulate_rows_times(g, k.bf16, rows, cols, d, out, out_ld, engine.split_gradient, pack);
  if (k.bf16.data)
    return bf16::accumulate_rows_times(g, k.bf16, rows, cols, d, out, out_ld, engine.split_gradient, pack);
  gemm::sgemm(engine.isa, gemm::Op::none, gemm::Op::none, rows, d, cols, 1.0f, g, cols, k.data, k.ld,
              1.0f, out, out_ld);
}

void accumulate_cols_times(const TileProducts &engine, const float *g, const TileRows &q,
                           std::int64_t rows, std::int64_t cols, std::int64_t d, float *out,
                           std::int64_t out_ld, std::uint32_t *pack) {
  if (engine.bf16 == Bf16Engine::amx)
    return amx::accumulate_cols_times(g, q.bf16, rows, cols, d, out, out_ld, engine.split_gradient, pack);
  if (q.bf16.data)
    return bf16::accumulate_cols_times(g, q.bf16, rows, cols, d, out, out_ld, engine.split_gradient, pack);
  gemm::sgemm(engine.isa, gemm::Op::transpose, gemm::Op::none, cols, d, rows, 1.0f, g, cols, q.data, q.ld,
              1.0f, out, out_ld);
}

}  // namespace flatmem::contrastive::cpu
