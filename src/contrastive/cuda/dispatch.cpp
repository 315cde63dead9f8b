#include "contrastive/cuda/dispatch.hpp"

#include <algorithm>

#include "contrastive/cuda/kernels.hpp"

namespace flatmem::contrastive::cuda {

Operand operand_for(Dtype dtype, Fp32Precision precision) {
  switch (dtype) {
    case Dtype::bf16: return Operand::bf16;
    case Dtype::f16: return Operand::f16;
    default: return precision == Fp32Precision::full ? Operand::f32x3 : Operand::tf32;
  }
}

OutType out_type_for(Dtype dtype) {
  return dtype == Dtype::bf16 ? OutType::bf16 : dtype == Dtype::f16 ? OutType::f16 : OutType::f32;
}

Matrix device_matrix(const MatrixView &m) {
  Matrix d;
  d.data = m.data;
  d.rows = m.rows;
  d.cols = m.cols;
  d.ld = m.row_stride;
  const auto address = reinterpret_cast<std::uintptr_t>(m.data);
  const std::int64_t pitch_bytes = m.row_stride * std::int64_t(dtype_bytes(m.dtype));
  d.vector_loads = address % 16 == 0 && (m.rows == 1 || pitch_bytes % 16 == 0);
  return d;
}

ForwardGrid forward_grid(std::int64_t b, std::int64_t c) {
  ForwardGrid g;
  g.row_groups = int(std::min<std::int64_t>(max_row_groups, ceil_div(b, tile_rows)));
  g.col_groups = int(std::min<std::int64_t>(max_col_groups, ceil_div(c, tile_cols)));
  g.finish_blocks = int(std::min<std::int64_t>(1024, ceil_div(b, 8)));
  return g;
}

namespace {
constexpr int slots_per_multiprocessor = 2;
}  // namespace

int slot_pitch(std::int64_t d) { return int(ceil_div(d, chunk_out) * chunk_out); }

int pass_grid(std::int64_t rows, int multiprocessors) {
  return int(std::min<std::int64_t>(ceil_div(rows, tile_rows),
                                    std::int64_t(slots_per_multiprocessor) * multiprocessors));
}

// One switch per kernel family: the operand type is a template argument of
// every tile kernel.
#define FLATMEM_DISPATCH(launch, ...)                                           \
  switch (op) {                                                                 \
    case Operand::bf16: return launch<Operand::bf16>(__VA_ARGS__);              \
    case Operand::f16: return launch<Operand::f16>(__VA_ARGS__);                \
    case Operand::tf32: return launch<Operand::tf32>(__VA_ARGS__);              \
    case Operand::f32x3: return launch<Operand::f32x3>(__VA_ARGS__);            \
  }                                                                             \
  return cudaErrorInvalidValue

cudaError_t launch_tiles_for(Operand op, const ForwardTileParams &p, cudaStream_t stream) {
  FLATMEM_DISPATCH(launch_forward_tiles, p, stream);
}

cudaError_t launch_pass_for(Operand op, const PassParams &p, int grid, cudaStream_t stream) {
  FLATMEM_DISPATCH(launch_backward_pass, p, grid, stream);
}

cudaError_t launch_sigmoid_for(Operand op, const SigmoidPassParams &p, int grid, cudaStream_t stream) {
  FLATMEM_DISPATCH(launch_sigmoid_pass, p, grid, stream);
}

#undef FLATMEM_DISPATCH

}  // namespace flatmem::contrastive::cuda
