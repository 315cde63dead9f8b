// The tiling plan shared by every backend: tile extents, and the square grid
// of row groups x column groups that makes the CPU walk deterministic and
// race-free.
//
// Schedule ("Latin square"): rows are cut into G groups, columns into G groups.
// Round r (r = 0..G-1) runs the G items (I, (I + r) mod G) in parallel. Within
// a round no two items share a row group or a column group, so each item owns
// the row statistics / dq rows and the column statistics / dk rows it touches;
// across rounds every (I, J) pair is visited once, in an order fixed by the
// shapes alone. Results therefore do not depend on which thread ran an item.
#pragma once

#include <cstdint>

#include "contrastive/problem.hpp"

namespace flatmem::contrastive {

struct Range {
  std::int64_t begin = 0, end = 0;
  std::int64_t size() const { return end - begin; }
};

struct Plan {
  std::int64_t b = 0, c = 0, d = 0;
  std::int64_t tile_rows = 0, tile_cols = 0;  // effective tile extents
  std::int64_t groups = 1;                    // G
  // CPU bf16 kernels (avx512bf16): G enters the backward products as hi + lo
  // bf16 parts (about fp32), or rounded once (FLATMEM_FP32_PRECISION_TF32).
  bool split_gradient = true;

  // Rows (or columns) of group g: whole tiles, the last tile possibly short.
  Range row_group(std::int64_t g) const { return group_range(g, b, tile_rows); }
  Range col_group(std::int64_t g) const { return group_range(g, c, tile_cols); }
  // Column group processed together with row group `row_group` in `round`.
  std::int64_t partner(std::int64_t row_group, std::int64_t round) const {
    return (row_group + round) % groups;
  }

 private:
  Range group_range(std::int64_t g, std::int64_t extent, std::int64_t tile) const;
};

// Tiles shrink (down to 16) for small extents so that there are at least 4
// groups to keep the threads busy; at most 16 groups; the grid depends on the shapes and options only.
Plan make_plan(std::int64_t b, std::int64_t c, std::int64_t d, const Options &options);

}  // namespace flatmem::contrastive
