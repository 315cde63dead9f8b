// Refused input of the sigmoid (SigLIP) loss, as for the softmax losses
// (test_bad_input.cpp): the documented status, a message naming the argument,
// and nothing the caller owns written (outputs prefilled with sentinel bytes).
// Also the combinations not supported yet (a communicator, the logit cache,
// kDLCUDA tensors): UNSUPPORTED, never a silent answer; and the workspace
// query against a guarded buffer of exactly that size.
#include <doctest/doctest.h>
#include <flatmem/comm.h>
#include <flatmem/flatmem.h>

#include <cmath>
#include <limits>
#include <string>

#include "contrastive/sigmoid_case.hpp"
#include "support/contrastive.hpp"
#include "support/cuda_presence.hpp"

using namespace flatmem_test;

namespace {

constexpr double nan_value = std::numeric_limits<double>::quiet_NaN();

SigmoidShape small(bool labels = true) {
  SigmoidShape s;
  s.b = 5;
  s.c = 7;
  s.d = 3;
  s.labels = labels;
  return s;
}

bool untouched(const SigmoidOutputs &o) {
  for (const HostTensor *t : {&o.loss, &o.dq, &o.dk, &o.ds, &o.dt})
    if (!t->all_bytes_are(sentinel_byte)) return false;
  return true;
}

void expect_refused(const SigmoidOutputs &o, flatmem_status got, flatmem_status want,
                    std::initializer_list<const char *> needles) {
  const std::string message = flatmem_last_error();
  INFO("status ", flatmem_status_string(got), ", message \"", message, "\"");
  CHECK(got == want);
  for (const char *needle : needles) {
    INFO("expected the message to mention \"", needle, "\"");
    CHECK(message.find(needle) != std::string::npos);
  }
  CHECK_MESSAGE(untouched(o), "an output was written by a failing call");
}

// All three calls on `c` refused the same way.
void expect_all_refused(const SigmoidCase &c, flatmem_contrastive_t *h, flatmem_status want,
                        std::initializer_list<const char *> needles) {
  SigmoidOutputs o = c.outputs();
  expect_refused(o, c.forward(h, o), want, needles);
  expect_refused(o, c.value_and_grad(h, o), want, needles);
  expect_refused(o, c.backward(h, 1.0, o), want, needles);
}

// Creates (and destroys) a handle; message: flatmem_last_error() of create.
flatmem_status create_with(flatmem_contrastive_options o, std::string &message) {
  flatmem_contrastive_t *h = nullptr;
  const flatmem_status status = flatmem_contrastive_create(&h, &o);
  message = flatmem_last_error();
  flatmem_contrastive_destroy(h);
  return status;
}

}  // namespace

TEST_CASE("contrastive/sigmoid/bad input/handle of the other kind") {
  const SigmoidCase c(small());
  Handle softmax = create_handle(make_options(FLATMEM_CONTRASTIVE_INFONCE, 1));
  expect_all_refused(c, softmax.get(), FLATMEM_STATUS_INVALID_ARGUMENT, {"FLATMEM_CONTRASTIVE_SIGMOID"});
  expect_all_refused(c, nullptr, FLATMEM_STATUS_INVALID_ARGUMENT, {"handle"});

  // the softmax entry points refuse a sigmoid handle
  Handle h = sigmoid_handle(1);
  SigmoidOutputs o = c.outputs();
  HostTensor row_lse = HostTensor::vector(Dtype::f32, c.shape.b);
  row_lse.fill_bytes(sentinel_byte);
  expect_refused(o, flatmem_contrastive_forward(h.get(), c.q.dl(), c.k.dl(), c.labels.dl(), c.scale.dl(),
                                                o.loss.dl(), row_lse.dl(), nullptr, nullptr, 0, nullptr),
                 FLATMEM_STATUS_INVALID_ARGUMENT, {"flatmem_contrastive_sigmoid_forward"});
  CHECK(row_lse.all_bytes_are(sentinel_byte));
  expect_refused(o, flatmem_contrastive_backward(h.get(), c.q.dl(), c.k.dl(), c.labels.dl(), c.scale.dl(),
                                                 row_lse.dl(), nullptr, nullptr, o.dq.dl(), o.dk.dl(),
                                                 o.ds.dl(), nullptr, 0, nullptr),
                 FLATMEM_STATUS_INVALID_ARGUMENT, {"flatmem_contrastive_sigmoid_forward"});
  std::size_t bytes = 12345;
  CHECK(flatmem_contrastive_forward_workspace_size(h.get(), c.q.dl(), c.k.dl(), &bytes) ==
        FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(flatmem_contrastive_backward_workspace_size(h.get(), c.q.dl(), c.k.dl(), nullptr, nullptr, &bytes) ==
        FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(bytes == 12345);
}

TEST_CASE("contrastive/sigmoid/unsupported/the logit cache at create") {
  flatmem_contrastive_options o = make_options(FLATMEM_CONTRASTIVE_SIGMOID, 1);
  o.logit_cache_bytes = 1 << 20;
  std::string message;
  CHECK(create_with(o, message) == FLATMEM_STATUS_UNSUPPORTED);
  CHECK_MESSAGE(message.find("logit_cache_bytes") != std::string::npos, message);
}

// Host memory labelled kDLCUDA (every tensor of the call): under
// FLATMEM_NONFINITE_ERROR always UNSUPPORTED (no host scan of device memory);
// under PROPAGATE UNSUPPORTED in a build without the CUDA backend or on a
// machine without a usable device, and INVALID_ARGUMENT (host memory, not
// device memory) where the CUDA backend runs; the message says kDLCUDA.
TEST_CASE("contrastive/sigmoid/unsupported/kDLCUDA tensors") {
  for (flatmem_nonfinite_policy policy : {FLATMEM_NONFINITE_ERROR, FLATMEM_NONFINITE_PROPAGATE}) {
    SigmoidCase c(small());
    Handle h = sigmoid_handle(1, 0, 0, policy);
    SigmoidOutputs o = c.outputs();
    for (HostTensor *t : {&c.q, &c.k, &c.labels, &c.scale, &c.bias, &o.loss, &o.dq, &o.dk, &o.ds, &o.dt})
      t->dl()->device = DLDevice{kDLCUDA, 0};
    const auto check = [&](flatmem_status status) {  // right after the call: its message
      CHECK(status == (policy == FLATMEM_NONFINITE_ERROR ? FLATMEM_STATUS_UNSUPPORTED
                                                         : status_for_host_memory_labelled_cuda()));
      expect_refused(o, status, status, {"kDLCUDA"});
    };
    check(c.forward(h.get(), o));
    check(c.value_and_grad(h.get(), o));
    check(flatmem_contrastive_sigmoid_backward(h.get(), c.q.dl(), c.k.dl(), c.labels.dl(), c.scale.dl(),
                                               c.bias.dl(), nullptr, o.dq.dl(), o.dk.dl(), o.ds.dl(),
                                               o.dt.dl(), nullptr, 0, nullptr));
  }
}

// A ring handle (options.comm) with kDLCUDA tensors, decided before any value
// behind a device pointer (t, g) would be read on the host: in a build with
// the CUDA ring (CUDA and NCCL), INVALID_ARGUMENT naming options.comm, which
// has no device transport (flatmem_comm_init_device was not called); in any
// other build UNSUPPORTED naming q.
#ifdef FLATMEM_TEST_CUDA_RING
constexpr flatmem_status cuda_ring_refusal = FLATMEM_STATUS_INVALID_ARGUMENT;
constexpr const char *cuda_ring_names = "options.comm";
#else
constexpr flatmem_status cuda_ring_refusal = FLATMEM_STATUS_UNSUPPORTED;
constexpr const char *cuda_ring_names = "q";
#endif
TEST_CASE("contrastive/sigmoid/unsupported/kDLCUDA tensors with a communicator") {
  flatmem_comm_t *comm = nullptr;
  REQUIRE(flatmem_comm_create_local(&comm, 1, nullptr) == FLATMEM_STATUS_SUCCESS);
  {
    flatmem_contrastive_options o = make_options(FLATMEM_CONTRASTIVE_SIGMOID, 1, 0, 0, FLATMEM_NONFINITE_PROPAGATE);
    o.comm = comm;
    Handle h = create_handle(o);
    SigmoidCase c(small());
    SigmoidOutputs out = c.outputs();
    HostTensor g = HostTensor::scalar(Dtype::f32, 1.0);
    for (HostTensor *t : {&c.q, &c.k, &c.labels, &c.scale, &c.bias, &g, &out.loss, &out.dq, &out.dk, &out.ds, &out.dt})
      t->dl()->device = DLDevice{kDLCUDA, 0};
    expect_refused(out, c.forward(h.get(), out), cuda_ring_refusal, {cuda_ring_names});
    expect_refused(out, c.value_and_grad(h.get(), out), cuda_ring_refusal, {cuda_ring_names});
    expect_refused(out,
                   flatmem_contrastive_sigmoid_backward(h.get(), c.q.dl(), c.k.dl(), c.labels.dl(), c.scale.dl(),
                                                        c.bias.dl(), g.dl(), out.dq.dl(), out.dk.dl(),
                                                        out.ds.dl(), out.dt.dl(), nullptr, 0, nullptr),
                   cuda_ring_refusal, {cuda_ring_names});
  }
  flatmem_comm_destroy(comm);
}

TEST_CASE("contrastive/sigmoid/bad input/logit bias") {
  SigmoidCase c(small());
  Handle h = sigmoid_handle(1);
  for (double t : {nan_value, double(INFINITY), -double(INFINITY)}) {
    c.bias.set(0, t);
    expect_all_refused(c, h.get(), FLATMEM_STATUS_INVALID_ARGUMENT, {"logit_bias"});
  }
  c.bias = HostTensor::vector(Dtype::f32, 2);
  expect_all_refused(c, h.get(), FLATMEM_STATUS_INVALID_ARGUMENT, {"logit_bias"});
  SigmoidOutputs o = c.outputs();
  expect_refused(o,
                 flatmem_contrastive_sigmoid_forward(h.get(), c.q.dl(), c.k.dl(), c.labels.dl(), c.scale.dl(),
                                                     nullptr, o.loss.dl(), nullptr, 0, nullptr),
                 FLATMEM_STATUS_INVALID_ARGUMENT, {"logit_bias"});
}

TEST_CASE("contrastive/sigmoid/bad input/logit scale") {
  SigmoidCase c(small());
  Handle h = sigmoid_handle(1);
  for (double s : {0.0, -1.0, nan_value, double(INFINITY)}) {
    c.scale.set(0, s);
    expect_all_refused(c, h.get(), FLATMEM_STATUS_INVALID_ARGUMENT, {"logit_scale"});
  }
}

TEST_CASE("contrastive/sigmoid/bad input/labels and shapes") {
  Handle h = sigmoid_handle(1);
  {
    SigmoidCase c(small());
    c.labels.set(2, 7.0);  // c = 7
    expect_all_refused(c, h.get(), FLATMEM_STATUS_INVALID_ARGUMENT, {"labels[2]"});
    c.labels.set(2, -1.0);
    expect_all_refused(c, h.get(), FLATMEM_STATUS_INVALID_ARGUMENT, {"labels[2]"});
  }
  {
    SigmoidShape s = small(false);
    s.b = 7;
    s.c = 5;  // c < b without labels: row 5's positive would be column 5
    expect_all_refused(SigmoidCase(s), h.get(), FLATMEM_STATUS_INVALID_ARGUMENT, {"c >= b"});
  }
  {
    SigmoidCase c(small());
    c.k = HostTensor::matrix(Dtype::f32, 7, 4);  // d differs
    expect_all_refused(c, h.get(), FLATMEM_STATUS_INVALID_ARGUMENT, {"k:"});
  }
  {
    SigmoidCase c(small());
    c.k = HostTensor::matrix(Dtype::bf16, 7, 3);  // dtype differs
    expect_all_refused(c, h.get(), FLATMEM_STATUS_INVALID_ARGUMENT, {"dtype"});
  }
}

TEST_CASE("contrastive/sigmoid/bad input/outputs") {
  const SigmoidCase c(small());
  Handle h = sigmoid_handle(1);
  SigmoidOutputs o = c.outputs();
  expect_refused(o,
                 flatmem_contrastive_sigmoid_forward(h.get(), c.q.dl(), c.k.dl(), c.labels.dl(), c.scale.dl(),
                                                     c.bias.dl(), nullptr, nullptr, 0, nullptr),
                 FLATMEM_STATUS_INVALID_ARGUMENT, {"loss"});
  expect_refused(o, c.value_and_grad(h.get(), o, false, false, false, false, false),
                 FLATMEM_STATUS_INVALID_ARGUMENT, {"all NULL"});
  expect_refused(o,
                 flatmem_contrastive_sigmoid_backward(h.get(), c.q.dl(), c.k.dl(), c.labels.dl(), c.scale.dl(),
                                                      c.bias.dl(), nullptr, nullptr, nullptr, nullptr, nullptr,
                                                      nullptr, 0, nullptr),
                 FLATMEM_STATUS_INVALID_ARGUMENT, {"all NULL"});
  // a dq of the wrong shape, a dk of a third dtype
  HostTensor bad_dq = HostTensor::matrix(Dtype::f32, 4, 3);
  HostTensor bad_dk = HostTensor::matrix(Dtype::f16, 7, 3);
  expect_refused(o,
                 flatmem_contrastive_sigmoid_value_and_grad(h.get(), c.q.dl(), c.k.dl(), c.labels.dl(),
                                                            c.scale.dl(), c.bias.dl(), o.loss.dl(),
                                                            bad_dq.dl(), nullptr, nullptr, nullptr,
                                                            nullptr, 0, nullptr),
                 FLATMEM_STATUS_INVALID_ARGUMENT, {"dq"});
  expect_refused(o,
                 flatmem_contrastive_sigmoid_value_and_grad(h.get(), c.q.dl(), c.k.dl(), c.labels.dl(),
                                                            c.scale.dl(), c.bias.dl(), o.loss.dl(),
                                                            nullptr, bad_dk.dl(), nullptr, nullptr,
                                                            nullptr, 0, nullptr),
                 FLATMEM_STATUS_INVALID_ARGUMENT, {"dk"});
  HostTensor two = HostTensor::vector(Dtype::f32, 2);
  expect_refused(o,
                 flatmem_contrastive_sigmoid_value_and_grad(h.get(), c.q.dl(), c.k.dl(), c.labels.dl(),
                                                            c.scale.dl(), c.bias.dl(), nullptr, nullptr,
                                                            nullptr, nullptr, two.dl(), nullptr, 0,
                                                            nullptr),
                 FLATMEM_STATUS_INVALID_ARGUMENT, {"dlogit_bias"});
}

TEST_CASE("contrastive/sigmoid/bad input/non-finite features and dloss") {
  SigmoidCase c(small());
  c.q.set(1, 2, nan_value);
  Handle strict = sigmoid_handle(1);
  expect_all_refused(c, strict.get(), FLATMEM_STATUS_NON_FINITE, {"q", "(1, 2)"});
  // FLATMEM_NONFINITE_PROPAGATE: the NaN reaches the loss instead
  Handle lenient = sigmoid_handle(1, 0, 0, FLATMEM_NONFINITE_PROPAGATE);
  SigmoidOutputs o = c.outputs();
  REQUIRE(c.value_and_grad(lenient.get(), o) == FLATMEM_STATUS_SUCCESS);
  CHECK(std::isnan(o.loss.get(0)));
  CHECK(std::isnan(o.ds.get(0)));

  const SigmoidCase fine(small());
  SigmoidOutputs g = fine.outputs();
  expect_refused(g, fine.backward(strict.get(), nan_value, g), FLATMEM_STATUS_NON_FINITE, {"dloss"});
}

TEST_CASE("contrastive/sigmoid/workspace: the queried size suffices, one byte less is refused") {
  for (Dtype dtype : {Dtype::f32, Dtype::bf16}) {
    CAPTURE(dtype_name(dtype));
    SigmoidShape s = small();
    s.b = 37;
    s.c = 41;
    s.d = 9;
    s.dtype = s.grad_dtype = dtype;
    const SigmoidCase c(s);
    Handle h = sigmoid_handle(3, 16, 16);
    SigmoidOutputs want = c.outputs();
    REQUIRE(c.value_and_grad(h.get(), want) == FLATMEM_STATUS_SUCCESS);

    std::size_t bytes = 0;
    REQUIRE(flatmem_contrastive_sigmoid_workspace_size(h.get(), c.q.dl(), c.k.dl(), want.dq.dl(),
                                                       want.dk.dl(), &bytes) == FLATMEM_STATUS_SUCCESS);
    CHECK(bytes > 0);
    GuardedBuffer ws(bytes, 8);
    SigmoidOutputs o = c.outputs();
    REQUIRE(flatmem_contrastive_sigmoid_value_and_grad(h.get(), c.q.dl(), c.k.dl(), c.labels.dl(),
                                                       c.scale.dl(), c.bias.dl(), o.loss.dl(), o.dq.dl(),
                                                       o.dk.dl(), o.ds.dl(), o.dt.dl(), ws.data(),
                                                       ws.size(), nullptr) == FLATMEM_STATUS_SUCCESS);
    CHECK(ws.guards_intact());
    CHECK(o.loss.same_bits(want.loss));
    CHECK(o.dq.same_bits(want.dq));
    CHECK(o.dk.same_bits(want.dk));

    SigmoidOutputs refused = c.outputs();
    const flatmem_status status = flatmem_contrastive_sigmoid_value_and_grad(
        h.get(), c.q.dl(), c.k.dl(), c.labels.dl(), c.scale.dl(), c.bias.dl(), refused.loss.dl(),
        refused.dq.dl(), refused.dk.dl(), refused.ds.dl(), refused.dt.dl(), ws.data(), ws.size() - 1,
        nullptr);
    CHECK(status != FLATMEM_STATUS_SUCCESS);
    CHECK(untouched(refused));
  }
}
