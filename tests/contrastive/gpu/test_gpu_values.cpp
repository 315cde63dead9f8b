// The CUDA backend against the double-precision reference and against the
// CPU backend, on the CPU suite's shapes: one row, primes, extents that are
// not multiples of the 64 x 128 tile or of the 32-feature chunk, d = 1,
// c > b with hard negatives and with labels, s = 100, row strides, 16-bit
// gradients, partial requests and dloss. Names say loss/dtype/shape; every
// case runs the forward and the backward on kDLCUDA tensors. Tolerances:
// gpu_call.hpp (the CPU suite's bounds plus the tensor-core roundings).
#include <doctest/doctest.h>
#include <flatmem/flatmem.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>

#include "contrastive/gpu/gpu_call.hpp"
#include "support/random.hpp"

using namespace flatmem_test;

namespace {

enum class Labels { none, shuffled, duplicates };

struct GpuCase {
  flatmem_contrastive_loss loss = FLATMEM_CONTRASTIVE_SYMMETRIC;
  Dtype dtype = Dtype::f32;
  flatmem_fp32_precision precision = FLATMEM_FP32_PRECISION_DEFAULT;
  std::int64_t b = 1, c = 0, d = 1;  // c = 0: c = b
  double scale = 10.0;
  Labels labels = Labels::none;
  std::int64_t q_pad = 0, k_pad = 0;
  GradientRequest want;
  bool compare_with_cpu = true;
  std::uint64_t seed = 5;
};

bool symmetric(const GpuCase &gc) { return gc.loss != FLATMEM_CONTRASTIVE_INFONCE; }
std::int64_t columns(const GpuCase &gc) { return gc.c ? gc.c : gc.b; }

struct HostInputs {
  HostTensor q, k, labels, scale;
  bool has_labels = false;
};

HostInputs make_host_inputs(const GpuCase &gc) {
  Random rng(gc.seed);
  HostInputs in;
  const std::int64_t c = columns(gc);
  in.q = HostTensor::matrix(gc.dtype, gc.b, gc.d, gc.d + gc.q_pad);
  in.k = HostTensor::matrix(gc.dtype, c, gc.d, gc.d + gc.k_pad);
  fill_features(in.q, rng, 1.0, true);
  fill_features(in.k, rng, 1.0, true);
  if (gc.labels != Labels::none) {
    in.has_labels = true;
    in.labels = HostTensor::vector(Dtype::i64, gc.b);
    std::vector<std::int64_t> perm(static_cast<std::size_t>(c));
    std::iota(perm.begin(), perm.end(), 0);
    for (std::int64_t i = c - 1; i > 0; --i) std::swap(perm[std::size_t(i)], perm[std::size_t(rng.below(i + 1))]);
    for (std::int64_t i = 0; i < gc.b; ++i) {
      std::int64_t y = gc.labels == Labels::shuffled ? perm[std::size_t(i % c)] : rng.below(c);
      if (gc.labels == Labels::duplicates && i == 1) y = std::int64_t(in.labels.get(0));
      if (gc.labels == Labels::duplicates && i == 2) y = c - 1;
      in.labels.set(i, double(y));
    }
  }
  in.scale = HostTensor::scalar(Dtype::f32, gc.scale);
  return in;
}

// The CPU backend on the same host tensors (its own tolerances apply to it).
void compare_with_cpu(const GpuCase &gc, const HostInputs &in, const GpuForward &gpu_f, const GpuBackward &gpu_b,
                      const ReferenceProblem &problem, const ReferenceResult &ref, const ForwardTolerance &gpu_ft,
                      const BackwardTolerance &gpu_bt) {
  Handle cpu = create_handle(make_options(gc.loss, 2));
  const bool sym = symmetric(gc);
  HostTensor loss = HostTensor::scalar(Dtype::f32, 0.0), row = HostTensor::vector(Dtype::f32, gc.b), col;
  if (sym) col = HostTensor::vector(Dtype::f32, columns(gc));
  REQUIRE(flatmem_contrastive_forward(cpu.get(), in.q.dl(), in.k.dl(), in.has_labels ? in.labels.dl() : nullptr,
                                      in.scale.dl(), loss.dl(), row.dl(), sym ? col.dl() : nullptr, nullptr, 0,
                                      nullptr) == FLATMEM_STATUS_SUCCESS);
  const ForwardTolerance cpu_ft = forward_tolerance(problem, ref);
  const auto sum = [](const std::vector<double> &a, const std::vector<double> &b) {
    std::vector<double> s(a.size());
    for (std::size_t n = 0; n < a.size(); ++n) s[n] = a[n] + b[n];
    return s;
  };
  check_close("loss: GPU vs CPU", gpu_f.loss, loss.get(0), gpu_ft.loss + cpu_ft.loss);
  check_close("row_lse: GPU vs CPU", gpu_f.row_lse, row.values(), sum(gpu_ft.row_lse, cpu_ft.row_lse));
  if (sym) check_close("col_lse: GPU vs CPU", gpu_f.col_lse, col.values(), sum(gpu_ft.col_lse, cpu_ft.col_lse));
  if (!gc.want.dq) return;  // one gradient is enough to compare the backends
  HostTensor dq = HostTensor::matrix(Dtype::f32, gc.b, gc.d);
  REQUIRE(flatmem_contrastive_backward(cpu.get(), in.q.dl(), in.k.dl(), in.has_labels ? in.labels.dl() : nullptr,
                                       in.scale.dl(), row.dl(), sym ? col.dl() : nullptr, nullptr, dq.dl(), nullptr,
                                       nullptr, nullptr, 0, nullptr) == FLATMEM_STATUS_SUCCESS);
  if (gc.want.dloss || gc.want.dq_type != Dtype::f32) return;  // the CPU call above used g = 1, fp32
  const BackwardTolerance cpu_bt = backward_tolerance(problem, ref, cpu_ft, Dtype::f32, Dtype::f32);
  check_close("dq: GPU vs CPU", gpu_b.dq, dq.values(), sum(gpu_bt.dq, cpu_bt.dq));
}

void check_gpu_values(const GpuCase &gc) {
  const bool sym = symmetric(gc);
  const std::int64_t c = columns(gc);
  const HostInputs in = make_host_inputs(gc);
  DeviceInputs dev = upload(in.q, in.k, in.has_labels ? &in.labels : nullptr, in.scale);
  Handle h = create_handle(gpu_options(gc.loss, gc.precision));

  std::optional<HostTensor> g;
  if (gc.want.dloss) g = HostTensor::scalar(Dtype::f32, *gc.want.dloss);
  const ReferenceProblem problem =
      reference_problem(sym, in.q, in.k, in.has_labels ? &in.labels : nullptr, in.scale, g ? g->get(0) : 1.0);
  const ReferenceResult ref = reference_loss(problem);
  const TensorCoreError error = tensor_core_error(gc.dtype, gc.precision);
  const ForwardTolerance ft = gpu_forward_tolerance(problem, ref, error);

  const GpuForward fwd = gpu_forward(h.get(), sym, dev, gc.b, c);
  check_close("loss", fwd.loss, ref.loss, ft.loss);
  check_close("row_lse", fwd.row_lse, ref.row_lse, ft.row_lse);
  if (sym) check_close("col_lse", fwd.col_lse, ref.col_lse, ft.col_lse);

  const GpuBackward bwd = gpu_backward(h.get(), sym, dev, fwd, gc.want, gc.b, c, gc.d);
  const BackwardTolerance bt = gpu_backward_tolerance(problem, ref, ft, error, gc.want.dq_type, gc.want.dk_type);
  if (gc.want.dq) {
    check_close("dq", bwd.dq, ref.dq, bt.dq);
    CHECK_MESSAGE(bwd.dq.padding_untouched(), "dq: bytes between rows were written");
  }
  if (gc.want.dk) {
    check_close("dk", bwd.dk, ref.dk, bt.dk);
    CHECK_MESSAGE(bwd.dk.padding_untouched(), "dk: bytes between rows were written");
  }
  if (gc.want.ds) check_close("dlogit_scale", bwd.ds, ref.ds, bt.ds);
  if (gc.compare_with_cpu) compare_with_cpu(gc, in, fwd, bwd, problem, ref, ft, bt);
}

constexpr auto SYM = FLATMEM_CONTRASTIVE_SYMMETRIC;
constexpr auto NCE = FLATMEM_CONTRASTIVE_INFONCE;

GpuCase sym(std::int64_t b, std::int64_t d, Dtype t = Dtype::f32) {
  GpuCase g;
  g.loss = SYM;
  g.b = b;
  g.d = d;
  g.dtype = t;
  return g;
}
GpuCase nce(std::int64_t b, std::int64_t c, std::int64_t d, Labels labels = Labels::none, Dtype t = Dtype::f32) {
  GpuCase g = sym(b, d, t);
  g.loss = NCE;
  g.c = c;
  g.labels = labels;
  return g;
}
template <typename Edit>
GpuCase with(GpuCase g, Edit edit) {
  edit(g);
  return g;
}

}  // namespace

// --- symmetric, fp32 (TF32 by default, 3xTF32 with FULL) -------------------------------
TEST_CASE("gpu/contrastive/symmetric/fp32-tf32/b=1,d=1") { check_gpu_values(sym(1, 1)); }
TEST_CASE("gpu/contrastive/symmetric/fp32-tf32/b=7,d=1") { check_gpu_values(sym(7, 1)); }
TEST_CASE("gpu/contrastive/symmetric/fp32-tf32/b=13,d=7") { check_gpu_values(sym(13, 7)); }
TEST_CASE("gpu/contrastive/symmetric/fp32-tf32/b=263,d=97") { check_gpu_values(sym(263, 97)); }
TEST_CASE("gpu/contrastive/symmetric/fp32-tf32/b=257,d=257") { check_gpu_values(sym(257, 257)); }
TEST_CASE("gpu/contrastive/symmetric/fp32-tf32/b=1031,d=16") { check_gpu_values(sym(1031, 16)); }
TEST_CASE("gpu/contrastive/symmetric/fp32-full/b=263,d=97") {
  check_gpu_values(with(sym(263, 97), [](GpuCase &g) { g.precision = FLATMEM_FP32_PRECISION_FULL; }));
}
TEST_CASE("gpu/contrastive/symmetric/fp32-full/s=100,b=129,d=65") {
  check_gpu_values(with(sym(129, 65), [](GpuCase &g) { g.precision = FLATMEM_FP32_PRECISION_FULL, g.scale = 100.0; }));
}
TEST_CASE("gpu/contrastive/symmetric/fp32-tf32/s=100,b=263,d=97") {
  check_gpu_values(with(sym(263, 97), [](GpuCase &g) { g.scale = 100.0; }));
}
TEST_CASE("gpu/contrastive/symmetric/fp32-tf32/s=0.01,b=97,d=13") {
  check_gpu_values(with(sym(97, 13), [](GpuCase &g) { g.scale = 0.01; }));
}
TEST_CASE("gpu/contrastive/symmetric/fp32-tf32/dloss=-2.5,strided,q+5,k+3,dq+7,dk+1,b=97,d=31") {
  check_gpu_values(with(sym(97, 31), [](GpuCase &g) {
    g.want.dloss = -2.5, g.q_pad = 5, g.k_pad = 3, g.want.dq_pad = 7, g.want.dk_pad = 1;
  }));
}
TEST_CASE("gpu/contrastive/symmetric/fp32-tf32/dq-only,b=97,d=31") {
  check_gpu_values(with(sym(97, 31), [](GpuCase &g) { g.want.dk = g.want.ds = false; }));
}
TEST_CASE("gpu/contrastive/symmetric/fp32-tf32/dk-only,b=97,d=31") {
  check_gpu_values(with(sym(97, 31), [](GpuCase &g) { g.want.dq = g.want.ds = false; }));
}
TEST_CASE("gpu/contrastive/symmetric/fp32-tf32/ds-only,b=97,d=31") {
  check_gpu_values(with(sym(97, 31), [](GpuCase &g) { g.want.dq = g.want.dk = false; }));
}
TEST_CASE("gpu/contrastive/symmetric/fp32-tf32/dk-and-ds,b=97,d=31") {
  check_gpu_values(with(sym(97, 31), [](GpuCase &g) { g.want.dq = false; }));
}

// --- symmetric, 16-bit ---------------------------------------------------------------------
TEST_CASE("gpu/contrastive/symmetric/bf16/b=1,d=1,grad=bf16") {
  check_gpu_values(with(sym(1, 1, Dtype::bf16), [](GpuCase &g) { g.want.dq_type = g.want.dk_type = Dtype::bf16; }));
}
TEST_CASE("gpu/contrastive/symmetric/bf16/b=263,d=97,grad=bf16") {
  check_gpu_values(with(sym(263, 97, Dtype::bf16), [](GpuCase &g) { g.want.dq_type = g.want.dk_type = Dtype::bf16; }));
}
TEST_CASE("gpu/contrastive/symmetric/bf16/b=263,d=97,grad=fp32") { check_gpu_values(sym(263, 97, Dtype::bf16)); }
TEST_CASE("gpu/contrastive/symmetric/bf16/s=100,b=257,d=64,grad=bf16") {
  check_gpu_values(with(sym(257, 64, Dtype::bf16), [](GpuCase &g) {
    g.want.dq_type = g.want.dk_type = Dtype::bf16, g.scale = 100.0;
  }));
}
TEST_CASE("gpu/contrastive/symmetric/bf16/b=2053,d=40") { check_gpu_values(sym(2053, 40, Dtype::bf16)); }
TEST_CASE("gpu/contrastive/symmetric/fp16/b=97,d=64,grad=fp16") {
  check_gpu_values(with(sym(97, 64, Dtype::f16), [](GpuCase &g) { g.want.dq_type = g.want.dk_type = Dtype::f16; }));
}
// Odd row strides: the 16-byte vector loads fall back to element loads.
TEST_CASE("gpu/contrastive/symmetric/fp16/strided,q+3,k+11,b=97,d=64,grad=fp32") {
  check_gpu_values(with(sym(97, 64, Dtype::f16), [](GpuCase &g) {
    g.q_pad = 3, g.k_pad = 11, g.want.dq_pad = 1, g.want.dk_pad = 2;
  }));
}

// --- InfoNCE ---------------------------------------------------------------------------------
TEST_CASE("gpu/contrastive/infonce/fp32-tf32/b=1,c=1,d=1") { check_gpu_values(nce(1, 1, 1)); }
TEST_CASE("gpu/contrastive/infonce/fp32-tf32/hard-negatives,b=7,c=13,d=5") { check_gpu_values(nce(7, 13, 5)); }
TEST_CASE("gpu/contrastive/infonce/fp32-tf32/hard-negatives,b=97,c=263,d=31") { check_gpu_values(nce(97, 263, 31)); }
TEST_CASE("gpu/contrastive/infonce/fp32-tf32/labels=shuffled,b=263,c=263,d=97") {
  check_gpu_values(nce(263, 263, 97, Labels::shuffled));
}
TEST_CASE("gpu/contrastive/infonce/fp32-tf32/labels=duplicates,b=263,c=97,d=31") {
  check_gpu_values(nce(263, 97, 31, Labels::duplicates));
}
TEST_CASE("gpu/contrastive/infonce/fp32-tf32/labels=duplicates,b=13,c=1,d=7") {
  check_gpu_values(nce(13, 1, 7, Labels::duplicates));
}
TEST_CASE("gpu/contrastive/infonce/fp32-tf32/b=300,c=2053,d=8") { check_gpu_values(nce(300, 2053, 8)); }
TEST_CASE("gpu/contrastive/infonce/fp32-full/s=100,labels=duplicates,b=97,c=263,d=97") {
  check_gpu_values(with(nce(97, 263, 97, Labels::duplicates), [](GpuCase &g) {
    g.scale = 100.0, g.precision = FLATMEM_FP32_PRECISION_FULL;
  }));
}
TEST_CASE("gpu/contrastive/infonce/bf16/labels=duplicates,b=97,c=263,d=31,grad=bf16") {
  check_gpu_values(with(nce(97, 263, 31, Labels::duplicates, Dtype::bf16),
                        [](GpuCase &g) { g.want.dq_type = g.want.dk_type = Dtype::bf16; }));
}
TEST_CASE("gpu/contrastive/infonce/fp16/s=100,labels=shuffled,b=97,c=97,d=48") {
  check_gpu_values(with(nce(97, 97, 48, Labels::shuffled, Dtype::f16), [](GpuCase &g) { g.scale = 100.0; }));
}
TEST_CASE("gpu/contrastive/infonce/fp32-tf32/dloss=3,dk-only,strided,b=61,c=97,d=31") {
  check_gpu_values(with(nce(61, 97, 31, Labels::duplicates), [](GpuCase &g) {
    g.want.dloss = 3.0, g.want.dq = g.want.ds = false, g.k_pad = 2, g.want.dk_pad = 9;
  }));
}
