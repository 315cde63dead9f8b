// libFuzzer target: the tiled contrastive loss as a hostile caller drives it --
// flatmem_contrastive_create with any options (any struct_size), the two workspace
// queries, forward and backward with mutated DLTensors (device, dtype, ndim, shape,
// strides, byte_offset, alignment, data, NULL pointers), any workspace, NaN/Inf inputs.
//
// Checks beyond the sanitizers: every failure has a message and writes no output (the
// outputs are filled with a sentinel first); every success leaves the message empty;
// with finite inputs a successful forward gives a finite loss >= 0 (up to rounding) and
// finite log-sum-exps, and a backward fed the forward's own log-sum-exps finite gradients.
//
// Input layout: Plan (below), then tensor mutations, then element values.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include <flatmem/flatmem.h>

#include "support/fuzz_checks.hpp"
#include "support/fuzz_input.hpp"
#include "support/fuzz_tensor.hpp"

using namespace flatmem_fuzz;

namespace {

struct Plan {  // one byte per decision; 0 = the ordinary choice
  std::uint8_t loss, dtype, b, c_extra, d, threads, tile_rows, tile_cols, nonfinite, precision,
      cache, struct_size, labels, scale, workspace_forward, workspace_backward, nan,
      backward_outputs, gradient_dtype, dloss, fresh_lse, null_handle;
};

flatmem_contrastive_options make_options(Reader &in, const Plan &p) {
  return contrastive_options(in, {p.loss, p.threads, p.tile_rows, p.tile_cols, p.nonfinite, p.precision,
                                  p.cache, p.struct_size},
                             {FLATMEM_CONTRASTIVE_SYMMETRIC, FLATMEM_CONTRASTIVE_INFONCE, 0});
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t *data, std::size_t size) {
  Reader in(data, size);
  const Plan p = read_plan<Plan>(in);
  const flatmem_contrastive_options options = make_options(in, p);

  flatmem_contrastive_t *handle = nullptr;
  const bool null_options = p.null_handle % 4 == 1;
  if (!check_status(flatmem_contrastive_create(&handle, null_options ? nullptr : &options),
                    "flatmem_contrastive_create"))
    return 0;
  if (p.null_handle % 4 == 2) {  // a NULL handle must be refused, not dereferenced
    flatmem_contrastive_destroy(handle);
    handle = nullptr;
  }

  const bool infonce = !null_options && options.struct_size >= offsetof(flatmem_contrastive_options, loss) + 4 &&
                       options.loss == FLATMEM_CONTRASTIVE_INFONCE;
  const std::int64_t b = 1 + p.b % 24;
  const std::int64_t c = infonce ? (p.c_extra & 0x80 ? 1 + p.c_extra % b : b + p.c_extra % 8) : b;
  const std::int64_t d = 1 + p.d % 40;
  static const DLDataType dtypes[] = {f32(), bf16(), f16()};
  const DLDataType dtype = dtypes[p.dtype % 3];
  const bool finite_scale = p.scale % 9 < 3;
  const bool scalar_ndim1 = p.scale & 0x80;

  // ---- forward ----
  FuzzTensor q(dtype, {b, d}), k(dtype, {c, d});
  FuzzTensor labels(i64(), {b});
  FuzzTensor scale(f32(), scalar_ndim1 ? std::vector<std::int64_t>{1} : std::vector<std::int64_t>{});
  FuzzTensor loss(f32(), {}), row_lse(f32(), {b}), col_lse(f32(), {c});
  const bool with_labels = infonce ? p.labels % 2 == 1 : p.labels % 8 == 7;  // symmetric: refused
  const bool with_col_lse = !infonce || p.labels % 8 == 6;                     // infonce: refused
  mutate_some(in, {&q, &k, with_labels ? &labels : nullptr, &scale, &loss, &row_lse,
                   with_col_lse ? &col_lse : nullptr});
  for (FuzzTensor *t : {&q, &k, &labels, &scale, &loss, &row_lse, &col_lse}) t->materialize();
  bool nonfinite = q.fill(in, p.nan % 2 == 1);
  nonfinite = k.fill(in, p.nan % 2 == 1) || nonfinite;
  labels.fill(in, false, c);
  scale.set_f32(0, scale_value(in, p.scale));
  for (FuzzTensor *t : {&loss, &row_lse, &col_lse}) t->fill_sentinel();

  size_t queried = 0;
  const flatmem_status query = flatmem_contrastive_forward_workspace_size(handle, q.get(), k.get(), &queried);
  check_status(query, "flatmem_contrastive_forward_workspace_size");
  Workspace workspace;
  workspace.choose(p.workspace_forward, queried);
  const flatmem_status forward = flatmem_contrastive_forward(
      handle, q.get(), k.get(), with_labels ? labels.get() : nullptr, scale.get(), loss.get(),
      row_lse.get(), with_col_lse ? col_lse.get() : nullptr, workspace.pointer, workspace.bytes, nullptr);
  const bool forward_ok = check_status(forward, "flatmem_contrastive_forward");
  if (!forward_ok) expect_unwritten("flatmem_contrastive_forward", {&loss, &row_lse, &col_lse});
  const bool trusted = forward_ok && !nonfinite && finite_scale;
  if (trusted) {
    expect_finite("flatmem_contrastive_forward", loss, "loss");
    expect_finite("flatmem_contrastive_forward", row_lse, "row_lse");
    if (!infonce) expect_finite("flatmem_contrastive_forward", col_lse, "col_lse");
    // l_i = LSE_j(x_ij) - x_{i,y_i} >= 0; rounding of logits up to s * d * 16 in fp32
    // (|q|, |k| <= 4) allows a small negative value.
    const float s = scale.f32_at(0);
    const double tolerance = 1e-4 * (1.0 + double(s) * 16.0 * double(d));
    if (loss.f32_at(0) < -tolerance)
      violation("flatmem_contrastive_forward", "loss " + std::to_string(loss.f32_at(0)) + " < 0");
  }

  // ---- backward ----
  const bool fresh_lse = !forward_ok || p.fresh_lse % 2 == 1;
  FuzzTensor lse_rows(f32(), {b}), lse_cols(f32(), {c});
  static const DLDataType gradient_dtypes[] = {f32(), dtype, f64()};
  const DLDataType gradient_dtype = gradient_dtypes[p.gradient_dtype % 3];
  FuzzTensor dloss(f32(), {}), dq(gradient_dtype, {b, d}), dk(gradient_dtype, {c, d}), dscale(f32(), {});
  const bool with_dloss = p.dloss % 2 == 1;
  const bool with_dq = !(p.backward_outputs & 1), with_dk = !(p.backward_outputs & 2),
             with_dscale = !(p.backward_outputs & 4);
  mutate_some(in, {fresh_lse ? &lse_rows : nullptr, fresh_lse && with_col_lse ? &lse_cols : nullptr,
                   with_dloss ? &dloss : nullptr, with_dq ? &dq : nullptr, with_dk ? &dk : nullptr,
                   with_dscale ? &dscale : nullptr});
  for (FuzzTensor *t : {&lse_rows, &lse_cols, &dloss, &dq, &dk, &dscale}) t->materialize();
  lse_rows.fill(in, p.nan % 4 == 3);
  lse_cols.fill(in, p.nan % 4 == 3);
  dloss.set_f32(0, p.dloss % 4 == 3 ? -2.5f : 1.0f);
  for (FuzzTensor *t : {&dq, &dk, &dscale}) t->fill_sentinel();
  FuzzTensor &rows_in = fresh_lse ? lse_rows : row_lse;
  FuzzTensor &cols_in = fresh_lse ? lse_cols : col_lse;

  DLTensor *dq_arg = with_dq ? dq.get() : nullptr, *dk_arg = with_dk ? dk.get() : nullptr;
  check_status(flatmem_contrastive_backward_workspace_size(handle, q.get(), k.get(), dq_arg, dk_arg, &queried),
               "flatmem_contrastive_backward_workspace_size");
  workspace.choose(p.workspace_backward, queried);
  const flatmem_status backward = flatmem_contrastive_backward(
      handle, q.get(), k.get(), with_labels ? labels.get() : nullptr, scale.get(), rows_in.get(),
      with_col_lse ? cols_in.get() : nullptr, with_dloss ? dloss.get() : nullptr, dq_arg, dk_arg,
      with_dscale ? dscale.get() : nullptr, workspace.pointer, workspace.bytes, nullptr);
  const bool backward_ok = check_status(backward, "flatmem_contrastive_backward");
  if (!backward_ok) expect_unwritten("flatmem_contrastive_backward", {&dq, &dk, &dscale});
  if (backward_ok && trusted && !fresh_lse && gradient_dtype.bits == 32) {
    if (with_dq) expect_finite("flatmem_contrastive_backward", dq, "dq");
    if (with_dk) expect_finite("flatmem_contrastive_backward", dk, "dk");
    if (with_dscale) expect_finite("flatmem_contrastive_backward", dscale, "dlogit_scale");
  }
  check_status(flatmem_contrastive_destroy(handle), "flatmem_contrastive_destroy");
  return 0;
}
