// contrastive_cuda_bench: the symmetric CLIP loss, forward + backward, and
// the sigmoid (SigLIP) loss, value_and_grad, bf16, on one GPU, against
// baselines measured in the same run. Symmetric loss:
//   - flatmem's CUDA backend (flatmem_contrastive_forward + _backward with
//     dq, dk (bf16) and dlogit_scale), time per step and TFLOP/s counted on
//     the useful 8 b^2 d FLOPs;
//   - "4 GEMMs": four cuBLASLt bf16 GEMMs of b x b x d (the floor of any
//     exact loss: logits, recomputation-free backward); the b x b output does
//     not fit at large b, so the rate of a b x 8192 x d slice is measured and
//     the four full GEMMs' time is 8 b^2 d / rate;
//   - the naive materialised loss (naive_loss.cuh) where its 6 b^2 bytes fit;
//   - "panels" rows: the same loss on the panel engine (src/contrastive/panels,
//     FLATMEM_CUDA_ENGINE=panels) at its default dial (<= 64 MiB) and at 1 GiB
//     (dk's fp32 accumulator resident: one sweep), its time over the tiles'
//     and its loss and ds beside theirs.
// Sigmoid loss (c = b, s = 10, t = -10, no labels), the same shapes:
//   - flatmem_contrastive_sigmoid_value_and_grad with loss, dq, dk (bf16), ds
//     and dt, TFLOP/s counted on the useful 6 b^2 d FLOPs (flatmem does 8:
//     its column pass recomputes the logits, see src/contrastive/cuda/
//     sigmoid_pass.cu);
//   - "3 GEMMs": logits, G k and G^T q, 6 b^2 d / rate (the same measured rate);
//   - the naive materialised sigmoid loss (naive_loss.cuh) where it fits.
// Memory: flatmem's beyond inputs and outputs is its workspace (it never
// allocates; the larger of the workspace queries); the naive loss's is its
// b x b buffers. cudaMemGetInfo deltas around each are printed as a check.
// Ring rows (ring/1): both losses again through a one-rank ring on this GPU
// (a communicator whose NCCL transport sends to the rank itself): the ring
// machinery's overhead over the plain call (issue target <= 1.05x) and the
// device memory the ring handle allocates for itself. "ring/1 sym panels":
// the ring's blocks on the panel engine (forced), against the plain call on
// the panels at the default dial.
//
// Usage: contrastive_cuda_bench [--quick | --shapes] [--d 768,512] [--b 16384,65536,262144]
//   (--shapes: the panel engine at forced extents, 64M and 1G dials, only)
//   (--quick: d = 512, b = 16384 only; --d / --b: the sweep, in that order, default as shown)
// Without a CUDA device it prints "no CUDA device" and exits 0.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <flatmem/flatmem.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
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

// One loss at one shape: flatmem's time, the GEMM floor's, the naive loss's (-1: did not fit).
struct Row {
  int d = 0;
  std::int64_t b = 0;
  double flatmem_s = 0, gemm_s = 0, naive_s = -1;
  double workspace_mb = 0, measured_delta_mb = 0, naive_mb = 0;
  float loss = 0, dscale = 0;
  double forward_s = 0;
  std::size_t backward_bytes = 0;  // the panel engine's backward workspace (dk resident or not)
};

// The device buffers of one shape, shared by both losses: q, k, dq, dk (bf16,
// b x d), fp32 scalars and two b-vectors, and their DLTensors.
struct Problem {
  std::int64_t b;
  int d;
  DeviceMemory q, k, dq, dk, scalars, row_lse, col_lse;
  std::int64_t mat[2], vec[1];
  DLTensor Q, K, DQ, DK, RL, CL;
  Problem(int d_, std::int64_t b_, cudaStream_t stream)
      : b(b_), d(d_), q(std::size_t(b) * d * 2), k(std::size_t(b) * d * 2), dq(std::size_t(b) * d * 2),
        dk(std::size_t(b) * d * 2), scalars(64), row_lse(std::size_t(b) * 4), col_lse(std::size_t(b) * 4),
        mat{b, d}, vec{b} {
    const DLDataType bf16{kDLBfloat, 16, 1}, f32{kDLFloat, 32, 1};
    bench::fill_features(q.as<__nv_bfloat16>(), b, d, 1u, stream);
    bench::fill_features(k.as<__nv_bfloat16>(), b, d, 2u, stream);
    Q = tensor(q.p, 2, mat, bf16);
    K = tensor(k.p, 2, mat, bf16);
    DQ = tensor(dq.p, 2, mat, bf16);
    DK = tensor(dk.p, 2, mat, bf16);
    RL = tensor(row_lse.p, 1, vec, f32);
    CL = tensor(col_lse.p, 1, vec, f32);
  }
  // fp32 scalar number i (0..15) of `scalars`, set to value (when given) on the device
  DLTensor scalar(int i) { return tensor(scalars.as<float>() + i, 0, nullptr, DLDataType{kDLFloat, 32, 1}); }
  void set_scalar(int i, float value) {
    CUDA_CHECK(cudaMemcpy(scalars.as<float>() + i, &value, 4, cudaMemcpyHostToDevice));
  }
  float get_scalar(int i) const {
    float v = 0;
    CUDA_CHECK(cudaMemcpy(&v, scalars.as<float>() + i, 4, cudaMemcpyDeviceToHost));
    return v;
  }
};

// FLOP/s of cuBLASLt's bf16 b x slice x d "nt" GEMM (the logits' shape): the
// rate the GEMM floors are computed from (the b x b output does not fit at large b).
double gemm_rate(Problem &p, cudaStream_t stream, bench::LtGemm &lt, int reps) {
  const std::int64_t slice = std::min<std::int64_t>(p.b, 8192);
  DeviceMemory c(std::size_t(p.b) * slice * 2);
  const double t = time_it(stream, reps, [&] {
    lt.run(bench::Layout::nt, p.b, slice, p.d, p.q.p, p.k.p, c.p, false, stream);
  });
  return 2.0 * double(p.b) * double(slice) * p.d / t;
}

// Whether the naive loss's b x b buffers (6 b^2 bytes) fit.
bool naive_fits(std::int64_t b) {
  return std::size_t(b) * b * 6 < std::size_t(0.85 * double(free_bytes()));
}

// flatmem's symmetric loss, forward + backward, on the engine `engine`
// (FLATMEM_CUDA_ENGINE: tiles or panels) with the panel dial `dial`
// (FLATMEM_CUDA_PANEL_BYTES, "" = default), both read when the handle is created.
void time_flatmem(Problem &p, const char *engine, const char *dial, cudaStream_t stream, int reps, Row &row,
                  const char *shape = "") {
  setenv("FLATMEM_CUDA_ENGINE", engine, 1);
  setenv("FLATMEM_CUDA_PANEL_BYTES", dial, 1);
  setenv("FLATMEM_CUDA_PANEL_SHAPE", shape, 1);
  p.set_scalar(0, 14.3f);
  DLTensor &Q = p.Q, &K = p.K, &DQ = p.DQ, &DK = p.DK, &RL = p.RL, &CL = p.CL;
  DLTensor S = p.scalar(0), L = p.scalar(1), DS = p.scalar(2);
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
    row.backward_bytes = bwd_bytes;
    row.measured_delta_mb = double(before - free_bytes()) / 1048576.0;
    row.flatmem_s = time_it(stream, reps, [&] {
      require(flatmem_contrastive_forward(h, &Q, &K, nullptr, &S, &L, &RL, &CL, workspace.p, fwd_bytes, stream),
              "forward");
      require(flatmem_contrastive_backward(h, &Q, &K, nullptr, &S, &RL, &CL, nullptr, &DQ, &DK, &DS, workspace.p,
                                           bwd_bytes, stream),
              "backward");
    });
    row.loss = p.get_scalar(1);
    row.dscale = p.get_scalar(2);
    row.forward_s = time_it(stream, reps, [&] {
      require(flatmem_contrastive_forward(h, &Q, &K, nullptr, &S, &L, &RL, &CL, workspace.p, fwd_bytes, stream),
              "forward");
    });
  }
  flatmem_contrastive_destroy(h);
  unsetenv("FLATMEM_CUDA_ENGINE");
  unsetenv("FLATMEM_CUDA_PANEL_BYTES");
  unsetenv("FLATMEM_CUDA_PANEL_SHAPE");
}

// The cuBLASLt GEMMs the panel walk issues, timed alone at one panel's shape
// (R x C x d, bf16 operands, fp32 outputs), so that a --shapes row splits
// into the GEMMs' time and the rest (the passes, launches and host work):
// per panel the forward's logits (nt), and per backward sweep the logits
// again with Gt K_J (nn, dq) and / or Gt^T Q_I (tn, dk).
struct PanelGemms {
  double logits_s = 0, gt_k_s = 0, gt_q_s = 0;  // one GEMM each, median
};

PanelGemms time_panel_gemms(Problem &p, std::int64_t rows, std::int64_t cols, cudaStream_t stream, bench::LtGemm &lt) {
  constexpr int batch = 8;  // GEMMs per timing: the host enqueues ahead of the GPU
  const int d = p.d;
  DeviceMemory logits(std::size_t(rows) * cols * 4), gt(std::size_t(rows) * cols * 2),
      acc(std::size_t(std::max(rows, cols)) * d * 4);
  CUDA_CHECK(cudaMemsetAsync(gt.p, 0x3c, std::size_t(rows) * cols * 2, stream));  // bf16 0x3c3c, about 0.0115
  const auto each = [&](auto &&gemm) {
    return time_it(stream, 3, [&] {
             for (int i = 0; i < batch; ++i) gemm();
           }) /
           batch;
  };
  PanelGemms t;
  t.logits_s = each([&] { lt.run(bench::Layout::nt, rows, cols, d, p.q.p, p.k.p, logits.p, true, stream); });
  t.gt_k_s = each([&] { lt.run(bench::Layout::nn, rows, d, cols, gt.p, p.k.p, acc.p, true, stream); });
  t.gt_q_s = each([&] { lt.run(bench::Layout::tn, cols, d, rows, gt.p, p.q.p, acc.p, true, stream); });
  return t;
}

// --shapes: the panel engine at forced panel extents, with dk in a sweep of its
// own (dial 64M) and resident (dial 1G), against the four GEMMs' time: which
// extents the planner should prefer. Each row also gives the walk's GEMMs
// timed alone at that panel shape ("GEMMs@panel") and the rest of the step
// (total - GEMMs@panel: the passes, launches and host work).
void sweep_shapes(int d, std::int64_t b, cudaStream_t stream, bench::LtGemm &lt) {
  Problem p(d, b, stream);
  const double rate = gemm_rate(p, stream, lt, 5);
  const double gemm_s = 8.0 * double(b) * double(b) * d / rate;
  std::printf("shapes d=%d b=%lld: 4 GEMMs %.4f s (rate %.1f TFLOP/s)\n", d, (long long)b, gemm_s, rate / 1e12);
  std::printf("%-8s %-12s | %10s %10s %9s %9s | %6s %12s %9s %9s\n", "dial", "panel", "fwd+bwd s", "fwd s",
              "GEMMs/fm", "ws MiB", "sweeps", "GEMMs@panel", "rest s", "P TFLOP/s");
  for (const char *dial : {"64M", "1G"})
    for (const char *shape : {"2048x1024", "2048x2048", "4096x2048", "4096x4096", "8192x4096", "16384x8192"}) {
      Row row;
      time_flatmem(p, "panels", dial, stream, 5, row, shape);
      long long r = 0, c = 0;
      std::sscanf(shape, "%lldx%lld", &r, &c);
      const std::int64_t rows = std::min<std::int64_t>(b, r), cols = std::min<std::int64_t>(b, c);
      const double panels = double((b + rows - 1) / rows) * double((b + cols - 1) / cols);
      // dk resident (one backward sweep) when the backward workspace holds a b x d fp32 accumulator.
      const bool resident = row.backward_bytes >= std::size_t(4) * (std::size_t(rows) * cols + std::size_t(b) * d);
      const PanelGemms g = time_panel_gemms(p, rows, cols, stream, lt);
      const double at_panel = panels * ((resident ? 2 : 3) * g.logits_s + g.gt_k_s + g.gt_q_s);
      std::printf("%-8s %-12s | %10.4f %10.4f %9.3f %9.1f | %6d %12.4f %9.4f %9.1f   loss %.6f\n", dial, shape,
                  row.flatmem_s, row.forward_s, gemm_s / row.flatmem_s, row.workspace_mb, resident ? 1 : 2, at_panel,
                  row.flatmem_s - at_panel, 2.0 * double(rows) * double(cols) * d / g.logits_s / 1e12, row.loss);
      std::fflush(stdout);
    }
}

Row run(Problem &p, double rate, cudaStream_t stream, bench::LtGemm &lt, int reps, const char *engine = "tiles",
        const char *dial = "", bool with_naive = true) {
  Row row;
  const std::int64_t b = p.b;
  const int d = p.d;
  row.d = d;
  row.b = b;
  DeviceMemory &q = p.q, &k = p.k, &dq = p.dq, &dk = p.dk, &row_lse = p.row_lse, &col_lse = p.col_lse;
  const float scale = 14.3f;
  time_flatmem(p, engine, dial, stream, reps, row);

  // --- four cuBLASLt GEMMs, from the measured rate -------------------------------------------
  row.gemm_s = 4.0 * 2.0 * double(b) * double(b) * d / rate;

  // --- naive materialised loss where it fits -----------------------------------------------
  if (with_naive && naive_fits(b)) {
    DeviceMemory logits(std::size_t(b) * b * 4), g(std::size_t(b) * b * 2);
    row.naive_mb = double(std::size_t(b) * b * 6) / 1048576.0;
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

// The sigmoid loss at the problem's shape (c = b, no labels): flatmem's
// value_and_grad (loss, dq, dk, ds, dt), three GEMMs' time, the naive loss.
Row run_sigmoid(Problem &p, double rate, cudaStream_t stream, bench::LtGemm &lt, int reps,
                const char *engine = "tiles", const char *dial = "", bool with_naive = true) {
  setenv("FLATMEM_CUDA_ENGINE", engine, 1);
  setenv("FLATMEM_CUDA_PANEL_BYTES", dial, 1);
  Row row;
  const std::int64_t b = p.b;
  const int d = p.d;
  row.d = d;
  row.b = b;
  const float scale = 10.0f, bias = -10.0f;
  p.set_scalar(4, scale);
  p.set_scalar(5, bias);
  DLTensor S = p.scalar(4), T = p.scalar(5), L = p.scalar(6), DS = p.scalar(7), DT = p.scalar(8);

  // --- flatmem ---------------------------------------------------------------------
  flatmem_contrastive_options options = FLATMEM_CONTRASTIVE_OPTIONS_INIT;
  options.loss = FLATMEM_CONTRASTIVE_SIGMOID;
  options.nonfinite = FLATMEM_NONFINITE_PROPAGATE;
  flatmem_contrastive_t *h = nullptr;
  require(flatmem_contrastive_create(&h, &options), "create (sigmoid)");
  std::size_t bytes = 0;
  require(flatmem_contrastive_sigmoid_workspace_size(h, &p.Q, &p.K, &p.DQ, &p.DK, &bytes), "sigmoid size");
  const std::size_t before = free_bytes();
  {
    DeviceMemory workspace(bytes);
    row.workspace_mb = double(bytes) / 1048576.0;
    row.measured_delta_mb = double(before - free_bytes()) / 1048576.0;
    row.flatmem_s = time_it(stream, reps, [&] {
      require(flatmem_contrastive_sigmoid_value_and_grad(h, &p.Q, &p.K, nullptr, &S, &T, &L, &p.DQ, &p.DK, &DS,
                                                         &DT, workspace.p, bytes, stream),
              "sigmoid value_and_grad");
    });
    row.loss = p.get_scalar(6);
  }
  flatmem_contrastive_destroy(h);
  unsetenv("FLATMEM_CUDA_ENGINE");
  unsetenv("FLATMEM_CUDA_PANEL_BYTES");

  // --- three cuBLASLt GEMMs (logits, G k, G^T q), from the measured rate -------------------
  row.gemm_s = 3.0 * 2.0 * double(b) * double(b) * d / rate;

  // --- naive materialised sigmoid loss where it fits (its loss partials are left unsummed) ---
  if (with_naive && naive_fits(b)) {
    DeviceMemory logits(std::size_t(b) * b * 4), g(std::size_t(b) * b * 2),
        partial(std::size_t(bench::sigmoid_partials(b)) * 4);
    row.naive_mb = double(std::size_t(b) * b * 6) / 1048576.0;
    row.naive_s = time_it(stream, reps, [&] {
      lt.run(bench::Layout::nt, b, b, d, p.q.p, p.k.p, logits.p, true, stream);
      bench::sigmoid_gradient_matrix(logits.as<float>(), b, scale, bias, g.as<__nv_bfloat16>(),
                                     partial.as<float>(), stream);
      lt.run(bench::Layout::nn, b, d, b, g.p, p.k.p, p.dq.p, false, stream);
      lt.run(bench::Layout::tn, b, d, b, g.p, p.q.p, p.dk.p, false, stream);
    });
  }
  return row;
}

// The ring machinery's overhead: the same loss through a handle with a
// one-rank communicator whose NCCL transport is on this GPU (the ring
// schedule, the per-block kernels, the relayed states / partial dk through
// NCCL to the rank itself, the agreement and the end-of-call
// synchronisation), against the plain call above. The handle's own device
// memory (the ring takes no workspace) is measured with cudaMemGetInfo.
struct RingRow {
  double seconds = 0, handle_mb = 0;
  float loss = 0;
};

// engine: FLATMEM_CUDA_ENGINE for the ring's handle ("" = the default, the tiles).
RingRow run_ring(Problem &p, bool sigmoid, flatmem_comm_t *comm, cudaStream_t stream, int reps,
                 const char *engine = "") {
  RingRow row;
  flatmem_contrastive_options options = FLATMEM_CONTRASTIVE_OPTIONS_INIT;
  options.loss = sigmoid ? FLATMEM_CONTRASTIVE_SIGMOID : FLATMEM_CONTRASTIVE_SYMMETRIC;
  options.nonfinite = FLATMEM_NONFINITE_PROPAGATE;
  options.comm = comm;
  flatmem_contrastive_t *h = nullptr;
  setenv("FLATMEM_CUDA_ENGINE", engine, 1);  // read by the create
  require(flatmem_contrastive_create(&h, &options), "create (ring)");
  unsetenv("FLATMEM_CUDA_ENGINE");
  p.set_scalar(sigmoid ? 4 : 0, sigmoid ? 10.0f : 14.3f);
  p.set_scalar(5, -10.0f);
  DLTensor S = p.scalar(sigmoid ? 4 : 0), T = p.scalar(5), L = p.scalar(9), DS = p.scalar(10), DT = p.scalar(11);
  const auto step = [&] {
    if (sigmoid)
      require(flatmem_contrastive_sigmoid_value_and_grad(h, &p.Q, &p.K, nullptr, &S, &T, &L, &p.DQ, &p.DK, &DS, &DT,
                                                         nullptr, 0, stream),
              "ring sigmoid value_and_grad");
    else {
      require(flatmem_contrastive_forward(h, &p.Q, &p.K, nullptr, &S, &L, &p.RL, &p.CL, nullptr, 0, stream),
              "ring forward");
      require(flatmem_contrastive_backward(h, &p.Q, &p.K, nullptr, &S, &p.RL, &p.CL, nullptr, &p.DQ, &p.DK, &DS,
                                           nullptr, 0, stream),
              "ring backward");
    }
  };
  const std::size_t before = free_bytes();
  step();  // the handle's buffers are allocated at the first calls
  CUDA_CHECK(cudaStreamSynchronize(stream));
  row.handle_mb = double(before - free_bytes()) / 1048576.0;
  row.seconds = time_it(stream, reps, step);
  row.loss = p.get_scalar(9);
  flatmem_contrastive_destroy(h);
  return row;
}

void print_ring_row(const char *loss, const Problem &p, const RingRow &r, const Row &plain) {
  std::printf("%-9s %5d %7lld | %10.4f  ring/plain %.3f  handle memory %.1f MiB | value %.6f (plain %.6f)\n", loss,
              p.d, (long long)p.b, r.seconds, r.seconds / plain.flatmem_s, r.handle_mb, r.loss, plain.loss);
  std::fflush(stdout);
}

// One table line: flatmem's time and rate (on `useful_flops`), the GEMM floor, the naive loss.
void print_row(const char *loss, const Row &r, double useful_flops) {
  const double tflops = useful_flops / r.flatmem_s / 1e12;
  char naive[3][32] = {"-", "-", "-"};
  if (r.naive_s > 0) {
    std::snprintf(naive[0], 32, "%.4f", r.naive_s);
    std::snprintf(naive[1], 32, "%.2f", r.naive_s / r.flatmem_s);
    std::snprintf(naive[2], 32, "%.0f", r.naive_mb);
  }
  std::printf("%-9s %5d %7lld | %10.4f %8.1f %9.1f | %10.4f %9.2f | %10s %9s %10s | %12.6f\n", loss, r.d,
              (long long)r.b, r.flatmem_s, tflops, r.workspace_mb, r.gemm_s, r.gemm_s / r.flatmem_s, naive[0], naive[1], naive[2],
              r.loss);
  std::printf("      (cudaMemGetInfo delta around the flatmem workspace: %.1f MiB)\n", r.measured_delta_mb);
  std::fflush(stdout);
}

void print_header() {
  std::printf("%-9s %5s %7s | %10s %8s %9s | %10s %9s | %10s %9s %10s | %12s\n", "loss", "d", "b", "flatmem s",
              "TFLOP/s", "ws MiB", "GEMMs s", "GEMMs/fm", "naive s", "naive/fm", "naive MiB", "value");
}

}  // namespace

int main(int argc, char **argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no CUDA device\n");
    return 0;
  }
  // --quick: d 512, b 16384 only. --d LIST / --b LIST (comma-separated): the sweep, in that order
  // (default d 768 then 512 -- the issue's shape first, so a run cut off early still has it).
  std::vector<int> dims = {768, 512};
  std::vector<std::int64_t> batches = {16384, 65536, 262144};
  bool shapes = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--shapes") {
      shapes = true;
    } else if (a == "--quick") {
      dims = {512};
      batches = {16384};
    } else if ((a == "--d" || a == "--b") && i + 1 < argc) {
      std::vector<std::int64_t> list;
      for (const char *c = argv[++i]; *c;) {
        char *end = nullptr;
        const long long v = std::strtoll(c, &end, 10);
        if (end == c || v < 1 || v > (a == "--d" ? 65536 : (1LL << 40))) {
          std::fprintf(stderr, "contrastive_cuda_bench: bad %s list '%s'\n", a.c_str(), argv[i]);
          return 2;
        }
        list.push_back(v);
        c = *end == ',' ? end + 1 : end;
      }
      if (a == "--d") dims.assign(list.begin(), list.end());
      else batches = list;
    } else {
      std::fprintf(stderr, "usage: contrastive_cuda_bench [--quick | --shapes] [--d 768,512] [--b 16384,65536,262144]\n");
      return 2;
    }
  }
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("contrastive_cuda_bench: bf16; symmetric loss, forward + backward (dq, dk bf16, ds), s = 14.3; "
              "sigmoid loss, value_and_grad (loss, dq, dk bf16, ds, dt), s = 10, t = -10\n");
  std::printf("device: %s (sm_%d%d, %d SMs, %.1f GiB)\n", prop.name, prop.major, prop.minor,
              prop.multiProcessorCount, double(prop.totalGlobalMem) / 1073741824.0);
  std::printf("TFLOP/s counted on 8 b^2 d (symmetric) and 6 b^2 d (sigmoid); GEMMs: 4 (symmetric) or 3 "
              "(sigmoid) cuBLASLt GEMMs' time from the measured rate; memory beyond inputs and outputs\n\n");
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreate(&stream));
  bench::LtGemm lt;
  if (shapes) {  // --shapes: the panel extents sweep only, at each --d and --b
    for (int d : dims)
      for (std::int64_t b : batches) sweep_shapes(d, b, stream, lt);
    cudaStreamDestroy(stream);
    return 0;
  }
  // The ring rows' one-rank communicator with its NCCL transport on this GPU.
  flatmem_comm_t *comm = nullptr;
  require(flatmem_comm_create_local(&comm, 1, nullptr), "flatmem_comm_create_local");
  if (flatmem_comm_init_device(comm, 0, 0) != FLATMEM_STATUS_SUCCESS) {
    std::printf("ring rows skipped: flatmem_comm_init_device: %s\n\n", flatmem_last_error());
    flatmem_comm_destroy(comm);
    comm = nullptr;
  }
  print_header();
  std::printf("ring/1 rows: the same loss through a one-rank ring (NCCL to itself); ring/plain: its time "
              "over the plain call's (target <= 1.05)\n");
  for (int d : dims) {
    for (std::int64_t b : batches) {
      const int reps = b >= 262144 ? 2 : 5;
      Problem p(d, b, stream);
      const double rate = gemm_rate(p, stream, lt, reps);
      const Row symmetric = run(p, rate, stream, lt, reps);
      print_row("symmetric", symmetric, 8.0 * double(b) * double(b) * d);
      // The panel engine at its default dial and at a large one (dk's accumulator resident).
      Row panels_default;
      for (const char *dial : {"", "1G"}) {
        const Row panels = run(p, rate, stream, lt, reps, "panels", dial, false);
        if (!dial[0]) panels_default = panels;
        char label[32];
        std::snprintf(label, sizeof label, "panels%s%s", dial[0] ? "/" : "", dial);
        print_row(label, panels, 8.0 * double(b) * double(b) * d);
        std::printf("      (panels/tiles time %.3f; loss %.6f vs %.6f, ds %.6g vs %.6g)\n",
                    panels.flatmem_s / symmetric.flatmem_s, panels.loss, symmetric.loss, panels.dscale,
                    symmetric.dscale);
      }
      if (comm) print_ring_row("ring/1 sym", p, run_ring(p, false, comm, stream, reps), symmetric);
      if (comm)
        print_ring_row("ring/1 sym panels", p, run_ring(p, false, comm, stream, reps, "panels"), panels_default);
      const Row sigmoid = run_sigmoid(p, rate, stream, lt, reps);
      print_row("sigmoid", sigmoid, 6.0 * double(b) * double(b) * d);
      // The sigmoid loss on the panel engine (forced: its default is still the tiles).
      for (const char *dial : {"", "1G"}) {
        const Row panels = run_sigmoid(p, rate, stream, lt, reps, "panels", dial, false);
        char label[32];
        std::snprintf(label, sizeof label, "sig panels%s%s", dial[0] ? "/" : "", dial);
        print_row(label, panels, 6.0 * double(b) * double(b) * d);
        std::printf("      (sigmoid panels/tiles time %.3f; loss %.6f vs %.6f)\n", panels.flatmem_s / sigmoid.flatmem_s,
                    panels.loss, sigmoid.loss);
      }
      if (comm) print_ring_row("ring/1 sig", p, run_ring(p, true, comm, stream, reps), sigmoid);
    }
  }
  if (comm) flatmem_comm_destroy(comm);
  cudaStreamDestroy(stream);
  return 0;
}
