#include "contrastive/ring/blocks.hpp"

#include <algorithm>
#include <cstring>

namespace flatmem::contrastive::ring {

std::vector<Plan> block_plans(const Layout &layout, std::int64_t d, const Options &options) {
  std::vector<Plan> plans;
  for (int o = 0; o < layout.ranks; ++o)
    plans.push_back(make_plan(layout.rows[std::size_t(layout.rank)], layout.cols[std::size_t(o)], d,
                              options));
  return plans;
}

const Plan &widest(const std::vector<Plan> &plans) {
  return *std::max_element(plans.begin(), plans.end(),
                           [](const Plan &a, const Plan &b) { return a.tile_cols < b.tile_cols; });
}

std::int64_t most_groups(const std::vector<Plan> &plans) {
  std::int64_t g = 1;
  for (const Plan &p : plans) g = std::max(g, p.groups);
  return g;
}

MatrixView block_view(void *data, std::int64_t rows, const MatrixView &like) {
  MatrixView m = like;
  m.data = static_cast<char *>(data);
  m.rows = rows;
  m.row_stride = like.cols;
  return m;
}

std::size_t block_bytes(std::int64_t rows, const MatrixView &like) {
  return std::size_t(rows) * std::size_t(like.cols) * dtype_bytes(like.dtype);
}

MatrixView compact_block(const MatrixView &k, void *scratch) {
  if (k.row_stride == k.cols) return k;
  const std::size_t row_bytes = std::size_t(k.cols) * dtype_bytes(k.dtype);
  for (std::int64_t r = 0; r < k.rows; ++r)
    std::memcpy(static_cast<char *>(scratch) + std::size_t(r) * row_bytes, k.row<char>(0) +
                std::size_t(r) * std::size_t(k.row_stride) * dtype_bytes(k.dtype), row_bytes);
  return block_view(scratch, k.rows, k);
}

}  // namespace flatmem::contrastive::ring
