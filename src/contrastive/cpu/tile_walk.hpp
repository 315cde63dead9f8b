// The Latin-square walk shared by the CPU forward and backward: G rounds, each
// a parallel run over the G row groups; item I visits every tile of
// (row group I) x (column group partner(I, round)), row tile by row tile.
#pragma once

#include "contrastive/cpu/buffers.hpp"
#include "contrastive/cpu/tile_gemm.hpp"
#include "contrastive/problem.hpp"
#include "core/thread_pool.hpp"

namespace flatmem::contrastive::cpu {

// visit(row_group, rows, cols, q_rows, k_rows, scratch, engine) with
// rows/cols the tile's ranges, q_rows/k_rows its product operands and engine
// the products' engine, chosen once for the whole walk.
template <typename Visit>
void walk_tiles(ThreadPool &pool, const Plan &plan, const Inputs &in,
                const std::vector<ThreadScratch> &scratch, Visit &&visit) {
  const TileProducts engine = tile_products(plan, in.q.dtype);
  for (std::int64_t round = 0; round < plan.groups; ++round) {
    pool.run(plan.groups, [&](std::int64_t row_group, int thread) {
      const ThreadScratch &s = scratch[std::size_t(thread)];
      const Range group_rows = plan.row_group(row_group);
      const Range group_cols = plan.col_group(plan.partner(row_group, round));
      for (std::int64_t r0 = group_rows.begin; r0 < group_rows.end; r0 += plan.tile_rows) {
        const Range rows{r0, std::min(r0 + plan.tile_rows, group_rows.end)};
        const TileRows q = tile_rows(engine, in.q, rows, s.q_rows);
        for (std::int64_t c0 = group_cols.begin; c0 < group_cols.end; c0 += plan.tile_cols) {
          const Range cols{c0, std::min(c0 + plan.tile_cols, group_cols.end)};
          const TileRows k = tile_rows(engine, in.k, cols, s.k_rows);
          visit(row_group, rows, cols, q, k, s, engine);
        }
      }
    });
  }
}

}  // namespace flatmem::contrastive::cpu
