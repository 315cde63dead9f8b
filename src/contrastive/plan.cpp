#include "contrastive/plan.hpp"

#include <algorithm>

namespace flatmem::contrastive {
namespace {

constexpr std::int64_t max_groups = 16;  // more groups: finer load balance, more rounds
constexpr std::int64_t min_groups = 4;   // small extents get smaller tiles to reach this
constexpr std::int64_t smallest_tile = 16;

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// Shrinks `tile` so that `extent` spans at least min_groups tiles, when it can.
std::int64_t fit_tile(std::int64_t extent, std::int64_t tile) {
  const std::int64_t wanted = std::max(smallest_tile, ceil_div(extent, min_groups));
  return std::min(tile, wanted);
}

}  // namespace

Range Plan::group_range(std::int64_t g, std::int64_t extent, std::int64_t tile) const {
  const std::int64_t tiles = ceil_div(extent, tile);
  const std::int64_t first = g * tiles / groups, last = (g + 1) * tiles / groups;
  return {std::min(first * tile, extent), std::min(last * tile, extent)};
}

Plan make_plan(std::int64_t b, std::int64_t c, std::int64_t d, const Options &options) {
  Plan p;
  p.b = b;
  p.c = c;
  p.d = d;
  p.tile_rows = fit_tile(b, options.tile_rows);
  p.tile_cols = fit_tile(c, options.tile_cols);
  const std::int64_t row_tiles = ceil_div(b, p.tile_rows), col_tiles = ceil_div(c, p.tile_cols);
  p.split_gradient = options.fp32_precision != Fp32Precision::tf32;
  p.groups = std::max<std::int64_t>(1, std::min({max_groups, row_tiles, col_tiles}));
  return p;
}

}  // namespace flatmem::contrastive
