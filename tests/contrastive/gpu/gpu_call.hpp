// One contrastive-loss case run on the CUDA backend: host inputs are built as
// in the CPU suite, copied to the device, the forward and backward run on the
// legacy default stream with a device workspace of exactly the queried size
// (NULL when it is 0: a handle with a communicator, the ring),
// and the outputs come back into host tensors (prefilled with NaN so that an
// output that is not written shows).
//
// Tolerances: the CPU suite's worst-case bounds (support/tolerance.hpp) plus
// what the tensor cores add, per operand type:
//   logits: bf16 / fp16 products are exact in fp32 (as on the CPU); TF32
//     rounds both factors to 11 significant bits (cvt.rna: relative 2^-11
//     each), so each product errs by 2^-10 + 2^-22 of |q_it k_jt|, i.e.
//     dx += s 2^-10 A; 3xTF32 keeps about 2^-21 (dropped tail x tail and the
//     tails' own rounding), dx += s 2^-20 A.
//   the loss subtracts positive logits formed the same way: + dx once more.
//   gradients: Gt enters the second product rounded to the operand type
//     (bf16 2^-9, fp16 2^-11, TF32 2^-11, 3xTF32 ~2^-21 relative) and, for
//     TF32, the other factor too (2^-11): + (r_G + r_operand) sum |G| |k|.
//   ds: formed from the unrounded fp32 G and the raw products: + r_product
//     sum |G| R.
#pragma once

#include <doctest/doctest.h>
#include <flatmem/flatmem.h>

#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "support/compare.hpp"
#include "support/contrastive.hpp"
#include "support/gpu.hpp"
#include "support/reference.hpp"
#include "support/tensor.hpp"
#include "support/tolerance.hpp"

namespace flatmem_test {

struct GpuForward {
  HostTensor loss, row_lse, col_lse;
};
struct GpuBackward {
  HostTensor dq, dk, ds;
};

inline void fill_nan_values(HostTensor &t) {
  for (std::int64_t r = 0; r < t.rows(); ++r)
    for (std::int64_t c = 0; c < t.cols(); ++c) t.set(r, c, std::nan(""));
}

/** Options for a CUDA handle: PROPAGATE (required on CUDA) and the fp32 precision. */
inline flatmem_contrastive_options gpu_options(flatmem_contrastive_loss loss,
                                               flatmem_fp32_precision precision = FLATMEM_FP32_PRECISION_DEFAULT) {
  flatmem_contrastive_options o = make_options(loss, 1, 0, 0, FLATMEM_NONFINITE_PROPAGATE);
  o.fp32_precision = precision;
  return o;
}

/** Device copies of a case's inputs. */
struct DeviceInputs {
  DeviceTensor q, k, labels, scale;
  bool has_labels = false;
  const DLTensor *labels_dl() const { return has_labels ? labels.dl() : nullptr; }
};

inline DeviceInputs upload(const HostTensor &q, const HostTensor &k, const HostTensor *labels,
                           const HostTensor &scale) {
  DeviceInputs d;
  d.q = DeviceTensor(q);
  d.k = DeviceTensor(k);
  if (labels) {
    d.labels = DeviceTensor(*labels);
    d.has_labels = true;
  }
  d.scale = DeviceTensor(scale);
  return d;
}

inline GpuForward gpu_forward(flatmem_contrastive_t *h, bool symmetric, DeviceInputs &in,
                              std::int64_t b, std::int64_t c) {
  GpuForward out;
  out.loss = HostTensor::scalar(Dtype::f32, std::nan(""));
  out.row_lse = HostTensor::vector(Dtype::f32, b);
  fill_nan_values(out.row_lse);
  if (symmetric) {
    out.col_lse = HostTensor::vector(Dtype::f32, c);
    fill_nan_values(out.col_lse);
  }
  DeviceTensor loss(out.loss), row(out.row_lse), col;
  if (symmetric) col = DeviceTensor(out.col_lse);
  std::size_t bytes = 0;
  REQUIRE(flatmem_contrastive_forward_workspace_size(h, in.q.dl(), in.k.dl(), &bytes) == FLATMEM_STATUS_SUCCESS);
  DeviceBuffer workspace(bytes);
  const flatmem_status status =
      flatmem_contrastive_forward(h, in.q.dl(), in.k.dl(), in.labels_dl(), in.scale.dl(), loss.dl(), row.dl(),
                                  symmetric ? col.dl() : nullptr, bytes ? workspace.data() : nullptr, bytes,
                                  nullptr);
  REQUIRE_MESSAGE(status == FLATMEM_STATUS_SUCCESS, describe(status));
  loss.download(out.loss);
  row.download(out.row_lse);
  if (symmetric) col.download(out.col_lse);
  return out;
}

struct GradientRequest {
  bool dq = true, dk = true, ds = true;
  Dtype dq_type = Dtype::f32, dk_type = Dtype::f32;
  std::int64_t dq_pad = 0, dk_pad = 0;
  std::optional<double> dloss;
};

inline GpuBackward gpu_backward(flatmem_contrastive_t *h, bool symmetric, DeviceInputs &in,
                                const GpuForward &fwd, const GradientRequest &want, std::int64_t b,
                                std::int64_t c, std::int64_t d) {
  GpuBackward out;
  DeviceTensor row(fwd.row_lse), col, dq, dk, ds, dloss;
  if (symmetric) col = DeviceTensor(fwd.col_lse);
  if (want.dq) {
    out.dq = HostTensor::matrix(want.dq_type, b, d, d + want.dq_pad);
    fill_nan_values(out.dq);
    dq = DeviceTensor(out.dq);
  }
  if (want.dk) {
    out.dk = HostTensor::matrix(want.dk_type, c, d, d + want.dk_pad);
    fill_nan_values(out.dk);
    dk = DeviceTensor(out.dk);
  }
  if (want.ds) {
    out.ds = HostTensor::scalar(Dtype::f32, std::nan(""));
    ds = DeviceTensor(out.ds);
  }
  HostTensor g;
  if (want.dloss) {
    g = HostTensor::scalar(Dtype::f32, *want.dloss);
    dloss = DeviceTensor(g);
  }
  std::size_t bytes = 0;
  REQUIRE(flatmem_contrastive_backward_workspace_size(h, in.q.dl(), in.k.dl(), want.dq ? dq.dl() : nullptr,
                                                      want.dk ? dk.dl() : nullptr, &bytes) == FLATMEM_STATUS_SUCCESS);
  DeviceBuffer workspace(bytes);
  const flatmem_status status = flatmem_contrastive_backward(
      h, in.q.dl(), in.k.dl(), in.labels_dl(), in.scale.dl(), row.dl(), symmetric ? col.dl() : nullptr,
      want.dloss ? dloss.dl() : nullptr, want.dq ? dq.dl() : nullptr, want.dk ? dk.dl() : nullptr,
      want.ds ? ds.dl() : nullptr, bytes ? workspace.data() : nullptr, bytes, nullptr);
  REQUIRE_MESSAGE(status == FLATMEM_STATUS_SUCCESS, describe(status));
  if (want.dq) dq.download(out.dq);
  if (want.dk) dk.download(out.dk);
  if (want.ds) ds.download(out.ds);
  return out;
}

// --- tolerances (see the file comment) ---------------------------------------------------

struct TensorCoreError {
  double product = 0.0;   // relative error of one q_it k_jt product
  double gradient = 0.0;  // relative error Gt and the other factor add in the second product
};

inline TensorCoreError tensor_core_error(Dtype input, flatmem_fp32_precision precision) {
  if (input == Dtype::bf16) return {0.0, 0x1p-9};
  if (input == Dtype::f16) return {0.0, 0x1p-11};
  if (precision == FLATMEM_FP32_PRECISION_FULL) return {0x1p-20, 0x1p-20};
  return {0x1p-10, 0x1p-10};
}

inline ForwardTolerance gpu_forward_tolerance(const ReferenceProblem &p, const ReferenceResult &r,
                                              const TensorCoreError &e) {
  ForwardTolerance t = forward_tolerance(p, r);
  const double extra = slack * p.scale * e.product * r.max_abs_dot;
  t.logit += extra;
  for (double &v : t.row_lse) v += extra;
  for (double &v : t.col_lse) v += extra;
  t.max_lse += extra;
  t.loss += 2.0 * extra;
  return t;
}

inline BackwardTolerance gpu_backward_tolerance(const ReferenceProblem &p, const ReferenceResult &r,
                                                const ForwardTolerance &f, const TensorCoreError &e,
                                                Dtype dq_out, Dtype dk_out) {
  BackwardTolerance t = backward_tolerance(p, r, f, dq_out, dk_out);
  for (std::size_t n = 0; n < t.dq.size(); ++n) t.dq[n] += slack * e.gradient * r.dq_abs[n];
  for (std::size_t n = 0; n < t.dk.size(); ++n) t.dk[n] += slack * e.gradient * r.dk_abs[n];
  t.ds += slack * e.product * r.ds_abs;
  return t;
}

}  // namespace flatmem_test
