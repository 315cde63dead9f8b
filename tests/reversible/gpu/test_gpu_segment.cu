// Reversible segments on CUDA states (label gpu; skipped without a device):
// device callbacks y = tanh(x * w + b) per column, enqueued on the stream the
// context names, run through every mode; compared with the same toy run on
// the CPU (support/toy_reversible.hpp, elementwise variant, fp32) and with
// the double reference; OVERLAPPED bitwise == VANILLA on the device; bad
// input on device tensors.
#include <cuda_runtime_api.h>
#include <doctest/doctest.h>
#include <flatmem/flatmem.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "support/gpu.hpp"
#include "support/segment_run.hpp"
#include "support/toy_reversible.hpp"

using namespace flatmem_test;

namespace {

#define CUDA_OK(call) REQUIRE((call) == cudaSuccess)

// One device function: per-column w, b (float), accumulated dw, db (double).
struct DeviceToy {
  int width = 0;
  float *w = nullptr, *b = nullptr;
  double *dw = nullptr, *db = nullptr;
};

__global__ void toy_forward_kernel(DeviceToy f, const float *x, float *y, float *t, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x) {
    const int j = int(i % f.width);
    const float v = tanhf(x[i] * f.w[j] + f.b[j]);
    if (t) t[i] = v;
    y[i] = v;
  }
}

__global__ void toy_vjp_dx_kernel(DeviceToy f, const float *t, const float *dy, float *dx, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x) {
    const int j = int(i % f.width);
    dx[i] += dy[i] * (1.0f - t[i] * t[i]) * f.w[j];
  }
}

// One thread per column, rows in order: deterministic parameter gradients.
__global__ void toy_vjp_params_kernel(DeviceToy f, const float *x, const float *t, const float *dy,
                                      long long rows) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= f.width) return;
  double sw = 0, sb = 0;
  for (long long r = 0; r < rows; ++r) {
    const long long i = r * f.width + j;
    const double dz = double(dy[i] * (1.0f - t[i] * t[i]));
    sw += double(x[i]) * dz;
    sb += dz;
  }
  f.dw[j] += sw;
  f.db[j] += sb;
}

long long elements(const DLTensor *x) {
  long long n = 1;
  for (int i = 0; i < x->ndim; ++i) n *= x->shape[i];
  return n;
}

flatmem_status device_forward(void *user, const flatmem_reversible_context *ctx, const DLTensor *x,
                              DLTensor *y, void *residuals) {
  auto &f = *static_cast<DeviceToy *>(user);
  if (x->device.device_type != kDLCUDA) return FLATMEM_STATUS_INVALID_ARGUMENT;
  toy_forward_kernel<<<64, 256, 0, static_cast<cudaStream_t>(ctx->stream)>>>(
      f, static_cast<const float *>(x->data), static_cast<float *>(y->data),
      static_cast<float *>(residuals), elements(x));
  return cudaGetLastError() == cudaSuccess ? FLATMEM_STATUS_SUCCESS : FLATMEM_STATUS_INTERNAL;
}

flatmem_status device_vjp(void *user, const flatmem_reversible_context *ctx, const DLTensor *x,
                          const void *residuals, const DLTensor *dy, DLTensor *dx) {
  auto &f = *static_cast<DeviceToy *>(user);
  auto stream = static_cast<cudaStream_t>(ctx->stream);
  const long long n = elements(x);
  const auto *t = static_cast<const float *>(residuals);
  toy_vjp_params_kernel<<<(f.width + 127) / 128, 128, 0, stream>>>(
      f, static_cast<const float *>(x->data), t, static_cast<const float *>(dy->data), n / f.width);
  toy_vjp_dx_kernel<<<64, 256, 0, stream>>>(f, t, static_cast<const float *>(dy->data),
                                            static_cast<float *>(dx->data), n);
  return cudaGetLastError() == cudaSuccess ? FLATMEM_STATUS_SUCCESS : FLATMEM_STATUS_INTERNAL;
}

flatmem_status device_residual_size(void *, const flatmem_reversible_context *, const DLTensor *x,
                                    size_t *bytes) {
  *bytes = size_t(elements(x)) * sizeof(float);
  return FLATMEM_STATUS_SUCCESS;
}

// Device copies of a CPU ToySegment's (elementwise) parameters.
struct DeviceSegment {
  std::vector<DeviceToy> f, g;
  std::vector<flatmem_reversible_block> blocks;
  std::vector<DeviceBuffer> memory;

  explicit DeviceSegment(const ToySegment &host) {
    const std::size_t n = host.blocks.size();
    f.resize(n);
    g.resize(n);
    for (std::size_t k = 0; k < n; ++k)
      for (auto [dev, src] : {std::pair{&f[k], host.f[k].get()}, std::pair{&g[k], host.g[k].get()}}) {
        dev->width = src->width;
        dev->w = upload(src->weight);
        dev->b = upload(src->bias);
        dev->dw = zeros(src->width);
        dev->db = zeros(src->width);
      }
    for (std::size_t k = 0; k < n; ++k)
      blocks.push_back({{device_forward, device_vjp, device_residual_size, &f[k]},
                        {device_forward, device_vjp, device_residual_size, &g[k]}});
  }
  float *upload(const std::vector<double> &v) {
    std::vector<float> h(v.begin(), v.end());
    memory.emplace_back(h.size() * sizeof(float));
    CUDA_OK(cudaMemcpy(memory.back().data(), h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice));
    return static_cast<float *>(memory.back().data());
  }
  double *zeros(int n) {
    memory.emplace_back(std::size_t(n) * sizeof(double));
    CUDA_OK(cudaMemset(memory.back().data(), 0, std::size_t(n) * sizeof(double)));
    return static_cast<double *>(memory.back().data());
  }
  std::vector<double> read(const double *p, int n) {
    std::vector<double> h(static_cast<std::size_t>(n));
    CUDA_OK(cudaMemcpy(h.data(), p, h.size() * sizeof(double), cudaMemcpyDeviceToHost));
    return h;
  }
};

struct DeviceRun {
  HostTensor y1, y2, dx1, dx2, x1, x2;
  std::vector<std::vector<double>> dw_f, db_g;
};

DeviceRun run_on_device(const ToySegment &host, const SegmentInputs &in, flatmem_reversible_mode mode,
                        cudaStream_t stream) {
  DeviceSegment seg(host);
  const DeviceTensor x1(in.x1), x2(in.x2), dy1(in.dy1), dy2(in.dy2);
  DeviceRun run;
  for (HostTensor *t : {&run.y1, &run.y2, &run.dx1, &run.dx2, &run.x1, &run.x2})
    *t = HostTensor::matrix(Dtype::f32, in.x1.rows(), in.x1.cols());
  DeviceTensor y1(run.y1), y2(run.y2), dx1(run.dx1), dx2(run.dx2), rx1(run.x1), rx2(run.x2);
  flatmem_reversible_options o = FLATMEM_REVERSIBLE_OPTIONS_INIT;
  o.mode = mode;
  flatmem_reversible_t *h = nullptr;
  REQUIRE(flatmem_reversible_create(&h, seg.blocks.data(), int(seg.blocks.size()), &o) == FLATMEM_STATUS_SUCCESS);
  REQUIRE(flatmem_reversible_forward(h, x1.dl(), x2.dl(), 7, 11, y1.dl(), y2.dl(), nullptr, 0, stream) ==
          FLATMEM_STATUS_SUCCESS);
  REQUIRE(flatmem_reversible_backward(h, y1.dl(), y2.dl(), dy1.dl(), dy2.dl(), 7, 11, dx1.dl(), dx2.dl(),
                                      rx1.dl(), rx2.dl(), nullptr, 0, stream) == FLATMEM_STATUS_SUCCESS);
  CUDA_OK(cudaStreamSynchronize(stream));
  y1.download(run.y1), y2.download(run.y2), dx1.download(run.dx1), dx2.download(run.dx2);
  rx1.download(run.x1), rx2.download(run.x2);
  for (std::size_t k = 0; k < seg.blocks.size(); ++k) {
    run.dw_f.push_back(seg.read(seg.f[k].dw, seg.f[k].width));
    run.db_g.push_back(seg.read(seg.g[k].db, seg.g[k].width));
  }
  flatmem_reversible_destroy(h);
  return run;
}

double worst_relative(const std::vector<double> &got, const std::vector<double> &want) {
  double e = 0, m = 1;
  for (std::size_t i = 0; i < got.size(); ++i)
    e = std::max(e, std::fabs(got[i] - want[i])), m = std::max(m, std::fabs(want[i]));
  return e / m;
}

}  // namespace

TEST_CASE("gpu/reversible/modes match the double reference, overlapped == vanilla bitwise") {
  struct Shape { std::int64_t rows; int width, depth; };
  for (Shape shape : {Shape{1, 1, 1}, Shape{7, 13, 3}, Shape{197, 64, 12}, Shape{1031, 96, 5}}) {
    CAPTURE(shape.rows);
    CAPTURE(shape.depth);
    ToySegment host(shape.depth, shape.width, /*mixing=*/false, 5);
    const SegmentInputs in(Dtype::f32, shape.rows, shape.width, 3);
    const ReferenceResult ref = reference_segment(host, shape.rows, in.x1.values(), in.x2.values(),
                                                  in.dy1.values(), in.dy2.values(), 7, 11);
    cudaStream_t stream;
    CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    // Device tanhf and the elementwise fp32 chain: a few ulps per block.
    const double tol = 8.0 * shape.depth * 0x1.0p-24 * 16;
    DeviceRun vanilla = run_on_device(host, in, FLATMEM_REVERSIBLE_VANILLA, stream);
    for (auto mode : {FLATMEM_REVERSIBLE_STANDARD, FLATMEM_REVERSIBLE_VANILLA, FLATMEM_REVERSIBLE_OVERLAPPED,
                      FLATMEM_REVERSIBLE_AUTO}) {
      CAPTURE(int(mode));
      DeviceRun run = run_on_device(host, in, mode, stream);
      CHECK(worst_relative(run.y1.values(), ref.y1) < tol);
      CHECK(worst_relative(run.y2.values(), ref.y2) < tol);
      CHECK(worst_relative(run.dx1.values(), ref.dx1) < tol);
      CHECK(worst_relative(run.dx2.values(), ref.dx2) < tol);
      CHECK(worst_relative(run.x1.values(), in.x1.values()) < tol);
      for (int k = 0; k < shape.depth; ++k) {
        CHECK(worst_relative(run.dw_f[k], ref.d_weight_f[k]) < tol * std::sqrt(double(shape.rows)));
        CHECK(worst_relative(run.db_g[k], ref.d_bias_g[k]) < tol * std::sqrt(double(shape.rows)));
      }
      if (mode == FLATMEM_REVERSIBLE_OVERLAPPED || mode == FLATMEM_REVERSIBLE_AUTO) {
        CHECK(run.dx1.same_bits(vanilla.dx1));
        CHECK(run.dx2.same_bits(vanilla.dx2));
        CHECK(run.x1.same_bits(vanilla.x1));
        CHECK(run.dw_f == vanilla.dw_f);
        CHECK(run.db_g == vanilla.db_g);
      }
    }
    CUDA_OK(cudaStreamDestroy(stream));
  }
}

TEST_CASE("gpu/reversible/bad input on device tensors") {
  ToySegment host(2, 8, false, 1);
  DeviceSegment seg(host);
  const SegmentInputs in(Dtype::f32, 4, 8, 2);
  const DeviceTensor x1(in.x1), x2(in.x2);
  HostTensor out = HostTensor::matrix(Dtype::f32, 4, 8);
  DeviceTensor y1(out), y2(out);
  flatmem_reversible_t *h = nullptr;
  REQUIRE(flatmem_reversible_create(&h, seg.blocks.data(), 2, nullptr) == FLATMEM_STATUS_SUCCESS);
  // Mixed devices: a CPU output for CUDA inputs.
  CHECK(flatmem_reversible_forward(h, x1.dl(), x2.dl(), 0, 0, out.dl(), y2.dl(), nullptr, 0, nullptr) ==
        FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(std::string(flatmem_last_error()).find("y1: device") != std::string::npos);
  // A kDLCUDA tensor whose data is host memory.
  HostTensor host_data = HostTensor::matrix(Dtype::f32, 4, 8);
  host_data.dl()->device = DLDevice{kDLCUDA, 0};
  CHECK(flatmem_reversible_forward(h, host_data.dl(), x2.dl(), 0, 0, y1.dl(), y2.dl(), nullptr, 0, nullptr) ==
        FLATMEM_STATUS_INVALID_ARGUMENT);
  CHECK(std::string(flatmem_last_error()).find("x1") != std::string::npos);
  // rebuild_error is CPU-only.
  HostTensor errors = HostTensor::vector(Dtype::f64, 2);
  CHECK(flatmem_reversible_rebuild_error(h, x1.dl(), x2.dl(), 0, 0, errors.dl(), nullptr) ==
        FLATMEM_STATUS_UNSUPPORTED);
  flatmem_reversible_destroy(h);
}
