#include "contrastive/validate.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "contrastive/panels/plan.hpp"
#include "core/error.hpp"
#include "core/options.hpp"
#include "core/thread_pool.hpp"

namespace flatmem::contrastive {
namespace {

constexpr int max_tile = 4096;
constexpr Devices any = Devices::cpu_or_cuda;

bool on_cuda(const MatrixView &m) { return m.device.device_type == kDLCUDA; }
constexpr int default_tile = 512;  // measured at b = 8192, d = 512: 1.21x the 4-GEMM time; 256: 1.31x

float read_element(const MatrixView &m, std::int64_t r, std::int64_t j) {
  switch (m.dtype) {
    case Dtype::bf16: return bf16_to_f32(m.row<const std::uint16_t>(r)[j]);
    case Dtype::f16: return f16_to_f32(m.row<const std::uint16_t>(r)[j]);
    default: return m.row<const float>(r)[j];
  }
}

void check_finite(const MatrixView &m, const char *name) {
  for (std::int64_t r = 0; r < m.rows; ++r)
    for (std::int64_t j = 0; j < m.cols; ++j) {
      const float v = read_element(m, r, j);
      if (!std::isfinite(v))
        fail(FLATMEM_STATUS_NON_FINITE, name, ": element (", r, ", ", j, ") is ", v,
             "; non-finite features are refused under FLATMEM_NONFINITE_ERROR");
    }
}

void check_finite_vector(const float *v, std::int64_t n, const char *name) {
  for (std::int64_t i = 0; i < n; ++i)
    if (!std::isfinite(v[i]))
      fail(FLATMEM_STATUS_NON_FINITE, name, ": element ", i, " is ", v[i],
           "; pass the values the forward returned");
}

}  // namespace

Options resolve_options(const flatmem_contrastive_options *given) {
  const flatmem_contrastive_options o = read_options(
      given, "FLATMEM_CONTRASTIVE_OPTIONS_INIT or flatmem_contrastive_options_init");
  Options r;
  const std::int32_t loss = enum_value(o.loss), nonfinite = enum_value(o.nonfinite);
  switch (loss) {
    case FLATMEM_CONTRASTIVE_DEFAULT:
    case FLATMEM_CONTRASTIVE_SYMMETRIC: r.loss = Loss::symmetric; break;
    case FLATMEM_CONTRASTIVE_INFONCE: r.loss = Loss::infonce; break;
    case FLATMEM_CONTRASTIVE_SIGMOID: r.loss = Loss::sigmoid; break;
    default: invalid("options.loss: ", loss, " is not a flatmem_contrastive_loss");
  }
  r.num_threads = resolve_threads(o.num_threads, "options.num_threads");
  for (auto [value, name, slot] : {std::tuple{o.tile_rows, "options.tile_rows", &r.tile_rows},
                                   std::tuple{o.tile_cols, "options.tile_cols", &r.tile_cols}}) {
    if (value < 0 || value > max_tile) invalid(name, ": ", value, "; expected 0 (default ", default_tile, ") to ", max_tile);
    *slot = value == 0 ? default_tile : value;
  }
  if (nonfinite != FLATMEM_NONFINITE_ERROR && nonfinite != FLATMEM_NONFINITE_PROPAGATE)
    invalid("options.nonfinite: ", nonfinite, " is not a flatmem_nonfinite_policy");
  r.nonfinite = flatmem_nonfinite_policy(nonfinite);
  switch (o.fp32_precision) {
    case FLATMEM_FP32_PRECISION_DEFAULT: r.fp32_precision = Fp32Precision::unspecified; break;
    case FLATMEM_FP32_PRECISION_TF32: r.fp32_precision = Fp32Precision::tf32; break;
    case FLATMEM_FP32_PRECISION_FULL: r.fp32_precision = Fp32Precision::full; break;
    default: invalid("options.fp32_precision: ", o.fp32_precision, " is not a flatmem_fp32_precision");
  }
  r.comm = o.comm;
  r.logit_cache_bytes = o.logit_cache_bytes;
  if (r.comm && r.logit_cache_bytes != 0)
    invalid("options.logit_cache_bytes: ", r.logit_cache_bytes,
            " with options.comm set; the ring across ranks keeps no logit tiles, set it to 0");
  if (r.loss == Loss::sigmoid && r.logit_cache_bytes != 0)
    fail(FLATMEM_STATUS_UNSUPPORTED, "options.logit_cache_bytes: ", r.logit_cache_bytes,
         "; the sigmoid loss keeps no logit tiles (value_and_grad needs none), set it to 0");
  r.cuda_engine = panels::engine_from_environment();
  r.panel_budget = panels::budget_from_environment();
  const panels::Shape shape = panels::shape_from_environment();
  r.panel_rows = shape.rows, r.panel_cols = shape.cols;
  return r;
}

void check_loss_kind(const Options &options, bool sigmoid_call, const char *function) {
  if (sigmoid_call && options.loss != Loss::sigmoid)
    invalid("handle: ", function, " needs a handle created with loss = "
            "FLATMEM_CONTRASTIVE_SIGMOID; use flatmem_contrastive_forward / _backward for the "
            "softmax losses");
  if (!sigmoid_call && options.loss == Loss::sigmoid)
    invalid("handle: created with loss = FLATMEM_CONTRASTIVE_SIGMOID, which ", function,
            " does not compute; use flatmem_contrastive_sigmoid_forward / _value_and_grad / "
            "_backward");
}

void check_features(const Options &options, const DLTensor *q, const DLTensor *k, DataUse use,
                    MatrixView &qv, MatrixView &kv) {
  qv = check_matrix(q, "q", {Dtype::f32, Dtype::bf16, Dtype::f16}, use, any);
  if (on_cuda(qv) && options.nonfinite == FLATMEM_NONFINITE_ERROR)
    fail(FLATMEM_STATUS_UNSUPPORTED, "q: device is kDLCUDA but options.nonfinite is "
         "FLATMEM_NONFINITE_ERROR, which needs a host-side scan of device memory (a "
         "synchronisation flatmem never does); create the handle with FLATMEM_NONFINITE_PROPAGATE "
         "for CUDA tensors");
  kv = check_matrix(k, "k", {Dtype::f32, Dtype::bf16, Dtype::f16}, use, any);
  check_same_device(kv.device, "k", qv.device, "q");
  if (kv.dtype != qv.dtype)
    invalid("k: dtype ", dtype_name(kv.dtype), " differs from q's ", dtype_name(qv.dtype));
  if (kv.cols != qv.cols)
    invalid("k: feature dimension d = ", kv.cols, " (shape (", kv.rows, ", ", kv.cols,
            ")) differs from q's d = ", qv.cols);
  if (options.loss == Loss::symmetric && kv.rows != qv.rows)
    invalid("k: ", kv.rows, " rows but the symmetric loss pairs row i of q with row i of k and "
            "needs c = b = ", qv.rows, " (use FLATMEM_CONTRASTIVE_INFONCE for c != b)");
}

MatrixView check_gradient(const DLTensor *t, const char *name, const MatrixView &like,
                          const char *like_name, DataUse use) {
  if (t == nullptr) return {};
  MatrixView g = check_matrix(t, name, {Dtype::f32, Dtype::bf16, Dtype::f16}, use, any);
  check_same_device(g.device, name, like.device, like_name);
  if (g.dtype != Dtype::f32 && g.dtype != like.dtype)
    invalid(name, ": dtype ", dtype_name(g.dtype), "; expected float32 or ", like_name, "'s ",
            dtype_name(like.dtype));
  if (g.rows != like.rows || g.cols != like.cols)
    invalid(name, ": shape (", g.rows, ", ", g.cols, "); expected ", like_name, "'s (", like.rows,
            ", ", like.cols, ")");
  return g;
}

void check_features_finite(const Inputs &in) {
  check_finite(in.q, "q");
  check_finite(in.k, "k");
}

Inputs check_inputs(const Options &options, const DLTensor *q, const DLTensor *k,
                    const DLTensor *labels, const DLTensor *logit_scale, Scope scope) {
  Inputs in;
  in.loss = options.loss;
  check_features(options, q, k, DataUse::required, in.q, in.k);
  const bool device = on_cuda(in.q);
  const bool single = scope == Scope::single_process;
  if (labels != nullptr) {
    if (options.loss == Loss::symmetric)
      invalid("labels: must be NULL for the symmetric loss (row i is paired with column i)");
    const VectorView l = check_vector(labels, "labels", Dtype::i64, in.b(), DataUse::required, any);
    check_same_device(l.device, "labels", in.q.device, "q");
    in.labels = l.as<const std::int64_t>();
    // On CUDA the values stay on the device: the kernels turn an out-of-range
    // label into a NaN loss instead (flatmem.h, "CUDA tensors").
    for (std::int64_t i = 0; i < (device || !single ? 0 : in.b()); ++i)
      if (in.labels[i] < 0 || in.labels[i] >= in.c())
        invalid("labels: labels[", i, "] = ", in.labels[i], " is outside [0, c = ", in.c(), ")");
  } else if (single && in.c() < in.b()) {
    invalid("k: ", in.c(), " rows is fewer than q's b = ", in.b(),
            "; without labels row i's positive is column i, so c >= b is needed");
  }
  const VectorView s = check_scalar(logit_scale, "logit_scale", any);
  check_same_device(s.device, "logit_scale", in.q.device, "q");
  in.scale_data = s.as<const float>();
  if (device) return in;  // s, like the features, is read on the device only
  in.scale = *in.scale_data;
  if (!(std::isfinite(in.scale) && in.scale > 0.0f))
    invalid("logit_scale: ", in.scale, "; expected a finite value > 0 (s = exp(learned log-scale))");
  if (single && options.nonfinite == FLATMEM_NONFINITE_ERROR) check_features_finite(in);
  return in;
}

ForwardOutputs check_forward_outputs(const Inputs &in, DLTensor *loss, DLTensor *row_lse,
                                     DLTensor *col_lse) {
  ForwardOutputs out;
  const VectorView l = check_scalar(loss, "loss", any);
  check_same_device(l.device, "loss", in.q.device, "q");
  out.loss = l.as<float>();
  const VectorView r = check_vector(row_lse, "row_lse", Dtype::f32, in.b(), DataUse::required, any);
  check_same_device(r.device, "row_lse", in.q.device, "q");
  out.row_lse = r.as<float>();
  if (in.loss == Loss::symmetric) {
    const VectorView c = check_vector(col_lse, "col_lse", Dtype::f32, in.c(), DataUse::required, any);
    check_same_device(c.device, "col_lse", in.q.device, "q");
    out.col_lse = c.as<float>();
  } else if (col_lse != nullptr) {
    invalid("col_lse: must be NULL for InfoNCE (only the row log-sum-exp is kept)");
  }
  return out;
}

BackwardArgs check_backward_args(const Options &options, const Inputs &in, const DLTensor *row_lse,
                                 const DLTensor *col_lse, const DLTensor *dloss, DLTensor *dq,
                                 DLTensor *dk, DLTensor *dlogit_scale) {
  BackwardArgs a;
  // (CUDA calls run under FLATMEM_NONFINITE_PROPAGATE only, see check_features:
  // nothing below reads device memory.)
  const bool refuse_nonfinite = options.nonfinite == FLATMEM_NONFINITE_ERROR;
  const VectorView r = check_vector(row_lse, "row_lse", Dtype::f32, in.b(), DataUse::required, any);
  check_same_device(r.device, "row_lse", in.q.device, "q");
  a.row_lse = r.as<const float>();
  if (refuse_nonfinite) check_finite_vector(a.row_lse, in.b(), "row_lse");
  if (in.loss == Loss::symmetric) {
    const VectorView c = check_vector(col_lse, "col_lse", Dtype::f32, in.c(), DataUse::required, any);
    check_same_device(c.device, "col_lse", in.q.device, "q");
    a.col_lse = c.as<const float>();
    if (refuse_nonfinite) check_finite_vector(a.col_lse, in.c(), "col_lse");
  } else if (col_lse != nullptr) {
    invalid("col_lse: must be NULL for InfoNCE");
  }
  if (dloss != nullptr) {
    const VectorView g = check_scalar(dloss, "dloss", any);
    check_same_device(g.device, "dloss", in.q.device, "q");
    a.dloss_data = g.as<const float>();
    if (!on_cuda(in.q)) a.dloss = *a.dloss_data;
    if (refuse_nonfinite && !std::isfinite(a.dloss))
      fail(FLATMEM_STATUS_NON_FINITE, "dloss: ", a.dloss, "; expected a finite upstream gradient");
  }
  a.dq = check_gradient(dq, "dq", in.q, "q", DataUse::required);
  a.dk = check_gradient(dk, "dk", in.k, "k", DataUse::required);
  if (dlogit_scale != nullptr) {
    const VectorView s = check_scalar(dlogit_scale, "dlogit_scale", any);
    check_same_device(s.device, "dlogit_scale", in.q.device, "q");
    a.dscale = s.as<float>();
  }
  if (!a.dq.data && !a.dk.data && !a.dscale)
    invalid("dq, dk, dlogit_scale: all NULL; request at least one gradient");
  return a;
}

}  // namespace flatmem::contrastive
