// Refused input (flatmem.h, "Conventions"): every malformed call returns the
// documented status, flatmem_last_error() names the offending argument, and
// nothing the caller owns is written (outputs are prefilled with sentinel
// bytes that must survive). One TEST_CASE per kind of mistake.
#include <doctest/doctest.h>
#include <flatmem/flatmem.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "support/contrastive.hpp"
#include "support/random.hpp"
#include "support/tensor.hpp"

using namespace flatmem_test;

namespace {

constexpr auto SYM = FLATMEM_CONTRASTIVE_SYMMETRIC;
constexpr auto NCE = FLATMEM_CONTRASTIVE_INFONCE;
constexpr std::size_t bytes_sentinel = 0xA5A5A5A5A5A5A5A5ull;

// A valid call (b = 5, d = 3; InfoNCE: c = 7 with labels) whose arguments a
// test breaks one at a time. The p* pointers are what gets passed; tests may
// point them elsewhere or set them to NULL.
struct Fixture {
  explicit Fixture(flatmem_contrastive_loss kind = SYM, Dtype dtype = Dtype::f32,
                   flatmem_nonfinite_policy nonfinite = FLATMEM_NONFINITE_ERROR)
      : symmetric(kind != NCE), b(5), c(kind == NCE ? 7 : 5), d(3) {
    handle = create_handle(make_options(kind, 2, 0, 0, nonfinite));
    Random rng(3);
    q = HostTensor::matrix(dtype, b, d);
    k = HostTensor::matrix(dtype, c, d);
    fill_features(q, rng, 1.0, true);
    fill_features(k, rng, 1.0, true);
    labels = HostTensor::vector(Dtype::i64, b);
    for (std::int64_t i = 0; i < b; ++i) labels.set(i, double((3 * i + 1) % c));
    scale = HostTensor::scalar(Dtype::f32, 10.0);
    dloss = HostTensor::scalar(Dtype::f32, 1.5);

    // Saved state for the backward, from a successful forward.
    saved_row = HostTensor::vector(Dtype::f32, b);
    saved_col = HostTensor::vector(Dtype::f32, c);
    HostTensor l = HostTensor::scalar(Dtype::f32, 0.0);
    const flatmem_status status = flatmem_contrastive_forward(
        handle.get(), q.dl(), k.dl(), symmetric ? nullptr : labels.dl(), scale.dl(), l.dl(), saved_row.dl(),
        symmetric ? saved_col.dl() : nullptr, nullptr, 0, nullptr);
    if (status != FLATMEM_STATUS_SUCCESS) throw std::runtime_error("fixture forward failed: " + describe(status));

    // Outputs, all sentinel bytes.
    loss = HostTensor::scalar(Dtype::f32, 0.0);
    loss.fill_bytes(sentinel_byte);
    row_lse = HostTensor::vector(Dtype::f32, b);
    col_lse = HostTensor::vector(Dtype::f32, c);
    dq = HostTensor::matrix(Dtype::f32, b, d);
    dk = HostTensor::matrix(Dtype::f32, c, d);
    ds = HostTensor::scalar(Dtype::f32, 0.0);
    ds.fill_bytes(sentinel_byte);

    pq = q.dl();
    pk = k.dl();
    plabels = symmetric ? nullptr : labels.dl();
    pscale = scale.dl();
    ploss = loss.dl();
    prow = row_lse.dl();
    pcol = symmetric ? col_lse.dl() : nullptr;
    psaved_row = saved_row.dl();
    psaved_col = symmetric ? saved_col.dl() : nullptr;
    pdloss = dloss.dl();
    pdq = dq.dl();
    pdk = dk.dl();
    pds = ds.dl();
    h = handle.get();
  }

  flatmem_status forward() {
    return flatmem_contrastive_forward(h, pq, pk, plabels, pscale, ploss, prow, pcol, workspace, workspace_bytes,
                                       nullptr);
  }
  flatmem_status backward() {
    return flatmem_contrastive_backward(h, pq, pk, plabels, pscale, psaved_row, psaved_col, pdloss, pdq, pdk, pds,
                                        workspace, workspace_bytes, nullptr);
  }
  flatmem_status forward_size() {
    bytes = bytes_sentinel;
    return flatmem_contrastive_forward_workspace_size(h, pq, pk, &bytes);
  }
  flatmem_status backward_size() {
    bytes = bytes_sentinel;
    return flatmem_contrastive_backward_workspace_size(h, pq, pk, pdq, pdk, &bytes);
  }

  // Nothing the caller owns was written.
  bool outputs_untouched() const {
    return loss.all_bytes_are(sentinel_byte) && row_lse.all_bytes_are(sentinel_byte) &&
           col_lse.all_bytes_are(sentinel_byte) && dq.all_bytes_are(sentinel_byte) &&
           dk.all_bytes_are(sentinel_byte) && ds.all_bytes_are(sentinel_byte);
  }

  bool symmetric;
  std::int64_t b, c, d;
  Handle handle;
  flatmem_contrastive_t *h = nullptr;
  HostTensor q, k, labels, scale, dloss, saved_row, saved_col;
  HostTensor loss, row_lse, col_lse, dq, dk, ds;
  DLTensor *pq, *pk, *plabels, *pscale, *ploss, *prow, *pcol, *psaved_row, *psaved_col, *pdloss, *pdq, *pdk, *pds;
  void *workspace = nullptr;
  std::size_t workspace_bytes = 0;
  std::size_t bytes = 0;
};

// The call failed with `want`, its message names every `needle`, and no
// output was written.
void expect_refused(const Fixture &f, flatmem_status got, flatmem_status want,
                    std::initializer_list<const char *> needles) {
  const std::string message = flatmem_last_error();
  INFO("status ", flatmem_status_string(got), ", message \"", message, "\"");
  CHECK(got == want);
  CHECK_FALSE(message.empty());
  for (const char *needle : needles) {
    INFO("expected the message to mention \"", needle, "\"");
    CHECK(message.find(needle) != std::string::npos);
  }
  CHECK_MESSAGE(f.outputs_untouched(), "an output was written by a failing call");
}

// A size query failed and left *bytes alone.
void expect_size_refused(const Fixture &f, flatmem_status got, flatmem_status want,
                         std::initializer_list<const char *> needles) {
  expect_refused(f, got, want, needles);
  CHECK_MESSAGE(f.bytes == bytes_sentinel, "*bytes was written by a failing size query");
}

// A matrix DLTensor with a given shape and strides pointing at `data` (for
// shapes too large to allocate).
struct FakeMatrix {
  FakeMatrix(std::int64_t rows, std::int64_t cols, void *data, const std::int64_t *strides = nullptr,
             Dtype dtype = Dtype::f32) {
    shape[0] = rows;
    shape[1] = cols;
    if (strides) stride[0] = strides[0], stride[1] = strides[1];
    t.data = data;
    t.device = {kDLCPU, 0};
    t.ndim = 2;
    t.dtype = dl_dtype(dtype);
    t.shape = shape;
    t.strides = strides ? stride : nullptr;
    t.byte_offset = 0;
  }
  std::int64_t shape[2] = {0, 0};
  std::int64_t stride[2] = {0, 1};
  DLTensor t{};
};

}  // namespace

// ===========================================================================
// NULL arguments
// ===========================================================================

TEST_CASE("contrastive/bad-input/null-handle") {
  Fixture f;
  f.h = nullptr;
  expect_refused(f, f.forward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"handle"});
  expect_refused(f, f.backward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"handle"});
  expect_size_refused(f, f.forward_size(), FLATMEM_STATUS_INVALID_ARGUMENT, {"handle"});
  expect_size_refused(f, f.backward_size(), FLATMEM_STATUS_INVALID_ARGUMENT, {"handle"});
}

TEST_CASE("contrastive/bad-input/null-q") {
  Fixture f;
  f.pq = nullptr;
  expect_refused(f, f.forward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"q"});
  expect_refused(f, f.backward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"q"});
  expect_size_refused(f, f.forward_size(), FLATMEM_STATUS_INVALID_ARGUMENT, {"q"});
}

TEST_CASE("contrastive/bad-input/null-k") {
  Fixture f;
  f.pk = nullptr;
  expect_refused(f, f.forward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"k"});
  expect_refused(f, f.backward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"k"});
  expect_size_refused(f, f.backward_size(), FLATMEM_STATUS_INVALID_ARGUMENT, {"k"});
}

TEST_CASE("contrastive/bad-input/null-logit_scale") {
  Fixture f;
  f.pscale = nullptr;
  expect_refused(f, f.forward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"logit_scale"});
  expect_refused(f, f.backward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"logit_scale"});
}

TEST_CASE("contrastive/bad-input/null-loss") {
  Fixture f;
  f.ploss = nullptr;
  expect_refused(f, f.forward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"loss"});
}

TEST_CASE("contrastive/bad-input/null-row_lse") {
  Fixture f;
  f.prow = nullptr;
  expect_refused(f, f.forward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"row_lse"});
  f.psaved_row = nullptr;
  expect_refused(f, f.backward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"row_lse"});
}

TEST_CASE("contrastive/bad-input/null-col_lse-for-symmetric") {
  Fixture f;
  f.pcol = nullptr;
  expect_refused(f, f.forward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"col_lse"});
  f.psaved_col = nullptr;
  expect_refused(f, f.backward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"col_lse"});
}

TEST_CASE("contrastive/bad-input/col_lse-given-for-infonce") {
  Fixture f(NCE);
  f.pcol = f.col_lse.dl();
  expect_refused(f, f.forward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"col_lse"});
  f.psaved_col = f.saved_row.dl();  // any valid-looking vector
  expect_refused(f, f.backward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"col_lse"});
}

TEST_CASE("contrastive/bad-input/null-data-pointer") {
  Fixture f;
  f.k.dl()->data = nullptr;
  expect_refused(f, f.forward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"k", "NULL"});
  f.k.dl()->data = const_cast<unsigned char *>(f.k.bytes());
  f.row_lse.dl()->data = nullptr;
  expect_refused(f, f.forward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"row_lse", "NULL"});
}

TEST_CASE("contrastive/bad-input/null-bytes-in-size-query") {
  Fixture f;
  CHECK(flatmem_contrastive_forward_workspace_size(f.h, f.pq, f.pk, nullptr) == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(std::string(flatmem_last_error()).find("bytes") != std::string::npos);
  CHECK(flatmem_contrastive_backward_workspace_size(f.h, f.pq, f.pk, f.pdq, f.pdk, nullptr) ==
        FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(std::string(flatmem_last_error()).find("bytes") != std::string::npos);
}

TEST_CASE("contrastive/bad-input/all-gradients-null-in-backward") {
  Fixture f;
  f.pdq = f.pdk = f.pds = nullptr;
  expect_refused(f, f.backward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"dq", "dk", "dlogit_scale"});
}

// ===========================================================================
// dtypes
// ===========================================================================

TEST_CASE("contrastive/bad-input/dtype-q-float64") {
  Fixture f;
  HostTensor q64 = HostTensor::matrix(Dtype::f64, f.b, f.d);
  f.pq = q64.dl();
  expect_refused(f, f.forward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"q", "dtype"});
  expect_refused(f, f.backward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"q", "dtype"});
  expect_size_refused(f, f.forward_size(), FLATMEM_STATUS_INVALID_ARGUMENT, {"q", "dtype"});
}

TEST_CASE("contrastive/bad-input/dtype-k-int32") {
  Fixture f;
  HostTensor k32 = HostTensor::matrix(Dtype::i32, f.c, f.d);
  f.pk = k32.dl();
  expect_refused(f, f.forward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"k", "dtype"});
}

TEST_CASE("contrastive/bad-input/dtype-q-fp32-with-k-bf16") {
  Fixture f;
  HostTensor kb = HostTensor::matrix(Dtype::bf16, f.c, f.d);
  f.pk = kb.dl();
  expect_refused(f, f.forward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"k", "dtype"});
  expect_refused(f, f.backward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"k", "dtype"});
  expect_size_refused(f, f.forward_size(), FLATMEM_STATUS_INVALID_ARGUMENT, {"k"});
}

TEST_CASE("contrastive/bad-input/dtype-q-bf16-with-k-fp16") {
  Fixture f(SYM, Dtype::bf16);
  HostTensor kh = HostTensor::matrix(Dtype::f16, f.c, f.d);
  f.pk = kh.dl();
  expect_refused(f, f.forward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"k", "dtype"});
}

TEST_CASE("contrastive/bad-input/dtype-lanes-2") {
  Fixture f;
  f.q.dl()->dtype.lanes = 2;
  expect_refused(f, f.forward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"q", "dtype"});
}

// The message spells the dtype as torch / NumPy / JAX do (int32, float64, ...), lanes as
// "x<lanes>", and only a code DLPack does not define as its raw fields.
TEST_CASE("contrastive/bad-input/dtype-message-names-int32-float64-uint8-float32x4") {
  const std::string rest = " is not accepted here; expected float32 or bfloat16 or float16";
  struct Case { DLDataType dtype; const char *name; };
  const Case cases[] = {{{kDLInt, 32, 1}, "int32"},
                        {{kDLFloat, 64, 1}, "float64"},
                        {{kDLUInt, 8, 1}, "uint8"},
                        {{kDLFloat, 32, 4}, "float32x4"},
                        {{kDLBfloat, 16, 2}, "bfloat16x2"},
                        {{kDLComplex, 64, 1}, "complex64"},
                        {{6, 8, 1}, "bool"},  // kDLBool (DLPack 0.8)
                        {{9, 32, 1}, "(code 9, bits 32, lanes 1)"}};
  for (const Case &c : cases) {
    CAPTURE(c.name);
    Fixture f;
    f.q.dl()->dtype = c.dtype;  // the dtype is checked before the data is read
    const std::string message = std::string("q: dtype ") + c.name + rest;
    expect_refused(f, f.forward(), FLATMEM_STATUS_INVALID_ARGUMENT, {message.c_str()});
  }
}

TEST_CASE("contrastive/bad-input/dtype-labels-int32") {
  Fixture f(NCE);
  HostTensor l32 = HostTensor::vector(Dtype::i32, f.b);
  f.plabels = l32.dl();
  expect_refused(f, f.forward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"labels", "dtype"});
  expect_refused(f, f.backward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"labels", "dtype"});
}

TEST_CASE("contrastive/bad-input/dtype-logit_scale-float64") {
  Fixture f;
  HostTensor s64 = HostTensor::scalar(Dtype::f64, 10.0);
  f.pscale = s64.dl();
  expect_refused(f, f.forward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"logit_scale", "dtype"});
}

TEST_CASE("contrastive/bad-input/dtype-outputs") {
  Fixture f;
  HostTensor loss16 = HostTensor::scalar(Dtype::f16, 0.0);
  loss16.fill_bytes(sentinel_byte);
  f.ploss = loss16.dl();
  expect_refused(f, f.forward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"loss", "dtype"});
  CHECK(loss16.all_bytes_are(sentinel_byte));
  f.ploss = f.loss.dl();
  HostTensor row_bf16 = HostTensor::vector(Dtype::bf16, f.b);
  f.prow = row_bf16.dl();
  expect_refused(f, f.forward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"row_lse", "dtype"});
  CHECK(row_bf16.all_bytes_are(sentinel_byte));
}

TEST_CASE("contrastive/bad-input/dtype-dq-not-fp32-nor-input") {
  // fp32 inputs: dq must be fp32 (bf16 is not the input dtype).
  Fixture f;
  HostTensor dq16 = HostTensor::matrix(Dtype::bf16, f.b, f.d);
  f.pdq = dq16.dl();
  expect_refused(f, f.backward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"dq", "dtype"});
  expect_size_refused(f, f.backward_size(), FLATMEM_STATUS_INVALID_ARGUMENT, {"dq"});
  CHECK(dq16.all_bytes_are(sentinel_byte));
  // bf16 inputs: dk in fp16 is neither fp32 nor bf16.
  Fixture g(SYM, Dtype::bf16);
  HostTensor dk16 = HostTensor::matrix(Dtype::f16, g.c, g.d);
  g.pdk = dk16.dl();
  expect_refused(g, g.backward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"dk", "dtype"});
  CHECK(dk16.all_bytes_are(sentinel_byte));
}

TEST_CASE("contrastive/bad-input/dtype-dloss-int64") {
  Fixture f;
  HostTensor g64 = HostTensor::scalar(Dtype::i64, 1.0);
  f.pdloss = g64.dl();
  expect_refused(f, f.backward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"dloss", "dtype"});
}

// ===========================================================================
// devices
// ===========================================================================

TEST_CASE("contrastive/bad-input/device-cuda-is-unsupported") {
  Fixture f;
  f.q.dl()->device = {kDLCUDA, 0};
  f.k.dl()->device = {kDLCUDA, 0};
  expect_refused(f, f.forward(), FLATMEM_STATUS_UNSUPPORTED, {"q", "kDLCUDA"});
  expect_refused(f, f.backward(), FLATMEM_STATUS_UNSUPPORTED, {"q"});
  expect_size_refused(f, f.forward_size(), FLATMEM_STATUS_UNSUPPORTED, {"q"});
}

TEST_CASE("contrastive/bad-input/device-opencl-is-invalid") {
  Fixture f;
  f.q.dl()->device = {kDLOpenCL, 0};
  expect_refused(f, f.forward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"q", "device"});
  expect_refused(f, f.backward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"q", "device"});
}

TEST_CASE("contrastive/bad-input/device-mixed-cpu-ids") {
  // All tensors of one call must be on the same device.
  Fixture f;
  f.k.dl()->device = {kDLCPU, 1};
  expect_refused(f, f.forward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"k", "device"});
  f.k.dl()->device = {kDLCPU, 0};
  f.row_lse.dl()->device = {kDLCPU, 3};
  expect_refused(f, f.forward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"row_lse", "device"});
}

TEST_CASE("contrastive/bad-input/device-output-on-cuda") {
  Fixture f;
  f.dq.dl()->device = {kDLCUDA, 0};
  const flatmem_status status = f.backward();
#ifdef FLATMEM_TEST_CUDA_BUILT
  // With the CUDA backend a kDLCUDA dq is a device of its own: a mismatch with q's CPU.
  expect_refused(f, status, FLATMEM_STATUS_INVALID_ARGUMENT, {"dq"});
#else
  // Without it every kDLCUDA tensor is refused as unsupported (flatmem.h, Conventions).
  expect_refused(f, status, FLATMEM_STATUS_UNSUPPORTED, {"dq"});
#endif
}

// ===========================================================================
// ndim and shapes
// ===========================================================================

TEST_CASE("contrastive/bad-input/ndim-q-1") {
  Fixture f;
  HostTensor v = HostTensor::vector(Dtype::f32, f.d);
  f.pq = v.dl();
  expect_refused(f, f.forward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"q", "ndim"});
}

TEST_CASE("contrastive/bad-input/ndim-k-3") {
  Fixture f;
  std::int64_t shape3[3] = {f.c, f.d, 1};
  f.k.dl()->ndim = 3;
  f.k.dl()->shape = shape3;
  expect_refused(f, f.forward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"k", "ndim"});
  expect_size_refused(f, f.forward_size(), FLATMEM_STATUS_INVALID_ARGUMENT, {"k", "ndim"});
}

TEST_CASE("contrastive/bad-input/ndim-row_lse-2") {
  Fixture f;
  HostTensor m = HostTensor::matrix(Dtype::f32, f.b, 1);
  m.fill_bytes(sentinel_byte);
  f.prow = m.dl();
  expect_refused(f, f.forward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"row_lse", "ndim"});
  CHECK(m.all_bytes_are(sentinel_byte));
}

TEST_CASE("contrastive/bad-input/ndim-labels-2") {
  Fixture f(NCE);
  HostTensor m = HostTensor::matrix(Dtype::i64, f.b, 1);
  f.plabels = m.dl();
  expect_refused(f, f.forward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"labels", "ndim"});
}

TEST_CASE("contrastive/bad-input/logit_scale-not-one-element") {
  Fixture f;
  HostTensor two = HostTensor::vector(Dtype::f32, 2);
  two.set(0, 10.0);
  two.set(1, 10.0);
  f.pscale = two.dl();
  expect_refused(f, f.forward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"logit_scale"});
  f.pscale = f.scale.dl();
  HostTensor loss2 = HostTensor::vector(Dtype::f32, 2);
  f.ploss = loss2.dl();
  expect_refused(f, f.forward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"loss"});
  CHECK(loss2.all_bytes_are(sentinel_byte));
}

TEST_CASE("contrastive/bad-input/shape-d-mismatch") {
  Fixture f;
  HostTensor k4 = HostTensor::matrix(Dtype::f32, f.c, f.d + 1);
  f.pk = k4.dl();
  expect_refused(f, f.forward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"k", "d"});
  expect_refused(f, f.backward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"k"});
  expect_size_refused(f, f.forward_size(), FLATMEM_STATUS_INVALID_ARGUMENT, {"k"});
}

TEST_CASE("contrastive/bad-input/shape-symmetric-c-not-b") {
  Fixture f;
  HostTensor k6 = HostTensor::matrix(Dtype::f32, f.b + 1, f.d);
  f.pk = k6.dl();
  expect_refused(f, f.forward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"k", "symmetric"});
  expect_size_refused(f, f.forward_size(), FLATMEM_STATUS_INVALID_ARGUMENT, {"k"});
}

TEST_CASE("contrastive/bad-input/shape-infonce-c-less-than-b-without-labels") {
  Fixture f(NCE);
  HostTensor k3 = HostTensor::matrix(Dtype::f32, f.b - 2, f.d);
  f.pk = k3.dl();
  f.plabels = nullptr;
  expect_refused(f, f.forward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"k"});
}

TEST_CASE("contrastive/bad-input/shape-zero-extent") {
  Fixture f;
  f.q.dl()->shape[0] = 0;
  expect_refused(f, f.forward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"q"});
  f.q.dl()->shape[0] = f.b;
  f.q.dl()->shape[1] = 0;
  expect_size_refused(f, f.forward_size(), FLATMEM_STATUS_INVALID_ARGUMENT, {"q"});
}

TEST_CASE("contrastive/bad-input/shape-row_lse-wrong-length") {
  Fixture f;
  HostTensor r = HostTensor::vector(Dtype::f32, f.b + 1);
  f.prow = r.dl();
  expect_refused(f, f.forward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"row_lse"});
  CHECK(r.all_bytes_are(sentinel_byte));
  HostTensor saved = HostTensor::vector(Dtype::f32, f.b - 1);
  f.psaved_row = saved.dl();
  expect_refused(f, f.backward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"row_lse"});
}

TEST_CASE("contrastive/bad-input/shape-col_lse-wrong-length") {
  Fixture f;
  HostTensor cl = HostTensor::vector(Dtype::f32, f.c - 1);
  f.pcol = cl.dl();
  expect_refused(f, f.forward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"col_lse"});
}

TEST_CASE("contrastive/bad-input/shape-dq-dk-wrong") {
  Fixture f;
  HostTensor dq = HostTensor::matrix(Dtype::f32, f.b, f.d + 1);
  f.pdq = dq.dl();
  expect_refused(f, f.backward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"dq", "shape"});
  expect_size_refused(f, f.backward_size(), FLATMEM_STATUS_INVALID_ARGUMENT, {"dq"});
  CHECK(dq.all_bytes_are(sentinel_byte));
  f.pdq = f.dq.dl();
  HostTensor dk = HostTensor::matrix(Dtype::f32, f.c + 1, f.d);
  f.pdk = dk.dl();
  expect_refused(f, f.backward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"dk", "shape"});
  CHECK(dk.all_bytes_are(sentinel_byte));
}

TEST_CASE("contrastive/bad-input/shape-labels-wrong-length") {
  Fixture f(NCE);
  HostTensor l = HostTensor::vector(Dtype::i64, f.b + 1);
  for (std::int64_t i = 0; i <= f.b; ++i) l.set(i, 0.0);
  f.plabels = l.dl();
  expect_refused(f, f.forward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"labels"});
}

// ===========================================================================
// labels
// ===========================================================================

TEST_CASE("contrastive/bad-input/labels-negative") {
  Fixture f(NCE);
  f.labels.set(3, -1.0);
  expect_refused(f, f.forward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"labels", "-1"});
  expect_refused(f, f.backward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"labels"});
}

TEST_CASE("contrastive/bad-input/labels-at-least-c") {
  Fixture f(NCE);
  f.labels.set(4, double(f.c));
  expect_refused(f, f.forward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"labels", "7"});
  f.labels.set(4, 1e15);
  expect_refused(f, f.backward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"labels"});
}

TEST_CASE("contrastive/bad-input/labels-given-to-symmetric") {
  Fixture f;
  HostTensor l = HostTensor::vector(Dtype::i64, f.b);
  for (std::int64_t i = 0; i < f.b; ++i) l.set(i, double(i));
  f.plabels = l.dl();
  expect_refused(f, f.forward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"labels"});
  expect_refused(f, f.backward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"labels"});
}

// ===========================================================================
// non-finite values
// ===========================================================================

TEST_CASE("contrastive/bad-input/nan-in-q") {
  Fixture f;
  f.q.set(2, 1, std::nan(""));
  expect_refused(f, f.forward(), FLATMEM_STATUS_NON_FINITE, {"q", "(2, 1)"});
  expect_refused(f, f.backward(), FLATMEM_STATUS_NON_FINITE, {"q"});
}

TEST_CASE("contrastive/bad-input/inf-in-k") {
  Fixture f(NCE);
  f.k.set(6, 0, -INFINITY);
  expect_refused(f, f.forward(), FLATMEM_STATUS_NON_FINITE, {"k", "(6, 0)"});
  expect_refused(f, f.backward(), FLATMEM_STATUS_NON_FINITE, {"k"});
}

TEST_CASE("contrastive/bad-input/nan-in-bf16-q") {
  Fixture f(SYM, Dtype::bf16);
  f.q.set(4, 2, std::nan(""));
  expect_refused(f, f.forward(), FLATMEM_STATUS_NON_FINITE, {"q"});
}

TEST_CASE("contrastive/bad-input/inf-in-fp16-k") {
  Fixture f(SYM, Dtype::f16);
  f.k.set(0, 0, 1e6);  // overflows fp16: stored as +Inf
  REQUIRE(std::isinf(f.k.get(0, 0)));
  expect_refused(f, f.forward(), FLATMEM_STATUS_NON_FINITE, {"k"});
}

TEST_CASE("contrastive/bad-input/nan-propagates-under-propagate-policy") {
  // FLATMEM_NONFINITE_PROPAGATE: no scan, the call succeeds and IEEE
  // arithmetic carries the NaN into the loss.
  for (const auto kind : {SYM, NCE}) {
    CAPTURE(kind);
    Fixture f(kind, Dtype::f32, FLATMEM_NONFINITE_PROPAGATE);
    f.q.set(1, 0, std::nan(""));
    const flatmem_status status = f.forward();
    REQUIRE_MESSAGE(status == FLATMEM_STATUS_SUCCESS, describe(status));
    CHECK(std::isnan(f.loss.get(0)));
    CHECK(std::isnan(f.row_lse.get(1)));
  }
}

TEST_CASE("contrastive/bad-input/nan-reaches-gradients-under-propagate-policy") {
  // Under PROPAGATE the backward accepts the NaN row_lse its forward returned
  // and the NaN flows into dq and ds instead of being refused.
  Fixture f(SYM, Dtype::f32, FLATMEM_NONFINITE_PROPAGATE);
  f.q.set(1, 0, std::nan(""));
  f.saved_row.set(1, std::nan(""));
  const flatmem_status status = f.backward();
  REQUIRE_MESSAGE(status == FLATMEM_STATUS_SUCCESS, describe(status));
  CHECK(std::isnan(f.dq.get(1, 0)));
  CHECK(std::isnan(f.ds.get(0)));
}

TEST_CASE("contrastive/bad-input/inf-propagates-under-propagate-policy") {
  Fixture f(SYM, Dtype::f32, FLATMEM_NONFINITE_PROPAGATE);
  f.k.set(3, 2, INFINITY);
  const flatmem_status status = f.forward();
  REQUIRE_MESSAGE(status == FLATMEM_STATUS_SUCCESS, describe(status));
  CHECK_FALSE(std::isfinite(f.loss.get(0)));
}

TEST_CASE("contrastive/bad-input/non-finite-saved-lse-in-backward") {
  // Under FLATMEM_NONFINITE_ERROR (the default) a non-finite row_lse / col_lse is refused
  // like a non-finite feature: FLATMEM_STATUS_NON_FINITE naming the vector and the element.
  Fixture f;
  f.saved_row.set(2, std::nan(""));
  expect_refused(f, f.backward(), FLATMEM_STATUS_NON_FINITE, {"row_lse", "element 2"});
  Fixture g;
  g.saved_col.set(0, INFINITY);
  expect_refused(g, g.backward(), FLATMEM_STATUS_NON_FINITE, {"col_lse", "element 0"});
}

// ===========================================================================
// scalar values
// ===========================================================================

TEST_CASE("contrastive/bad-input/logit_scale-zero-negative-nan-inf") {
  for (double s : {0.0, -0.0, -1.0, double(std::nanf("")), double(INFINITY), -double(INFINITY)}) {
    CAPTURE(s);
    Fixture f;
    f.scale.set(0, s);
    expect_refused(f, f.forward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"logit_scale"});
    expect_refused(f, f.backward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"logit_scale"});
  }
}

TEST_CASE("contrastive/bad-input/dloss-nan") {
  Fixture f;
  f.dloss.set(0, std::nan(""));
  expect_refused(f, f.backward(), FLATMEM_STATUS_NON_FINITE, {"dloss"});
}

// ===========================================================================
// workspace
// ===========================================================================

TEST_CASE("contrastive/bad-input/workspace-too-small") {
  Fixture f;
  REQUIRE(f.forward_size() == FLATMEM_STATUS_SUCCESS);
  const std::size_t forward_bytes = f.bytes;
  GuardedBuffer small(forward_bytes - 1);
  f.workspace = small.data();
  f.workspace_bytes = small.size();
  expect_refused(f, f.forward(), FLATMEM_STATUS_WORKSPACE_TOO_SMALL, {"workspace"});
  CHECK(small.guards_intact());

  REQUIRE(f.backward_size() == FLATMEM_STATUS_SUCCESS);
  const std::size_t backward_bytes = f.bytes;
  GuardedBuffer small_b(backward_bytes - 1);
  f.workspace = small_b.data();
  f.workspace_bytes = small_b.size();
  expect_refused(f, f.backward(), FLATMEM_STATUS_WORKSPACE_TOO_SMALL, {"workspace"});

  // A one-byte workspace as well.
  GuardedBuffer tiny(1);
  f.workspace = tiny.data();
  f.workspace_bytes = 1;
  expect_refused(f, f.forward(), FLATMEM_STATUS_WORKSPACE_TOO_SMALL, {"workspace"});

  // Exactly the queried size works (positive control).
  GuardedBuffer exact(forward_bytes);
  f.workspace = exact.data();
  f.workspace_bytes = exact.size();
  CHECK(f.forward() == FLATMEM_STATUS_SUCCESS);
  CHECK(exact.guards_intact());
}

TEST_CASE("contrastive/bad-input/workspace-null-with-nonzero-bytes") {
  Fixture f;
  f.workspace = nullptr;
  f.workspace_bytes = 4096;
  expect_refused(f, f.forward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"workspace"});
  expect_refused(f, f.backward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"workspace"});
}

// ===========================================================================
// sizes that overflow 32 (or 64) bits
// ===========================================================================

TEST_CASE("contrastive/bad-input/workspace-size-is-64-bit") {
  // b = c = 3 * 2^30 rows: the O(b + c) part of the workspace is many GiB,
  // far past 2^32. Only metadata is read (data NULL). The size is linear in
  // b at fixed tiles (b >= 1024 keeps the default 256-row tiles), so the
  // differences between b = 3*2^28, 3*2^29 and 3*2^30 must be in ratio 1:2;
  // a 32-bit wrap anywhere would break that.
  Handle h = create_handle(make_options(SYM, 2));
  std::size_t sizes[3] = {0, 0, 0};
  for (int n = 0; n < 3; ++n) {
    const std::int64_t rows = std::int64_t(3) << (28 + n);
    FakeMatrix q(rows, 8, nullptr), k(rows, 8, nullptr);
    const flatmem_status status = flatmem_contrastive_forward_workspace_size(h.get(), &q.t, &k.t, &sizes[n]);
    REQUIRE_MESSAGE(status == FLATMEM_STATUS_SUCCESS, describe(status));
  }
  INFO("sizes: ", sizes[0], ", ", sizes[1], ", ", sizes[2]);
  CHECK(sizes[1] > sizes[0]);
  CHECK(sizes[2] > sizes[1]);
  CHECK(sizes[2] - sizes[1] == 2 * (sizes[1] - sizes[0]));
  // at least one 4-byte value per row and per column (the lse state)
  CHECK(sizes[2] - sizes[1] >= 2 * 4 * (std::size_t(3) << 29));
  CHECK(sizes[2] > (std::size_t(1) << 32));
}

TEST_CASE("contrastive/bad-input/backward-workspace-16-bit-accumulators-past-2^32") {
  // 16-bit gradients accumulate in an fp32 buffer of (b + c) * d * 4 bytes
  // inside the workspace (header). b = c = 2^21, d = 2^12: (b + c) * d =
  // 2^34 elements, an element count that overflows 32 bits.
  Handle h = create_handle(make_options(SYM, 2));
  const std::int64_t b = std::int64_t(1) << 21, d = std::int64_t(1) << 12;
  FakeMatrix q(b, d, nullptr, nullptr, Dtype::bf16), k(b, d, nullptr, nullptr, Dtype::bf16);
  FakeMatrix dq16(b, d, nullptr, nullptr, Dtype::bf16), dk16(b, d, nullptr, nullptr, Dtype::bf16);
  FakeMatrix dq32(b, d, nullptr, nullptr, Dtype::f32), dk32(b, d, nullptr, nullptr, Dtype::f32);
  std::size_t narrow = 0, wide = 0;
  REQUIRE(flatmem_contrastive_backward_workspace_size(h.get(), &q.t, &k.t, &dq16.t, &dk16.t, &narrow) ==
          FLATMEM_STATUS_SUCCESS);
  REQUIRE(flatmem_contrastive_backward_workspace_size(h.get(), &q.t, &k.t, &dq32.t, &dk32.t, &wide) ==
          FLATMEM_STATUS_SUCCESS);
  const std::size_t accumulators = std::size_t(2 * b) * std::size_t(d) * 4;  // 2^36 bytes
  INFO("bf16 gradients: ", narrow, " bytes, fp32 gradients: ", wide, " bytes");
  REQUIRE(narrow > wide);
  CHECK(narrow - wide >= accumulators);
  CHECK(narrow - wide <= accumulators + 2 * 64);  // plus alignment of the two regions
}

TEST_CASE("contrastive/bad-input/shape-byte-extent-overflows-64-bits") {
  // (2^40, 2^40) fp32: 2^82 bytes.
  Fixture f;
  const std::int64_t huge = std::int64_t(1) << 40;
  FakeMatrix q(huge, huge, const_cast<unsigned char *>(f.q.bytes()));
  FakeMatrix k(huge, huge, const_cast<unsigned char *>(f.k.bytes()));
  f.pq = &q.t;
  f.pk = &k.t;
  expect_size_refused(f, f.forward_size(), FLATMEM_STATUS_INVALID_ARGUMENT, {"q", "overflow"});
  expect_refused(f, f.forward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"q", "overflow"});
  expect_refused(f, f.backward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"q", "overflow"});
}

TEST_CASE("contrastive/bad-input/row-stride-beyond-int32") {
  // A row stride of 2^31 elements (> 2^31 - 1) with 2 rows: the byte extent
  // fits in 64 bits but the stride does not fit the 32-bit BLAS interface.
  Fixture f;
  const std::int64_t strides[2] = {std::int64_t(1) << 31, 1};
  FakeMatrix q(2, f.d, const_cast<unsigned char *>(f.q.bytes()), strides);
  f.pq = &q.t;
  HostTensor k2 = HostTensor::matrix(Dtype::f32, 2, f.d);
  f.pk = k2.dl();
  expect_size_refused(f, f.forward_size(), FLATMEM_STATUS_INVALID_ARGUMENT, {"q", "stride"});
  expect_refused(f, f.forward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"q", "stride"});
  // and on an output
  Fixture g;
  FakeMatrix dk(g.c, g.d, const_cast<unsigned char *>(g.dk.bytes()), strides);
  g.pdk = &dk.t;
  expect_refused(g, g.backward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"dk", "stride"});
}

// ===========================================================================
// strides and alignment
// ===========================================================================

TEST_CASE("contrastive/bad-input/inner-stride-not-1") {
  Fixture f;
  HostTensor wide = HostTensor::matrix(Dtype::f32, f.b, 2 * f.d);
  const std::int64_t strides[2] = {2 * f.d, 2};
  FakeMatrix q(f.b, f.d, wide.dl()->data, strides);
  f.pq = &q.t;
  expect_refused(f, f.forward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"q", "stride"});
  expect_size_refused(f, f.forward_size(), FLATMEM_STATUS_INVALID_ARGUMENT, {"q", "stride"});
  // on an output too
  f.pq = f.q.dl();
  HostTensor dq_wide = HostTensor::matrix(Dtype::f32, f.b, 2 * f.d);
  FakeMatrix dq(f.b, f.d, dq_wide.dl()->data, strides);
  f.pdq = &dq.t;
  expect_refused(f, f.backward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"dq", "stride"});
  CHECK(dq_wide.all_bytes_are(sentinel_byte));
}

TEST_CASE("contrastive/bad-input/row-stride-smaller-than-d") {
  Fixture f;
  const std::int64_t strides[2] = {f.d - 1, 1};
  FakeMatrix k(f.c, f.d, f.k.dl()->data, strides);
  f.pk = &k.t;
  expect_refused(f, f.forward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"k", "stride"});
  const std::int64_t negative[2] = {-f.d, 1};
  FakeMatrix k2(f.c, f.d, f.k.dl()->data, negative);
  f.pk = &k2.t;
  expect_refused(f, f.forward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"k", "stride"});
}

TEST_CASE("contrastive/bad-input/vector-stride-not-1") {
  Fixture f;
  HostTensor r = HostTensor::vector(Dtype::f32, 2 * f.b);
  std::int64_t stride = 2;
  r.dl()->shape[0] = f.b;
  r.dl()->strides = &stride;
  f.prow = r.dl();
  expect_refused(f, f.forward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"row_lse", "stride"});
  CHECK(r.all_bytes_are(sentinel_byte));
}

TEST_CASE("contrastive/bad-input/misaligned-data-pointer") {
  Fixture f;
  HostTensor big = HostTensor::matrix(Dtype::f32, f.b + 1, f.d);
  // fp32 data starting 2 bytes into a buffer
  big.dl()->data = static_cast<char *>(big.dl()->data) + 2;
  big.dl()->shape[0] = f.b;
  f.pq = big.dl();
  expect_refused(f, f.forward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"q", "align"});
  expect_refused(f, f.backward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"q", "align"});
}

TEST_CASE("contrastive/bad-input/misaligned-byte_offset") {
  Fixture f;
  HostTensor big = HostTensor::matrix(Dtype::f32, f.c + 1, f.d);
  big.dl()->byte_offset = 6;  // not a multiple of 4
  big.dl()->shape[0] = f.c;
  f.pk = big.dl();
  expect_refused(f, f.forward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"k", "align"});
  // the output side: dq with a misaligned byte_offset
  HostTensor dq = HostTensor::matrix(Dtype::f32, f.b + 1, f.d);
  dq.dl()->byte_offset = 2;
  dq.dl()->shape[0] = f.b;
  f.pk = f.k.dl();
  f.pdq = dq.dl();
  expect_refused(f, f.backward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"dq", "align"});
  CHECK(dq.all_bytes_are(sentinel_byte));
}

TEST_CASE("contrastive/bad-input/misaligned-labels") {
  Fixture f(NCE);
  HostTensor l = HostTensor::vector(Dtype::i64, f.b + 1);
  l.dl()->byte_offset = 4;
  l.dl()->shape[0] = f.b;
  f.plabels = l.dl();
  expect_refused(f, f.forward(), FLATMEM_STATUS_INVALID_ARGUMENT, {"labels", "align"});
}

TEST_CASE("contrastive/bad-input/aligned-byte_offset-is-accepted") {
  // Positive control: a byte_offset of whole rows is a valid view.
  Fixture f;
  HostTensor shifted = HostTensor::matrix(Dtype::f32, f.b + 2, f.d);
  for (std::int64_t r = 0; r < f.b; ++r)
    for (std::int64_t c = 0; c < f.d; ++c) shifted.set(r + 2, c, f.q.get(r, c));
  shifted.dl()->byte_offset = 2 * f.d * 4;
  shifted.dl()->shape[0] = f.b;
  f.pq = shifted.dl();
  REQUIRE(f.forward() == FLATMEM_STATUS_SUCCESS);
  HostTensor l = HostTensor::scalar(Dtype::f32, 0.0), r = HostTensor::vector(Dtype::f32, f.b),
             cl = HostTensor::vector(Dtype::f32, f.c);
  REQUIRE(flatmem_contrastive_forward(f.h, f.q.dl(), f.k.dl(), nullptr, f.scale.dl(), l.dl(), r.dl(), cl.dl(),
                                      nullptr, 0, nullptr) == FLATMEM_STATUS_SUCCESS);
  CHECK(l.same_bits(f.loss));
  CHECK(r.same_bits(f.row_lse));
}

// ===========================================================================
// options
// ===========================================================================

namespace {
// create() with these options fails naming `needle` and leaves *out alone.
void expect_create_refused(const flatmem_contrastive_options &o, const char *needle) {
  flatmem_contrastive_t *const sentinel = reinterpret_cast<flatmem_contrastive_t *>(std::uintptr_t(0x1234));
  flatmem_contrastive_t *out = sentinel;
  const flatmem_status status = flatmem_contrastive_create(&out, &o);
  const std::string message = flatmem_last_error();
  INFO("message \"", message, "\"");
  CHECK(status == FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(message.find(needle) != std::string::npos);
  CHECK(out == sentinel);
  if (status == FLATMEM_STATUS_SUCCESS) flatmem_contrastive_destroy(out);
}
}  // namespace

TEST_CASE("contrastive/bad-input/options-struct_size-0") {
  flatmem_contrastive_options o = FLATMEM_CONTRASTIVE_OPTIONS_INIT;
  o.struct_size = 0;
  expect_create_refused(o, "struct_size");
}

TEST_CASE("contrastive/bad-input/options-bad-loss-enum") {
  flatmem_contrastive_options o = FLATMEM_CONTRASTIVE_OPTIONS_INIT;
  o.loss = static_cast<flatmem_contrastive_loss>(FLATMEM_CONTRASTIVE_SIGMOID + 1);  // past the last loss
  expect_create_refused(o, "loss");
  // What a C caller can store in the field (C enums are plain integers);
  // written as bytes because a C++ enum cannot hold -1.
  const std::int32_t minus_one = -1;
  std::memcpy(&o.loss, &minus_one, sizeof minus_one);
  expect_create_refused(o, "loss");
}

TEST_CASE("contrastive/bad-input/options-bad-nonfinite-enum") {
  flatmem_contrastive_options o = FLATMEM_CONTRASTIVE_OPTIONS_INIT;
  o.nonfinite = static_cast<flatmem_nonfinite_policy>(2);
  expect_create_refused(o, "nonfinite");
  const std::int32_t minus_one = -1;  // storable from C; bytes, as in options-bad-loss-enum
  std::memcpy(&o.nonfinite, &minus_one, sizeof minus_one);
  expect_create_refused(o, "nonfinite");
}

TEST_CASE("contrastive/bad-input/options-too-many-threads") {
  flatmem_contrastive_options o = FLATMEM_CONTRASTIVE_OPTIONS_INIT;
  o.num_threads = 257;
  expect_create_refused(o, "num_threads");
  o.num_threads = -1;
  expect_create_refused(o, "num_threads");
  o.num_threads = 256;  // the documented maximum is accepted
  flatmem_contrastive_t *h = nullptr;
  CHECK(flatmem_contrastive_create(&h, &o) == FLATMEM_STATUS_SUCCESS);
  CHECK(flatmem_contrastive_destroy(h) == FLATMEM_STATUS_SUCCESS);
}

TEST_CASE("contrastive/bad-input/options-tile-out-of-range") {
  flatmem_contrastive_options o = FLATMEM_CONTRASTIVE_OPTIONS_INIT;
  o.tile_rows = 4097;
  expect_create_refused(o, "tile_rows");
  o.tile_rows = -16;
  expect_create_refused(o, "tile_rows");
  o.tile_rows = 0;
  o.tile_cols = 4097;
  expect_create_refused(o, "tile_cols");
  o.tile_cols = 4096;  // the documented maximum is accepted
  o.tile_rows = 1;
  flatmem_contrastive_t *h = nullptr;
  CHECK(flatmem_contrastive_create(&h, &o) == FLATMEM_STATUS_SUCCESS);
  CHECK(flatmem_contrastive_destroy(h) == FLATMEM_STATUS_SUCCESS);
}

TEST_CASE("contrastive/bad-input/options-struct_size-prefix-and-larger") {
  // Not an error: an older caller's shorter struct (only the fields up to
  // num_threads) is read up to its struct_size, the rest defaulted; a newer
  // caller's larger struct is read up to the library's sizeof when the bytes
  // past it are 0, and refused (UNSUPPORTED, never ignored) when one is set.
  struct Older {
    std::size_t struct_size;
    flatmem_contrastive_loss loss;
    std::int32_t num_threads;
  };
  struct Newer {
    flatmem_contrastive_options current;
    std::int64_t future_field;
  };
  union {
    flatmem_contrastive_options full;
    Older older;
  } prefix;
  std::memset(&prefix, 0xFF, sizeof prefix);  // garbage past the prefix must be ignored
  prefix.older.struct_size = sizeof(Older);
  prefix.older.loss = FLATMEM_CONTRASTIVE_INFONCE;
  prefix.older.num_threads = 1;
  flatmem_contrastive_t *h = nullptr;
  CHECK_MESSAGE(flatmem_contrastive_create(&h, &prefix.full) == FLATMEM_STATUS_SUCCESS, flatmem_last_error());
  CHECK(flatmem_contrastive_destroy(h) == FLATMEM_STATUS_SUCCESS);

  Newer newer{};
  newer.current = FLATMEM_CONTRASTIVE_OPTIONS_INIT;
  newer.current.struct_size = sizeof(Newer);
  newer.future_field = 0;
  h = nullptr;
  CHECK_MESSAGE(flatmem_contrastive_create(&h, &newer.current) == FLATMEM_STATUS_SUCCESS, flatmem_last_error());
  CHECK(flatmem_contrastive_destroy(h) == FLATMEM_STATUS_SUCCESS);
  newer.future_field = -1;
  h = nullptr;
  CHECK(flatmem_contrastive_create(&h, &newer.current) == FLATMEM_STATUS_UNSUPPORTED);
  CHECK(h == nullptr);
  CHECK(std::string(flatmem_last_error()).find("newer flatmem.h") != std::string::npos);
}
