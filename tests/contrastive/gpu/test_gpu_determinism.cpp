// The CUDA backend is deterministic: the same call twice gives the same bits
// (fixed work split, fixed-order reductions, no atomics), for every output,
// with shapes that give several row groups, column groups and persistent
// CTAs per pass.
#include <doctest/doctest.h>

#include "contrastive/gpu/gpu_call.hpp"
#include "support/random.hpp"

using namespace flatmem_test;

namespace {

void check_twice(flatmem_contrastive_loss loss, Dtype dtype, std::int64_t b, std::int64_t c, std::int64_t d,
                 Dtype grad) {
  const bool symmetric = loss != FLATMEM_CONTRASTIVE_INFONCE;
  Random rng(11);
  HostTensor q = HostTensor::matrix(dtype, b, d), k = HostTensor::matrix(dtype, c, d);
  fill_features(q, rng, 1.0, true);
  fill_features(k, rng, 1.0, true);
  const HostTensor scale = HostTensor::scalar(Dtype::f32, 30.0);
  DeviceInputs in = upload(q, k, nullptr, scale);
  Handle h = create_handle(gpu_options(loss));
  GradientRequest want;
  want.dq_type = want.dk_type = grad;
  want.dloss = 0.75;
  const GpuForward f1 = gpu_forward(h.get(), symmetric, in, b, c);
  const GpuForward f2 = gpu_forward(h.get(), symmetric, in, b, c);
  CHECK(f1.loss.same_bits(f2.loss));
  CHECK(f1.row_lse.same_bits(f2.row_lse));
  if (symmetric) CHECK(f1.col_lse.same_bits(f2.col_lse));
  const GpuBackward b1 = gpu_backward(h.get(), symmetric, in, f1, want, b, c, d);
  const GpuBackward b2 = gpu_backward(h.get(), symmetric, in, f1, want, b, c, d);
  CHECK(b1.dq.same_bits(b2.dq));
  CHECK(b1.dk.same_bits(b2.dk));
  CHECK(b1.ds.same_bits(b2.ds));
}

}  // namespace

TEST_CASE("gpu/contrastive/determinism/symmetric/bf16/b=4099,d=96,grad=bf16") {
  check_twice(FLATMEM_CONTRASTIVE_SYMMETRIC, Dtype::bf16, 4099, 4099, 96, Dtype::bf16);
}
TEST_CASE("gpu/contrastive/determinism/symmetric/fp32-tf32/b=2053,d=40") {
  check_twice(FLATMEM_CONTRASTIVE_SYMMETRIC, Dtype::f32, 2053, 2053, 40, Dtype::f32);
}
TEST_CASE("gpu/contrastive/determinism/infonce/fp16/b=1031,c=3001,d=72") {
  check_twice(FLATMEM_CONTRASTIVE_INFONCE, Dtype::f16, 1031, 3001, 72, Dtype::f16);
}
// The small case the compute-sanitizer tests run (tests/CMakeLists.txt).
TEST_CASE("gpu/contrastive/determinism/sanitizer-case/symmetric/bf16/b=131,d=40") {
  check_twice(FLATMEM_CONTRASTIVE_SYMMETRIC, Dtype::bf16, 131, 131, 40, Dtype::bf16);
  check_twice(FLATMEM_CONTRASTIVE_INFONCE, Dtype::f32, 67, 131, 33, Dtype::f32);
}
