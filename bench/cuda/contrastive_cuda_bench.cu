// contrastive_cuda_bench: the symmetric CLIP loss, forward + backward, bf16,
// on one GPU, against baselines measured in the same run:
//   - flatmem's CUDA backend (flatmem_contrastive_forward + _backward with
//     dq, dk (bf16) and dlogit_scale), time per step and TFLOP/s counted on
//     the useful 8 b^2 d FLOPs;
//   - "4 GEMMs": four cuBLASLt bf16 GEMMs of b x b x d (the floor of any
//     exact loss: logits, recomputation-free backward); the b x b output does
//     not fit at large b, so the rate of a b x 8192 x d slice is measured and
//     the four full GEMMs' time is 8 b^2 d / rate;
//   - the naive materialised loss (naive_loss.cuh) where its 6 b^2 bytes fit.
// Memory: flatmem's beyond inputs and outputs is its workspace (it never
// allocates; the larger of the two workspace queries); the naive loss's is its
// b x b buffers. cudaMemGetInfo deltas around each are printed as a check.
//
// Usage: contrastive_cuda_bench [--quick]   (--quick: d = 512, b = 16384 only)
// Without a CUDA device it prints "no CUDA device" and exits 0.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <flatmem/flatmem.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "lt_gemm.hpp"
#include "naive_loss.cuh"

namespace {

#define CUDA_CHECK(call)                                                                        \
  do {                                                                                          \
    cudaError_t e_ = (call);                                                                    \
    if (e_ != cudaSuccess) {                                                                    \
      std::printf("CUDA error %s at %s:%d: %s\n", cudaGetErrorString(e_), __FILE__, __LINE__, #call); \
      std::exit(1);                                                                             \
    }                                                                                           \
  } while (0)

struct DeviceMemory {
  void *p = nullptr;
  explicit DeviceMemory(std::size_t bytes) { CUDA_CHECK(cudaMalloc(&p, std::max<std::size_t>(bytes, 1))); }
  ~DeviceMemory() { cudaFree(p); }
  template <typename T>
  T *as() const {
    return static_cast<T *>(p);
  }
};

std::size_t free_bytes() {
  std::size_t free = 0, total = 0;
  CUDA_CHECK(cudaMemGetInfo(&free, &total));
  return free;
}

// Median of `reps` timings of body() on `stream`, in seconds (one warm-up first).
template <typename Body>
double time_it(cudaStream_t stream, int reps, Body &&body) {
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  body();
  CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    CUDA_CHECK(cudaEventRecord(start, stream));
    body();
    CUDA_CHECK(cudaEventRecord(stop, stream));
    CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    t.push_back(ms * 1e-3);
  }
  std::sort(t.begin(), t.end());
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return t[t.size() / 2];
}

DLTensor tensor(void *data, int ndim, std::int64_t *shape, DLDataType dtype) {
  DLTensor t{};
  t.data = data;
  t.device = {kDLCUDA, 0};
  t.ndim = ndim;
  t.dtype = dtype;
  t.shape = shape;
  return t;
}

void require(flatmem_status s, const char *what) {
  if (s != FLATMEM_STATUS_SUCCESS) {
    std::printf("%s: %s: %s\n", what, flatmem_status_string(s), flatmem_last_error());
    std::exit(1);
  }
}

struct Row {
  int d = 0;
  std::int64_t b = 0;
  double flatmem_s = 0, gemm4_s = 0, naive_s = -1;
  double workspace_mb = 0, measured_delta_mb = 0, naive_mb = 0;
  float loss = 0;
};

Row run(int d, std::int64_t b, cudaStream_t stream, bench::LtGemm &lt, int reps) {
  Row row;
  row.d = d;
  row.b = b;
  const DLDataType bf16{kDLBfloat, 16, 1}, f32{kDLFloat, 32, 1};
  DeviceMemory q(std::size_t(b) * d * 2), k(std::size_t(b) * d * 2), dq(std::size_t(b) * d * 2),
      dk(std::size_t(b) * d * 2), scalars(64), row_lse(std::size_t(b) * 4), col_lse(std::size_t(b) * 4);
  bench::fill_features(q.as<__nv_bfloat16>(), b, d, 1u, stream);
  bench::fill_features(k.as<__nv_bfloat16>(), b, d, 2u, stream);
  const float scale = 14.3f;
  CUDA_CHECK(cudaMemcpy(scalars.as<float>(), &scale, 4, cudaMemcpyHostToDevice));
  std::int64_t mat[2] = {b, d}, vec[1] = {b};
  DLTensor Q = tensor(q.p, 2, mat, bf16), K = tensor(k.p, 2, mat, bf16), DQ = tensor(dq.p, 2, mat, bf16),
           DK = tensor(dk.p, 2, mat, bf16), RL = tensor(row_lse.p, 1, vec, f32),
           CL = tensor(col_lse.p, 1, vec, f32), S = tensor(scalars.as<float>(), 0, nullptr, f32),
           L = tensor(scalars.as<float>() + 1, 0, nullptr, f32), DS = tensor(scalars.as<float>() + 2, 0, nullptr, f32);

  // --- flatmem ---------------------------------------------------------------------
  flatmem_contrastive_options options = FLATMEM_CONTRASTIVE_OPTIONS_INIT;
  options.nonfinite = FLATMEM_NONFINITE_PROPAGATE;
  flatmem_contrastive_t *h = nullptr;
  require(flatmem_contrastive_create(&h, &options), "create");
  std::size_t fwd_bytes = 0, bwd_bytes = 0;
  require(flatmem_contrastive_forward_workspace_size(h, &Q, &K, &fwd_bytes), "forward size");
  require(flatmem_contrastive_backward_workspace_size(h, &Q, &K, &DQ, &DK, &bwd_bytes), "backward size");
  const std::size_t before = free_bytes();
  {
    DeviceMemory workspace(std::max(fwd_bytes, bwd_bytes));
    row.workspace_mb = double(std::max(fwd_bytes, bwd_bytes)) / 1048576.0;
    row.measured_delta_mb = double(before - free_bytes()) / 1048576.0;
    row.flatmem_s = time_it(stream, reps, [&] {
      require(flatmem_contrastive_forward(h, &Q, &K, nullptr, &S, &L, &RL, &CL, workspace.p, fwd_bytes, stream),
              "forward");
      require(flatmem_contrastive_backward(h, &Q, &K, nullptr, &S, &RL, &CL, nullptr, &DQ, &DK, &DS, workspace.p,
                                           bwd_bytes, stream),
              "backward");
    });
    CUDA_CHECK(cudaMemcpy(&row.loss, scalars.as<float>() + 1, 4, cudaMemcpyDeviceToHost));
  }
  flatmem_contrastive_destroy(h);

  // --- four cuBLASLt GEMMs, from the rate of a b x slice x d GEMM -------------------------
  const std::int64_t slice = std::min<std::int64_t>(b, 8192);
  {
    DeviceMemory c(std::size_t(b) * slice * 2);
    const double t = time_it(stream, reps, [&] {
      lt.run(bench::Layout::nt, b, slice, d, q.p, k.p, c.p, false, stream);
    });
    const double rate = 2.0 * double(b) * double(slice) * d / t;
    row.gemm4_s = 4.0 * 2.0 * double(b) * double(b) * d / rate;
  }

  // --- naive materialised loss where it fits -----------------------------------------------
  const std::size_t naive_bytes = std::size_t(b) * b * 6;
  if (naive_bytes < std::size_t(0.85 * double(free_bytes()))) {
    DeviceMemory logits(std::size_t(b) * b * 4), g(std::size_t(b) * b * 2);
    row.naive_mb = double(naive_bytes) / 1048576.0;
    row.naive_s = time_it(stream, reps, [&] {
      lt.run(bench::Layout::nt, b, b, d, q.p, k.p, logits.p, true, stream);
      bench::row_lse(logits.as<float>(), b, scale, row_lse.as<float>(), stream);
      bench::col_lse(logits.as<float>(), b, scale, col_lse.as<float>(), stream);
      bench::gradient_matrix(logits.as<float>(), b, scale, row_lse.as<float>(), col_lse.as<float>(),
                             g.as<__nv_bfloat16>(), stream);
      lt.run(bench::Layout::nn, b, d, b, g.p, k.p, dq.p, false, stream);
      lt.run(bench::Layout::tn, b, d, b, g.p, q.p, dk.p, false, stream);
    });
  }
  return row;
}

}  // namespace

int main(int argc, char **argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no CUDA device\n");
    return 0;
  }
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("contrastive_cuda_bench: symmetric loss, forward + backward (dq, dk bf16, ds), bf16, s = 14.3\n");
  std::printf("device: %s (sm_%d%d, %d SMs, %.1f GiB)\n", prop.name, prop.major, prop.minor,
              prop.multiProcessorCount, double(prop.totalGlobalMem) / 1073741824.0);
  std::printf("TFLOP/s counted on 8 b^2 d; 4-GEMM time from the measured cuBLASLt rate; memory beyond inputs and "
              "outputs\n\n");
  std::printf("%5s %7s | %10s %8s %9s | %10s %9s | %10s %9s %10s | %12s\n", "d", "b", "flatmem s", "TFLOP/s",
              "ws MiB", "4-GEMM s", "4GEMM/fm", "naive s", "naive/fm", "naive MiB", "loss");
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreate(&stream));
  bench::LtGemm lt;
  for (int d : {512, 768}) {
    for (std::int64_t b : {std::int64_t(16384), std::int64_t(65536), std::int64_t(262144)}) {
      if (quick && (d != 512 || b != 16384)) continue;
      const Row r = run(d, b, stream, lt, b >= 262144 ? 2 : 5);
      const double tflops = 8.0 * double(b) * double(b) * d / r.flatmem_s / 1e12;
      char naive[3][32] = {"-", "-", "-"};
      if (r.naive_s > 0) {
        std::snprintf(naive[0], 32, "%.4f", r.naive_s);
        std::snprintf(naive[1], 32, "%.2f", r.naive_s / r.flatmem_s);
        std::snprintf(naive[2], 32, "%.0f", r.naive_mb);
      }
      std::printf("%5d %7lld | %10.4f %8.1f %9.1f | %10.4f %9.2f | %10s %9s %10s | %12.6f\n", r.d, (long long)r.b,
                  r.flatmem_s, tflops, r.workspace_mb, r.gemm4_s, r.gemm4_s / r.flatmem_s, naive[0], naive[1],
                  naive[2], r.loss);
      std::printf("      (cudaMemGetInfo delta around the flatmem workspace: %.1f MiB)\n", r.measured_delta_mb);
      std::fflush(stdout);
    }
  }
  cudaStreamDestroy(stream);
  return 0;
}
