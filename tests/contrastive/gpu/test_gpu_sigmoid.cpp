// The sigmoid (SigLIP) loss on the CUDA backend against the float64 reference
// (contrastive/sigmoid_reference.hpp) within its derived bounds plus the
// tensor-core terms (gpu_sigmoid.hpp): fp32 (TF32 and 3xTF32), bf16, fp16;
// one row, primes, extents past the 64 x 128 tile / 32- and 64-feature chunks,
// c > b with labels, s = 100 with t = -10, 16-bit gradients, dloss; partial
// requests (each pass alone, the scalars alone); and determinism: repeated
// calls bitwise equal, and backward with g = 1 bitwise equal to
// value_and_grad (the same kernels with g read as 1).
#include <doctest/doctest.h>
#include <flatmem/flatmem.h>

#include <string>
#include <utility>
#include <vector>

#include "contrastive/gpu/gpu_sigmoid.hpp"

using namespace flatmem_test;

namespace {

struct Precision {
  Dtype dtype;
  flatmem_fp32_precision fp32;
  const char *name;
};
constexpr Precision precisions[] = {
    {Dtype::f32, FLATMEM_FP32_PRECISION_DEFAULT, "fp32/tf32"},
    {Dtype::f32, FLATMEM_FP32_PRECISION_FULL, "fp32/3xtf32"},
    {Dtype::bf16, FLATMEM_FP32_PRECISION_DEFAULT, "bf16"},
    {Dtype::f16, FLATMEM_FP32_PRECISION_DEFAULT, "fp16"},
};

SigmoidShape shape(std::int64_t b, std::int64_t c, std::int64_t d, bool labels = false,
                   double scale = 10.0, double bias = -10.0, std::uint64_t seed = 1) {
  SigmoidShape s;
  s.b = b;
  s.c = c;
  s.d = d;
  s.labels = labels;
  s.scale = scale;
  s.bias = bias;
  s.seed = seed;
  return s;
}

// The shapes of the suite (name, shape); each runs for every precision.
struct Named {
  const char *name;
  SigmoidShape shape;
};
const Named shapes[] = {
    {"1x1x1", shape(1, 1, 1)},
    {"primes 67x131x37", shape(67, 131, 37)},
    {"square 130x130x64 s=100 t=-10", shape(130, 130, 64, false, 100.0, -10.0)},
    {"c>b labels 13x200x70", shape(13, 200, 70, true, 10.0, -5.0)},
    {"many tiles 300x257x129 labels", shape(300, 257, 129, true, 20.0, 3.0)},
    {"d=1 c>b 70x140x1", shape(70, 140, 1, false, 5.0, 0.0)},
};

// value_and_grad (all outputs), forward, and backward with g = -2.5, each
// against the reference; the gradients in fp32 and in the input dtype.
void check_all_calls(const SigmoidShape &base, const Precision &pr) {
  std::vector<Dtype> grads = {Dtype::f32};
  if (pr.dtype != Dtype::f32) grads.push_back(pr.dtype);
  for (const Dtype grad : grads) {
    SigmoidShape s = base;
    s.dtype = pr.dtype;
    s.grad_dtype = grad;
    const SigmoidCase c(s);
    Handle h = gpu_sigmoid_handle(pr.fp32);
    CAPTURE(dtype_name(grad));
    {
      INFO("value_and_grad");
      check_gpu_sigmoid(c, gpu_sigmoid(h.get(), c, SigmoidCall::value_and_grad), 1.0, {}, pr.fp32);
    }
    {
      INFO("forward");
      const SigmoidOutputs o = gpu_sigmoid(h.get(), c, SigmoidCall::forward);
      check_gpu_sigmoid(c, o, 1.0, {true, false, false, false, false}, pr.fp32);
      CHECK(o.dq.all_bytes_are(sentinel_byte));
    }
    {
      INFO("backward g = -2.5");
      const SigmoidOutputs o = gpu_sigmoid(h.get(), c, SigmoidCall::backward, {}, -2.5);
      check_gpu_sigmoid(c, o, -2.5, {false, true, true, true, true}, pr.fp32);
      CHECK(o.loss.all_bytes_are(sentinel_byte));
    }
  }
}

}  // namespace

TEST_CASE("gpu/sigmoid/values") {
  for (const Precision &pr : precisions)
    for (const Named &n : shapes) {
      INFO(pr.name, " ", n.name);
      check_all_calls(n.shape, pr);
    }
}

// Each pass alone: dk only (the column pass computes the sums), dq only (the
// row pass), the scalars only (the row pass without a product), the loss alone.
TEST_CASE("gpu/sigmoid/partial requests") {
  for (const Precision &pr : precisions) {
    SigmoidShape s = shape(77, 150, 45, true, 30.0, -7.0, 3);
    s.dtype = pr.dtype;
    const SigmoidCase c(s);
    Handle h = gpu_sigmoid_handle(pr.fp32);
    const SigmoidRequest requests[] = {
        {true, false, true, true, true},    // dk pass with the sums
        {true, true, false, true, true},    // dq pass with the sums
        {true, false, false, true, true},   // the row pass, no product
        {false, false, false, false, true}, // dt alone
        {false, true, false, false, false}, // dq alone
    };
    for (const SigmoidRequest &want : requests) {
      INFO(pr.name, " loss ", want.loss, " dq ", want.dq, " dk ", want.dk, " ds ", want.ds, " dt ", want.dt);
      const SigmoidOutputs o = gpu_sigmoid(h.get(), c, SigmoidCall::value_and_grad, want);
      check_gpu_sigmoid(c, o, 1.0, {want.loss, want.dq, want.dk, want.ds, want.dt}, pr.fp32);
      const std::pair<bool, const HostTensor *> outputs[] = {
          {want.loss, &o.loss}, {want.dq, &o.dq}, {want.dk, &o.dk}, {want.ds, &o.ds}, {want.dt, &o.dt}};
      for (const auto &[requested, t] : outputs)
        if (!requested) CHECK_MESSAGE(t->all_bytes_are(sentinel_byte), "an output not requested was written");
    }
  }
}

TEST_CASE("gpu/sigmoid/determinism") {
  for (const Precision &pr : precisions) {
    INFO(pr.name);
    SigmoidShape s = shape(333, 270, 100, true, 100.0, -10.0, 9);
    s.dtype = pr.dtype;
    const SigmoidCase c(s);
    Handle h = gpu_sigmoid_handle(pr.fp32);
    const SigmoidOutputs first = gpu_sigmoid(h.get(), c, SigmoidCall::value_and_grad);
    const SigmoidOutputs second = gpu_sigmoid(h.get(), c, SigmoidCall::value_and_grad);
    const SigmoidOutputs backward = gpu_sigmoid(h.get(), c, SigmoidCall::backward, {}, 1.0);
    const SigmoidOutputs forward = gpu_sigmoid(h.get(), c, SigmoidCall::forward);
    CHECK(first.loss.same_bits(second.loss));
    CHECK(first.dq.same_bits(second.dq));
    CHECK(first.dk.same_bits(second.dk));
    CHECK(first.ds.same_bits(second.ds));
    CHECK(first.dt.same_bits(second.dt));
    CHECK(first.dq.same_bits(backward.dq));
    CHECK(first.dk.same_bits(backward.dk));
    CHECK(first.ds.same_bits(backward.ds));
    CHECK(first.dt.same_bits(backward.dt));
    CHECK(first.loss.same_bits(forward.loss));
    check_gpu_sigmoid(c, first, 1.0, {}, pr.fp32);
  }
}

// The small case the compute-sanitizer tests run (tests/CMakeLists.txt,
// scripts/gpu-check.sh): every call, both passes, the block sums.
TEST_CASE("gpu/sigmoid/sanitizer-case/bf16 and fp32, b=70, c=131, d=40, labels") {
  for (const Precision &pr : {precisions[0], precisions[2]}) {
    INFO(pr.name);
    SigmoidShape s = shape(70, 131, 40, true, 10.0, -10.0, 4);
    s.dtype = pr.dtype;
    s.grad_dtype = pr.dtype;
    const SigmoidCase c(s);
    Handle h = gpu_sigmoid_handle(pr.fp32);
    check_gpu_sigmoid(c, gpu_sigmoid(h.get(), c, SigmoidCall::value_and_grad), 1.0, {}, pr.fp32);
    check_gpu_sigmoid(c, gpu_sigmoid(h.get(), c, SigmoidCall::forward), 1.0, {true, false, false, false, false},
                      pr.fp32);
    check_gpu_sigmoid(c, gpu_sigmoid(h.get(), c, SigmoidCall::backward, {}, 0.5), 0.5,
                      {false, true, true, true, true}, pr.fp32);
  }
}
