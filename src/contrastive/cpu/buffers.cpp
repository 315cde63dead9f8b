#include "contrastive/cpu/buffers.hpp"

#include <algorithm>

#include "contrastive/cpu/tile_gemm.hpp"
#include "contrastive/cpu/tile_math.hpp"

namespace flatmem::contrastive::cpu {

std::vector<ThreadScratch> carve_thread_scratch(WorkspaceCarver &carver, const Plan &plan,
                                                Dtype input, int threads) {
  const bool widen = input != Dtype::f32;
  const std::int64_t widened = (plan.tile_rows + plan.tile_cols) * plan.d;
  const std::int64_t block =
      input == Dtype::bf16 ? std::max(widened, bf16_pack_words(plan.tile_rows, plan.tile_cols, plan.d))
                           : widened;
  std::vector<ThreadScratch> out(static_cast<std::size_t>(threads));
  for (auto &t : out) {
    t.tile = carver.take<float>(plan.tile_rows * plan.tile_cols);
    if (widen) {
      t.q_rows = carver.take<float>(block);
      // (a measuring carver hands out null: no arithmetic on it)
      t.k_rows = t.q_rows ? t.q_rows + plan.tile_rows * plan.d : nullptr;
      if (input == Dtype::bf16) t.pack = reinterpret_cast<std::uint32_t *>(t.q_rows);
    }
    t.math = carver.take<float>(tile_math_scratch_floats(plan.tile_rows, plan.tile_cols));
    t.positives = carver.take<std::int64_t>(plan.tile_rows);
  }
  return out;
}

ForwardBuffers carve_forward(WorkspaceCarver &carver, const Plan &plan, Loss loss, Dtype input,
                             int threads) {
  ForwardBuffers f;
  f.row_max = carver.take<float>(plan.b);
  f.row_sum = carver.take<double>(plan.b);
  if (loss == Loss::symmetric) {
    f.col_max = carver.take<float>(plan.c);
    f.col_sum = carver.take<double>(plan.c);
  }
  f.positive_logit = carver.take<float>(plan.b);
  f.threads = carve_thread_scratch(carver, plan, input, threads);
  return f;
}

BackwardBuffers carve_backward(WorkspaceCarver &carver, const Plan &plan, Dtype input,
                               const Dtype *dq_dtype, const Dtype *dk_dtype, int threads) {
  BackwardBuffers bwd;
  bwd.group_ds = carver.take<double>(plan.groups);
  if (dq_dtype && *dq_dtype != Dtype::f32) bwd.dq_acc = carver.take<float>(plan.b * plan.d);
  if (dk_dtype && *dk_dtype != Dtype::f32) bwd.dk_acc = carver.take<float>(plan.c * plan.d);
  bwd.threads = carve_thread_scratch(carver, plan, input, threads);
  return bwd;
}

}  // namespace flatmem::contrastive::cpu
