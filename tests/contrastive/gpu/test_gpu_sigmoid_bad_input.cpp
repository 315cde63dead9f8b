// Refused input of the sigmoid loss on kDLCUDA tensors (the CUDA-only rules,
// as test_gpu_bad_input.cpp checks them for the softmax losses): the
// documented status, a message naming the argument, and nothing written
// (device outputs prefilled with sentinel bytes read back unchanged). Host
// memory labelled kDLCUDA, a host tensor among device ones, the device
// workspace (NULL, too small, host memory; the query's size is enough), the
// NaN-scan policy; and the values the host cannot check (t, s, label range),
// which turn into NaN outputs instead.
#include <doctest/doctest.h>
#include <flatmem/flatmem.h>

#include <cmath>
#include <string>
#include <vector>

#include "contrastive/gpu/gpu_sigmoid.hpp"

using namespace flatmem_test;

namespace {

// A valid call (b = 5, c = 7, d = 3, labels) on the device; tests break one argument.
struct Fixture {
  SigmoidCase c{[] {
    SigmoidShape s;
    s.b = 5;
    s.c = 7;
    s.d = 3;
    s.labels = true;
    return s;
  }()};
  Handle h = gpu_sigmoid_handle();
  SigmoidOutputs host_out = c.outputs();
  DeviceSigmoidInputs in{c};
  DeviceSigmoidOutputs out{host_out};
  HostTensor g = HostTensor::scalar(Dtype::f32, 1.0);
  DeviceTensor d_g{g};
  std::size_t bytes = gpu_sigmoid_workspace(h.get(), in, out, true, true);
  DeviceBuffer workspace{bytes};

  flatmem_status call(SigmoidCall which, void *ws, std::size_t ws_bytes) {
    return gpu_sigmoid_raw(h.get(), which, {}, d_g.dl(), in, out, ws, ws_bytes);
  }
  flatmem_status call(SigmoidCall which) { return call(which, workspace.data(), workspace.size()); }

  // status and message of the last call, and no device output written
  void expect_refused(flatmem_status got, flatmem_status want, std::initializer_list<const char *> needles) {
    const std::string message = flatmem_last_error();
    INFO("status ", describe(got), ", message \"", message, "\"");
    CHECK(got == want);
    for (const char *needle : needles) CHECK_MESSAGE(message.find(needle) != std::string::npos, needle);
    SigmoidOutputs back = c.outputs();
    out.download(back);
    for (const HostTensor *t : {&back.loss, &back.dq, &back.dk, &back.ds, &back.dt})
      CHECK_MESSAGE(t->all_bytes_are(sentinel_byte), "an output was written by a refused call");
  }
  // All three calls refused the same way (with this workspace).
  void expect_all_refused_with(void *ws, std::size_t ws_bytes, flatmem_status want,
                               std::initializer_list<const char *> needles) {
    for (SigmoidCall which : {SigmoidCall::forward, SigmoidCall::value_and_grad, SigmoidCall::backward})
      expect_refused(call(which, ws, ws_bytes), want, needles);
  }
  void expect_all_refused(flatmem_status want, std::initializer_list<const char *> needles) {
    expect_all_refused_with(workspace.data(), workspace.size(), want, needles);
  }
};

// Host memory that says it is on CUDA device 0 (the tests put its DLTensor in a device one's place).
void label_host_as_cuda(HostTensor &host) { host.dl()->device = DLDevice{kDLCUDA, 0}; }

}  // namespace

TEST_CASE("gpu/sigmoid/bad input/host memory labelled kDLCUDA") {
  Fixture f;
  SUBCASE("q") {
    HostTensor q = HostTensor::matrix(f.c.q.dtype(), f.c.shape.b, f.c.shape.d);
    label_host_as_cuda(q);
    *f.in.q.dl() = *q.dl();
    f.expect_all_refused(FLATMEM_STATUS_INVALID_ARGUMENT, {"q", "host memory"});
  }
  SUBCASE("logit_bias") {
    HostTensor t = HostTensor::scalar(Dtype::f32, 0.0);
    label_host_as_cuda(t);
    *f.in.bias.dl() = *t.dl();
    f.expect_all_refused(FLATMEM_STATUS_INVALID_ARGUMENT, {"logit_bias", "host memory"});
  }
  SUBCASE("labels") {
    HostTensor l = HostTensor::vector(Dtype::i64, f.c.shape.b);
    label_host_as_cuda(l);
    *f.in.labels.dl() = *l.dl();
    f.expect_all_refused(FLATMEM_STATUS_INVALID_ARGUMENT, {"labels", "host memory"});
  }
  SUBCASE("dq") {
    HostTensor dq = HostTensor::matrix(Dtype::f32, f.c.shape.b, f.c.shape.d);
    label_host_as_cuda(dq);
    *f.out.dq.dl() = *dq.dl();
    f.expect_refused(f.call(SigmoidCall::value_and_grad), FLATMEM_STATUS_INVALID_ARGUMENT, {"dq", "host memory"});
  }
  SUBCASE("dloss") {
    HostTensor g = HostTensor::scalar(Dtype::f32, 1.0);
    label_host_as_cuda(g);
    f.expect_refused(gpu_sigmoid_raw(f.h.get(), SigmoidCall::backward, {}, g.dl(), f.in, f.out,
                                     f.workspace.data(), f.workspace.size()),
                     FLATMEM_STATUS_INVALID_ARGUMENT, {"dloss", "host memory"});
  }
}

TEST_CASE("gpu/sigmoid/bad input/mixed devices") {
  Fixture f;
  SUBCASE("logit_bias on the CPU") {
    HostTensor t = HostTensor::scalar(Dtype::f32, 0.0);
    *f.in.bias.dl() = *t.dl();
    f.expect_all_refused(FLATMEM_STATUS_INVALID_ARGUMENT, {"logit_bias", "device"});
  }
  SUBCASE("dloss on the CPU") {
    f.expect_refused(gpu_sigmoid_raw(f.h.get(), SigmoidCall::backward, {}, f.g.dl(), f.in, f.out,
                                     f.workspace.data(), f.workspace.size()),
                     FLATMEM_STATUS_INVALID_ARGUMENT, {"dloss", "device"});
  }
}

TEST_CASE("gpu/sigmoid/bad input/workspace") {
  Fixture f;
  // the forward's own size (no gradient buffers) and the gradient calls' size
  const std::size_t forward_bytes = gpu_sigmoid_workspace(f.h.get(), f.in, f.out, false, false);
  CHECK(forward_bytes <= f.bytes);
  SUBCASE("NULL") {
    f.expect_all_refused_with(nullptr, f.bytes, FLATMEM_STATUS_INVALID_ARGUMENT, {"workspace", "NULL"});
  }
  SUBCASE("one byte short") {
    f.expect_refused(f.call(SigmoidCall::forward, f.workspace.data(), forward_bytes - 1),
                     FLATMEM_STATUS_WORKSPACE_TOO_SMALL, {"workspace"});
    f.expect_refused(f.call(SigmoidCall::value_and_grad, f.workspace.data(), f.bytes - 1),
                     FLATMEM_STATUS_WORKSPACE_TOO_SMALL, {"workspace"});
    f.expect_refused(f.call(SigmoidCall::backward, f.workspace.data(), f.bytes - 1),
                     FLATMEM_STATUS_WORKSPACE_TOO_SMALL, {"workspace"});
  }
  SUBCASE("host memory") {
    std::vector<unsigned char> host(f.bytes);
    f.expect_all_refused_with(host.data(), host.size(), FLATMEM_STATUS_INVALID_ARGUMENT,
                              {"workspace", "host memory"});
  }
}

// What the host cannot read on CUDA (t, s, the label values) is checked on
// the device: a value the CPU path refuses makes the outputs NaN.
TEST_CASE("gpu/sigmoid/bad input/device values become NaN") {
  SigmoidShape s;
  s.b = 5;
  s.c = 7;
  s.d = 3;
  s.labels = true;
  Handle h = gpu_sigmoid_handle();
  const auto all_nan = [&](const SigmoidCase &c, bool whole_dq) {
    const SigmoidOutputs o = gpu_sigmoid(h.get(), c, SigmoidCall::value_and_grad);
    CHECK(std::isnan(o.loss.get(0)));
    CHECK(std::isnan(o.ds.get(0)));
    CHECK(std::isnan(o.dt.get(0)));
    CHECK(std::isnan(o.dq.get(0, 0)));  // row 0 is broken in every case
    if (whole_dq) CHECK(std::isnan(o.dq.get(s.b - 1, 0)));
  };
  SUBCASE("logit_bias inf") {
    SigmoidCase c(s);
    c.bias.set(0, INFINITY);
    all_nan(c, true);
  }
  SUBCASE("logit_bias NaN") {
    SigmoidCase c(s);
    c.bias.set(0, std::nan(""));
    all_nan(c, true);
  }
  SUBCASE("logit_scale <= 0") {
    SigmoidCase c(s);
    c.scale.set(0, -1.0);
    all_nan(c, true);
  }
  SUBCASE("label out of range") {
    SigmoidCase c(s);
    c.labels.set(0, double(s.c));
    all_nan(c, false);
    // the column pass reads labels[i] for column i = 0: every dk row sees it
    const SigmoidOutputs o = gpu_sigmoid(h.get(), c, SigmoidCall::value_and_grad);
    CHECK(std::isnan(o.dk.get(s.c - 1, 0)));
    CHECK(!std::isnan(o.dq.get(s.b - 1, 0)));  // other rows of dq keep their values
  }
}

TEST_CASE("gpu/sigmoid/bad input/nonfinite policy ERROR") {
  Fixture f;
  f.h = create_handle(make_options(FLATMEM_CONTRASTIVE_SIGMOID, 1, 0, 0, FLATMEM_NONFINITE_ERROR));
  f.expect_all_refused(FLATMEM_STATUS_UNSUPPORTED, {"nonfinite", "kDLCUDA"});
  std::size_t bytes = 12345;
  CHECK(flatmem_contrastive_sigmoid_workspace_size(f.h.get(), f.in.q.dl(), f.in.k.dl(), nullptr, nullptr,
                                                   &bytes) == FLATMEM_STATUS_UNSUPPORTED);
  CHECK(bytes == 12345);
}
