// libFuzzer target: the pairwise sigmoid (SigLIP) loss as a hostile caller drives it --
// flatmem_contrastive_create with any options (a SIGMOID handle mostly; a softmax one or a
// hostile loss value sometimes, which every sigmoid call must refuse), then
// flatmem_contrastive_sigmoid_workspace_size, _forward, _value_and_grad and _backward with
// mutated DLTensors (device, dtype, ndim, shape -- huge extents that overflow included --,
// strides, byte_offset, alignment, data, NULL pointers), labels in and out of [0, c),
// NaN/Inf in q, k, s, t and dloss, and any workspace.
//
// Checks beyond the sanitizers: every failure has a message and writes no output (outputs
// are filled with a sentinel first); every success leaves the message empty; a sigmoid
// call on a handle of another loss fails, and flatmem_contrastive_forward_workspace_size
// on a SIGMOID handle fails; under FLATMEM_NONFINITE_ERROR a call that read NaN/Inf in q
// or k does not succeed; labels out of range never succeed. With finite inputs a
// successful call gives finite outputs, L >= 0, and L and dL/dt within a loose bound of a
// float64 reference materialised from the same q, k, labels, s, t; the backward with
// g = dloss gives g times value_and_grad's dL/dt (to rounding).
//
// Input layout: Plan (below), then hostile option values, tensor mutations, element values.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <flatmem/flatmem.h>

#include "support/fuzz_checks.hpp"
#include "support/fuzz_input.hpp"
#include "support/fuzz_tensor.hpp"

using namespace flatmem_fuzz;

namespace {

struct Plan {  // one byte per decision; 0 = the ordinary choice
  std::uint8_t loss, dtype, b, c, d, threads, tile_rows, tile_cols, nonfinite, precision, cache,
      struct_size, labels, scale, bias, nan, workspace, outputs, gradient_dtype, dloss, null_handle;
};

float bias_value(Reader &in, std::uint8_t choice) {
  static constexpr float table[] = {0.0f, -10.0f, 1.0f, 3.5f, 1e30f};
  const std::size_t i = choice % 8;
  if (i < 5) return table[i];
  if (i == 5) return std::nanf("");
  if (i == 6) return (choice & 0x80) ? -INFINITY : INFINITY;
  return float(static_cast<std::int8_t>(in.byte())) / 8.0f;
}

// The float64 reference of L and dL/dt from the tensors' own values (the header's
// formulas): x = s <q_i, k_j> + t, z = +1 at (i, y_i), v = -z x,
// L = (1/b) sum softplus(v), dL/dt = sum_ij -z sigmoid(v) / b.
struct Reference {
  double loss = 0, dbias = 0, tolerance = 0;
};
Reference reference(const FuzzTensor &q, const FuzzTensor &k, const FuzzTensor *labels, double s, double t) {
  const std::int64_t b = q.tensor().shape[0], c = k.tensor().shape[0], d = q.tensor().shape[1];
  Reference r;
  double max_abs_dot = 0;
  for (std::int64_t i = 0; i < b; ++i) {
    // A label outside [0, c) makes every call fail; only convert those in range
    // (a fuzzed int64 read as double may not convert back).
    const double label = labels ? labels->value_at(i) : double(i);
    const std::int64_t y = label >= 0.0 && label < double(c) ? std::int64_t(label) : -1;
    for (std::int64_t j = 0; j < c; ++j) {
      double dot = 0;
      for (std::int64_t e = 0; e < d; ++e) dot += q.value_at(i * d + e) * k.value_at(j * d + e);
      max_abs_dot = std::max(max_abs_dot, std::fabs(dot));
      const double z = j == y ? 1.0 : -1.0;
      const double v = -z * (s * dot + t);
      r.loss += std::max(v, 0.0) + std::log1p(std::exp(-std::fabs(v)));
      const double e_ = std::exp(-std::fabs(v));
      r.dbias += -z * (v >= 0 ? 1.0 / (1.0 + e_) : e_ / (1.0 + e_));
    }
  }
  r.loss /= double(b);
  if (break_oracle()) r.loss += 0.5;
  r.dbias /= double(b);
  // Each logit may err by a few fp32 roundings of its size (the products of these inputs,
  // k / 32 with |k| <= 128, are exact; a different association of s, q, k is not): a
  // generous 8 d ulps of (|s| max|<q,k>| + |t| + 1) per logit, times c logits per row
  // (softplus and sigmoid are 1-Lipschitz), plus the fp32 rounding of the result.
  const double logit_error = 8.0 * double(d) * 0x1p-24 * (std::fabs(s) * max_abs_dot + std::fabs(t) + 1.0);
  r.tolerance = double(c) * logit_error + 1e-6;
  return r;
}

void expect_close(const char *call, const char *what, double got, double want, double tolerance) {
  if (!(std::fabs(got - want) <= tolerance + 1e-6 * std::fabs(want)))
    violation(call, std::string(what) + " = " + std::to_string(got) + ", the float64 reference says " +
                        std::to_string(want) + " (tolerance " + std::to_string(tolerance) + ")");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t *data, std::size_t size) {
  Reader in(data, size);
  const Plan p = read_plan<Plan>(in);
  const flatmem_contrastive_options options = contrastive_options(
      in, {p.loss, p.threads, p.tile_rows, p.tile_cols, p.nonfinite, p.precision, p.cache, p.struct_size},
      {FLATMEM_CONTRASTIVE_SIGMOID, FLATMEM_CONTRASTIVE_SYMMETRIC, FLATMEM_CONTRASTIVE_INFONCE, 0});
  const bool null_options = p.null_handle % 4 == 1;
  const flatmem_contrastive_options *options_arg = null_options ? nullptr : &options;

  flatmem_contrastive_t *handle = nullptr;
  if (!check_status(flatmem_contrastive_create(&handle, options_arg), "flatmem_contrastive_create")) {
    if (handle != nullptr) violation("flatmem_contrastive_create", "failed but set *out");
    return 0;
  }
  const bool sigmoid_handle = effective_loss(options_arg) == FLATMEM_CONTRASTIVE_SIGMOID;
  if (p.null_handle % 4 == 2) {  // a NULL handle must be refused, not dereferenced
    flatmem_contrastive_destroy(handle);
    handle = nullptr;
  }
  const bool error_policy = null_options || options.struct_size < offsetof(flatmem_contrastive_options, nonfinite) + 4 ||
                            options.nonfinite == FLATMEM_NONFINITE_ERROR;

  const std::int64_t b = 1 + p.b % 17;
  const bool with_labels = p.labels % 2 == 1;
  // Without labels c >= b is required (c < b sometimes: refused); with labels any c >= 1.
  const std::int64_t c = with_labels || (p.c & 0x80) ? 1 + p.c % 19 : b + p.c % 5;
  const std::int64_t d = 1 + p.d % 37;
  static const DLDataType dtypes[] = {f32(), bf16(), f16()};
  const DLDataType dtype = dtypes[p.dtype % 3];
  static const DLDataType gradient_dtypes[] = {f32(), dtype, f64()};
  const DLDataType gradient_dtype = gradient_dtypes[p.gradient_dtype % 3];

  FuzzTensor q(dtype, {b, d}), k(dtype, {c, d}), labels(i64(), {b});
  FuzzTensor scale(f32(), (p.scale & 0x80) ? std::vector<std::int64_t>{1} : std::vector<std::int64_t>{});
  FuzzTensor bias(f32(), (p.bias & 0x40) ? std::vector<std::int64_t>{1} : std::vector<std::int64_t>{});
  FuzzTensor dloss(f32(), {});
  // Outputs of each call (forward: loss; value_and_grad: V*; backward: B*).
  FuzzTensor loss(f32(), {});
  FuzzTensor vloss(f32(), {}), vdq(gradient_dtype, {b, d}), vdk(gradient_dtype, {c, d}), vds(f32(), {}), vdt(f32(), {});
  FuzzTensor bdq(gradient_dtype, {b, d}), bdk(gradient_dtype, {c, d}), bds(f32(), {}), bdt(f32(), {});
  // outputs bits: 1 no loss, 2 no dq, 4 no dk, 8 no ds, 16 no dt (value_and_grad and backward).
  const bool with[5] = {!(p.outputs & 1), !(p.outputs & 2), !(p.outputs & 4), !(p.outputs & 8), !(p.outputs & 16)};
  const bool with_dloss = p.dloss % 2 == 1;
  mutate_some(in, {&q, &k, with_labels ? &labels : nullptr, &scale, &bias, with_dloss ? &dloss : nullptr});
  mutate_some(in, {&loss, with[0] ? &vloss : nullptr, with[1] ? &vdq : nullptr, with[2] ? &vdk : nullptr,
                   with[3] ? &vds : nullptr, with[4] ? &vdt : nullptr, with[1] ? &bdq : nullptr,
                   with[2] ? &bdk : nullptr, with[3] ? &bds : nullptr, with[4] ? &bdt : nullptr});
  FuzzTensor *all[] = {&q, &k, &labels, &scale, &bias, &dloss, &loss, &vloss, &vdq, &vdk, &vds, &vdt, &bdq, &bdk, &bds, &bdt};
  for (FuzzTensor *t : all) t->materialize();
  bool nonfinite = q.fill(in, p.nan % 2 == 1);
  nonfinite = k.fill(in, p.nan % 2 == 1) || nonfinite;
  labels.fill(in, false, c);
  const float s = scale_value(in, p.scale), t = bias_value(in, p.bias);
  scale.set_f32(0, s);
  bias.set_f32(0, t);
  const float g = p.dloss % 4 == 3 ? -2.5f : p.dloss % 8 == 5 ? std::nanf("") : 1.0f;
  dloss.set_f32(0, g);
  // What the library sees: a mutation may turn the labels argument into a NULL pointer (then
  // y_i = i), whatever values the tensor holds.
  DLTensor *labels_arg = with_labels ? labels.get() : nullptr;
  const FuzzTensor *passed_labels = labels_arg != nullptr ? &labels : nullptr;
  bool labels_out_of_range = false;
  if (passed_labels != nullptr)
    for (std::int64_t i = 0; i < labels.elements(); ++i)
      labels_out_of_range = labels_out_of_range || labels.value_at(i) < 0 || labels.value_at(i) >= double(c);
  for (FuzzTensor *t_ : {&loss, &vloss, &vdq, &vdk, &vds, &vdt, &bdq, &bdk, &bds, &bdt}) t_->fill_sentinel();
  const bool finite_inputs = !nonfinite && std::isfinite(s) && s > 0 && std::isfinite(t);

  // A SIGMOID handle is refused by the softmax entry points.
  if (handle != nullptr && sigmoid_handle) {
    size_t bytes = 0;
    if (check_status(flatmem_contrastive_forward_workspace_size(handle, q.get(), k.get(), &bytes),
                     "flatmem_contrastive_forward_workspace_size"))
      violation("flatmem_contrastive_forward_workspace_size", "accepted a SIGMOID handle");
  }
  // After each call: a status with a message, no output written on failure, no success
  // on a softmax handle, with NaN/Inf read under ERROR, or with a label out of range.
  const auto after = [&](flatmem_status status, const char *call, std::initializer_list<const FuzzTensor *> outputs) {
    const bool ok = check_status(status, call);
    if (!ok) expect_unwritten(call, outputs);
    if (ok && !sigmoid_handle) violation(call, "accepted a handle whose loss is not SIGMOID");
    if (ok && error_policy && nonfinite) violation(call, "read NaN/Inf in q or k under FLATMEM_NONFINITE_ERROR and succeeded");
    if (ok && labels_out_of_range) violation(call, "accepted a label outside [0, c)");
    return ok;
  };
  const auto workspace_for = [&](Workspace &w, const DLTensor *dq, const DLTensor *dk) {
    size_t queried = 0;
    check_status(flatmem_contrastive_sigmoid_workspace_size(handle, q.get(), k.get(), dq, dk, &queried),
                 "flatmem_contrastive_sigmoid_workspace_size");
    w.choose(p.workspace, queried);
  };

  // ---- forward ----
  Workspace workspace;
  workspace_for(workspace, nullptr, nullptr);
  const bool forward_ok = after(flatmem_contrastive_sigmoid_forward(handle, q.get(), k.get(), labels_arg, scale.get(),
                                                                    bias.get(), loss.get(), workspace.pointer,
                                                                    workspace.bytes, nullptr),
                                "flatmem_contrastive_sigmoid_forward", {&loss});
  const bool oracle = finite_inputs && q.honest() && k.honest() && q.tensor().ndim == 2 && k.tensor().ndim == 2 &&
                      (passed_labels == nullptr || labels.honest());
  Reference ref;
  if (oracle) ref = reference(q, k, passed_labels, s, t);
  const bool in_range = ref.loss < 1e37;  // the fp32 result can hold it
  if (forward_ok && finite_inputs && in_range && loss.get() != nullptr) {
    expect_finite("flatmem_contrastive_sigmoid_forward", loss, "loss");
    if (loss.f32_at(0) < 0) violation("flatmem_contrastive_sigmoid_forward", "loss " + std::to_string(loss.f32_at(0)) + " < 0");
    if (oracle) expect_close("flatmem_contrastive_sigmoid_forward", "loss", loss.f32_at(0), ref.loss, ref.tolerance);
  }

  // ---- value_and_grad ----
  // What each call is given (a mutation may make a requested output a NULL pointer).
  DLTensor *vloss_arg = with[0] ? vloss.get() : nullptr, *vdq_arg = with[1] ? vdq.get() : nullptr,
           *vdk_arg = with[2] ? vdk.get() : nullptr, *vds_arg = with[3] ? vds.get() : nullptr,
           *vdt_arg = with[4] ? vdt.get() : nullptr;
  workspace_for(workspace, vdq_arg, vdk_arg);
  const bool value_ok = after(
      flatmem_contrastive_sigmoid_value_and_grad(handle, q.get(), k.get(), labels_arg, scale.get(), bias.get(),
                                                 vloss_arg, vdq_arg, vdk_arg, vds_arg, vdt_arg, workspace.pointer, workspace.bytes, nullptr),
      "flatmem_contrastive_sigmoid_value_and_grad", {&vloss, &vdq, &vdk, &vds, &vdt});
  if (value_ok && finite_inputs && in_range) {
    const char *call = "flatmem_contrastive_sigmoid_value_and_grad";
    if (vloss_arg) expect_finite(call, vloss, "loss");
    if (vdq_arg && gradient_dtype.bits == 32) expect_finite(call, vdq, "dq");
    if (vdk_arg && gradient_dtype.bits == 32) expect_finite(call, vdk, "dk");
    if (vds_arg) expect_finite(call, vds, "dlogit_scale");
    if (vdt_arg) expect_finite(call, vdt, "dlogit_bias");
    if (oracle && vloss_arg) expect_close(call, "loss", vloss.f32_at(0), ref.loss, ref.tolerance);
    if (oracle && vdt_arg) expect_close(call, "dlogit_bias", vdt.f32_at(0), ref.dbias, ref.tolerance);
  }

  // ---- backward ----
  DLTensor *bdq_arg = with[1] ? bdq.get() : nullptr, *bdk_arg = with[2] ? bdk.get() : nullptr,
           *bds_arg = with[3] ? bds.get() : nullptr, *bdt_arg = with[4] ? bdt.get() : nullptr;
  workspace_for(workspace, bdq_arg, bdk_arg);
  const bool backward_ok = after(
      flatmem_contrastive_sigmoid_backward(handle, q.get(), k.get(), labels_arg, scale.get(), bias.get(),
                                           with_dloss ? dloss.get() : nullptr, bdq_arg, bdk_arg, bds_arg,
                                           bdt_arg, workspace.pointer, workspace.bytes, nullptr),
      "flatmem_contrastive_sigmoid_backward", {&bdq, &bdk, &bds, &bdt});
  const bool g_used = with_dloss && dloss.get() != nullptr && dloss.honest();
  const double gv = g_used ? double(g) : 1.0;
  if (backward_ok && error_policy && g_used && !std::isfinite(g))
    violation("flatmem_contrastive_sigmoid_backward", "accepted dloss = NaN under FLATMEM_NONFINITE_ERROR");
  if (backward_ok && finite_inputs && in_range && std::isfinite(gv) && (!with_dloss || g_used)) {
    const char *call = "flatmem_contrastive_sigmoid_backward";
    if (bdq_arg && gradient_dtype.bits == 32) expect_finite(call, bdq, "dq");
    if (bdk_arg && gradient_dtype.bits == 32) expect_finite(call, bdk, "dk");
    if (bds_arg) expect_finite(call, bds, "dlogit_scale");
    if (bdt_arg) expect_finite(call, bdt, "dlogit_bias");
    if (oracle && bdt_arg) expect_close(call, "dlogit_bias", bdt.f32_at(0), gv * ref.dbias, std::fabs(gv) * ref.tolerance);
  }
  check_status(flatmem_contrastive_destroy(handle), "flatmem_contrastive_destroy");
  return 0;
}
