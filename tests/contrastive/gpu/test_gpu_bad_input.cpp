// Refused input on kDLCUDA tensors: the documented status, a message naming
// the argument, and nothing written (outputs prefilled with sentinel bytes
// are read back unchanged). Also the CUDA-only rules of flatmem.h: the NaN
// scan policy, the required device workspace, host memory labelled kDLCUDA,
// mixed devices, and the values the host cannot check (label range, s),
// which turn into a NaN loss.
#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include "contrastive/gpu/gpu_call.hpp"
#include "support/random.hpp"

using namespace flatmem_test;

namespace {

// A valid symmetric call (b = 5, d = 3) on the device; tests break one argument.
struct DeviceFixture {
  explicit DeviceFixture(flatmem_nonfinite_policy policy = FLATMEM_NONFINITE_PROPAGATE,
                         flatmem_contrastive_loss kind = FLATMEM_CONTRASTIVE_SYMMETRIC)
      : symmetric(kind != FLATMEM_CONTRASTIVE_INFONCE) {
    flatmem_contrastive_options o = gpu_options(kind);
    o.nonfinite = policy;
    handle = create_handle(o);
    Random rng(3);
    q = HostTensor::matrix(Dtype::f32, 5, 3);
    k = HostTensor::matrix(Dtype::f32, symmetric ? 5 : 7, 3);
    fill_features(q, rng, 1.0, true);
    fill_features(k, rng, 1.0, true);
    scale = HostTensor::scalar(Dtype::f32, 10.0);
    loss = HostTensor::scalar(Dtype::f32, 0.0);
    loss.fill_bytes(sentinel_byte);
    row = HostTensor::vector(Dtype::f32, 5);
    col = HostTensor::vector(Dtype::f32, k.rows());
    dq = DeviceTensor(q);
    dk = DeviceTensor(k);
    dev = upload(q, k, nullptr, scale);
    dloss_host = HostTensor::scalar(Dtype::f32, 1.0);
    d_loss = DeviceTensor(loss);
    d_row = DeviceTensor(row);
    d_col = DeviceTensor(col);
  }
  flatmem_status forward(void *workspace, std::size_t bytes) {
    return flatmem_contrastive_forward(handle.get(), dev.q.dl(), dev.k.dl(), dev.labels_dl(), dev.scale.dl(),
                                       d_loss.dl(), d_row.dl(), symmetric ? d_col.dl() : nullptr, workspace, bytes,
                                       nullptr);
  }
  std::size_t forward_bytes() {
    std::size_t bytes = 0;
    REQUIRE(flatmem_contrastive_forward_workspace_size(handle.get(), dev.q.dl(), dev.k.dl(), &bytes) ==
            FLATMEM_STATUS_SUCCESS);
    return bytes;
  }
  void expect_untouched() {
    HostTensor back = HostTensor::scalar(Dtype::f32, 0.0);
    d_loss.download(back);
    CHECK_MESSAGE(back.all_bytes_are(sentinel_byte), "loss was written by a refused call");
  }

  bool symmetric;
  Handle handle;
  HostTensor q, k, scale, loss, row, col, dloss_host;
  DeviceInputs dev;
  DeviceTensor d_loss, d_row, d_col, dq, dk;
};

void expect_message(flatmem_status got, flatmem_status want, std::initializer_list<const char *> words) {
  CHECK_MESSAGE(got == want, describe(got));
  const std::string text = flatmem_last_error();
  for (const char *w : words) CHECK_MESSAGE(text.find(w) != std::string::npos, "'", w, "' not in: ", text);
}

}  // namespace

TEST_CASE("gpu/contrastive/bad-input/nonfinite-error-policy-is-unsupported-on-cuda") {
  DeviceFixture f(FLATMEM_NONFINITE_ERROR);
  std::size_t bytes = 0;
  expect_message(flatmem_contrastive_forward_workspace_size(f.handle.get(), f.dev.q.dl(), f.dev.k.dl(), &bytes),
                 FLATMEM_STATUS_UNSUPPORTED, {"q", "kDLCUDA", "FLATMEM_NONFINITE_PROPAGATE"});
  DeviceBuffer ws(1 << 20);
  expect_message(f.forward(ws.data(), ws.size()), FLATMEM_STATUS_UNSUPPORTED, {"q", "kDLCUDA"});
  f.expect_untouched();
}

TEST_CASE("gpu/contrastive/bad-input/workspace-null-is-refused") {
  DeviceFixture f;
  expect_message(f.forward(nullptr, 0), FLATMEM_STATUS_INVALID_ARGUMENT, {"workspace", "NULL", "kDLCUDA"});
  f.expect_untouched();
}

TEST_CASE("gpu/contrastive/bad-input/workspace-too-small") {
  DeviceFixture f;
  const std::size_t bytes = f.forward_bytes();
  DeviceBuffer ws(bytes);
  expect_message(f.forward(ws.data(), bytes - 1), FLATMEM_STATUS_WORKSPACE_TOO_SMALL, {"workspace"});
  f.expect_untouched();
}

TEST_CASE("gpu/contrastive/bad-input/workspace-in-host-memory") {
  DeviceFixture f;
  std::vector<unsigned char> host(f.forward_bytes());
  expect_message(f.forward(host.data(), host.size()), FLATMEM_STATUS_INVALID_ARGUMENT, {"workspace", "host memory"});
  f.expect_untouched();
}

TEST_CASE("gpu/contrastive/bad-input/host-memory-labelled-cuda") {
  DeviceFixture f;
  DLTensor q = *f.q.dl();
  q.device = {kDLCUDA, 0};  // host bytes
  DeviceBuffer ws(f.forward_bytes());
  const flatmem_status s = flatmem_contrastive_forward(f.handle.get(), &q, f.dev.k.dl(), nullptr, f.dev.scale.dl(),
                                                       f.d_loss.dl(), f.d_row.dl(), f.d_col.dl(), ws.data(),
                                                       ws.size(), nullptr);
  expect_message(s, FLATMEM_STATUS_INVALID_ARGUMENT, {"q", "host memory"});
  f.expect_untouched();
}

TEST_CASE("gpu/contrastive/bad-input/logit_scale-on-the-cpu-with-cuda-features") {
  DeviceFixture f;
  DeviceBuffer ws(f.forward_bytes());
  const flatmem_status s = flatmem_contrastive_forward(f.handle.get(), f.dev.q.dl(), f.dev.k.dl(), nullptr,
                                                       f.scale.dl(), f.d_loss.dl(), f.d_row.dl(), f.d_col.dl(),
                                                       ws.data(), ws.size(), nullptr);
  expect_message(s, FLATMEM_STATUS_INVALID_ARGUMENT, {"logit_scale", "device"});
  f.expect_untouched();
}

TEST_CASE("gpu/contrastive/bad-input/device-ids-differ") {
  DeviceFixture f;
  f.dev.k.dl()->device.device_id = 1;
  DeviceBuffer ws(1 << 16);
  expect_message(f.forward(ws.data(), ws.size()), FLATMEM_STATUS_INVALID_ARGUMENT, {"k", "device"});
  f.expect_untouched();
}

TEST_CASE("gpu/contrastive/bad-input/shape-and-dtype-checks-as-on-cpu") {
  DeviceFixture f;
  DeviceBuffer ws(1 << 16);
  f.dev.k.dl()->shape[1] = 2;  // d mismatch
  expect_message(f.forward(ws.data(), ws.size()), FLATMEM_STATUS_INVALID_ARGUMENT, {"k", "d = 2"});
  f.dev.k.dl()->shape[1] = 3;
  f.dev.q.dl()->dtype = {kDLFloat, 64, 1};
  expect_message(f.forward(ws.data(), ws.size()), FLATMEM_STATUS_INVALID_ARGUMENT, {"q", "dtype"});
  f.expect_untouched();
}

TEST_CASE("gpu/contrastive/bad-input/label-out-of-range-gives-nan-loss") {
  // The host cannot read device labels without a round trip (flatmem.h):
  // the kernels make the loss NaN instead.
  DeviceFixture f(FLATMEM_NONFINITE_PROPAGATE, FLATMEM_CONTRASTIVE_INFONCE);
  HostTensor labels = HostTensor::vector(Dtype::i64, 5);
  for (int i = 0; i < 5; ++i) labels.set(i, i);
  labels.set(3, 7);  // c = 7: out of range
  f.dev = upload(f.q, f.k, &labels, f.scale);
  const GpuForward out = gpu_forward(f.handle.get(), false, f.dev, 5, 7);
  CHECK(std::isnan(out.loss.get(0)));
}

TEST_CASE("gpu/contrastive/bad-input/logit_scale-zero-gives-nan-loss") {
  DeviceFixture f;
  f.scale.set(0, 0.0);
  f.dev = upload(f.q, f.k, nullptr, f.scale);
  const GpuForward out = gpu_forward(f.handle.get(), true, f.dev, 5, 5);
  CHECK(std::isnan(out.loss.get(0)));
}

TEST_CASE("gpu/contrastive/bad-input/nan-propagates") {
  DeviceFixture f;
  f.q.set(2, 1, std::nan(""));
  f.dev = upload(f.q, f.k, nullptr, f.scale);
  const GpuForward out = gpu_forward(f.handle.get(), true, f.dev, 5, 5);
  CHECK(std::isnan(out.loss.get(0)));
  CHECK(std::isnan(out.row_lse.get(2)));
}
