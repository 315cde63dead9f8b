// The timed variants of contrastive_bench (see contrastive_variants.hpp).
#include "contrastive_variants.hpp"

#include <cblas.h>

#include "core/gemm/sgemm.hpp"
#include <flatmem/flatmem.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>

#include "bench_support.hpp"

// OpenBLAS extensions, weak so that the benchmark also links against another CBLAS.
extern "C" {
int openblas_get_num_threads(void) __attribute__((weak));
int openblas_get_parallel(void) __attribute__((weak));
char *openblas_get_config(void) __attribute__((weak));
char *openblas_get_corename(void) __attribute__((weak));
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define BENCH_SIMD_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define BENCH_SIMD_CLONES
#endif

namespace bench {

int blas_threads() { return openblas_get_num_threads ? openblas_get_num_threads() : -1; }
int blas_parallel() { return openblas_get_parallel ? openblas_get_parallel() : -1; }
std::string blas_config() {
  if (!openblas_get_config) return "not OpenBLAS";
  return std::string(openblas_get_config()) + " (core " + openblas_get_corename() + ")";
}

namespace {

using Matrix = std::unique_ptr<float[]>;

Matrix allocate(std::int64_t rows, std::int64_t cols) {
  Matrix m(new float[std::size_t(rows) * std::size_t(cols)]);
  touch(m.get(), std::size_t(rows) * std::size_t(cols) * sizeof(float));
  return m;
}

using Bf16Matrix = std::unique_ptr<std::uint16_t[]>;

Bf16Matrix allocate_bf16(std::int64_t rows, std::int64_t cols) {
  Bf16Matrix m(new std::uint16_t[std::size_t(rows) * std::size_t(cols)]);
  touch(m.get(), std::size_t(rows) * std::size_t(cols) * sizeof(std::uint16_t));
  return m;
}

bool is_bf16(const std::string &dtype) {
  if (dtype == "bf16") return true;
  if (dtype == "fp32") return false;
  throw std::runtime_error("dtype '" + dtype + "': expected fp32 or bf16");
}

// q, k filled; dq, dk touched. Every variant starts from exactly this.
// bf16: q, k hold the features rounded to bf16 (exactly representable in fp32),
// qh, kh their bf16 bits, dqh, dkh the bf16 gradients; dq, dk are not allocated.
struct Features {
  std::int64_t b, d;
  Matrix q, k, dq, dk;
  Bf16Matrix qh, kh, dqh, dkh;
  Features(std::int64_t b_, std::int64_t d_, std::uint64_t seed, const std::string &dtype = "fp32")
      : b(b_), d(d_) {
    const bool bf16 = is_bf16(dtype);
    q = allocate(b, d);
    k = allocate(b, d);
    if (!bf16) {
      dq = allocate(b, d);
      dk = allocate(b, d);
    }
    make_features(q.get(), k.get(), b, d, seed);
    if (!bf16) return;
    qh = allocate_bf16(b, d);
    kh = allocate_bf16(b, d);
    dqh = allocate_bf16(b, d);
    dkh = allocate_bf16(b, d);
    parallel_for(b * d, [&](std::int64_t lo, std::int64_t hi, int) {
      for (std::int64_t i = lo; i < hi; ++i) {
        qh[i] = bf16_bits(q[i]);
        kh[i] = bf16_bits(k[i]);
        q[i] = bf16_value(qh[i]);
        k[i] = bf16_value(kh[i]);
      }
    });
  }
  bool bf16() const { return bool(qh); }
};

// Phases::one: a variant whose forward and backward are one call (the sigmoid
// value_and_grad) reports only total_s, not a forward/backward split.
enum class Phases { two, one };

// Times run_once() (which returns {forward, backward} seconds) until
// min_time seconds were measured or max_reps runs were made; a first run
// shorter than 2 s is a warm-up and not counted. Reports the fastest run
// (other work on the machine only ever adds time) and the median total.
template <typename Run>
void time_runs(const VariantConfig &c, Run &&run_once, Report &report, Phases phases = Phases::two) {
  std::vector<std::pair<double, double>> runs;
  double measured = 0.0;
  bool warm = false;
  while (runs.empty() || (measured < c.min_time && int(runs.size()) < c.max_reps)) {
    const auto [f, b] = run_once();
    if (!warm && f + b < 2.0) {
      warm = true;
      continue;
    }
    warm = true;
    runs.push_back({f, b});
    measured += f + b;
  }
  std::vector<double> totals;
  for (const auto &[f, b] : runs) totals.push_back(f + b);
  const std::size_t best = std::size_t(std::min_element(totals.begin(), totals.end()) - totals.begin());
  std::sort(totals.begin(), totals.end());
  const std::size_t n = totals.size();
  if (phases == Phases::two) {
    report.push_back({"fwd_s", runs[best].first});
    report.push_back({"bwd_s", runs[best].second});
  }
  report.push_back({"total_s", runs[best].first + runs[best].second});
  report.push_back({"median_total_s", n % 2 ? totals[n / 2] : 0.5 * (totals[n / 2 - 1] + totals[n / 2])});
  report.push_back({"reps", double(n)});
}

// ---- flatmem ---------------------------------------------------------------

DLTensor fp32_tensor(float *data, int ndim, std::int64_t *shape) {
  DLTensor t{};
  t.data = data;
  t.device = {kDLCPU, 0};
  t.ndim = ndim;
  t.dtype = {kDLFloat, 32, 1};
  t.shape = shape;
  return t;
}

DLTensor bf16_tensor(std::uint16_t *data, int ndim, std::int64_t *shape) {
  DLTensor t = fp32_tensor(nullptr, ndim, shape);
  t.data = data;
  t.dtype = {kDLBfloat, 16, 1};
  return t;
}

void check(flatmem_status status, const char *what) {
  if (status != FLATMEM_STATUS_SUCCESS)
    throw std::runtime_error(std::string(what) + ": " + flatmem_status_string(status) + ": " +
                             flatmem_last_error());
}

using Handle = std::unique_ptr<flatmem_contrastive_t, flatmem_status (*)(flatmem_contrastive_t *)>;

Handle make_handle(const flatmem_contrastive_options &options) {
  flatmem_contrastive_t *raw = nullptr;
  check(flatmem_contrastive_create(&raw, &options), "flatmem_contrastive_create");
  return Handle(raw, flatmem_contrastive_destroy);
}

// The features as DLTensors (fp32, or bf16 with bf16 gradients), and fp32
// scalars: what every flatmem call takes.
struct FeatureTensors {
  std::int64_t matrix_shape[2];
  DLTensor q, k, dq, dk;
  explicit FeatureTensors(Features &f) : matrix_shape{f.b, f.d} {
    if (f.bf16()) {
      q = bf16_tensor(f.qh.get(), 2, matrix_shape);
      k = bf16_tensor(f.kh.get(), 2, matrix_shape);
      dq = bf16_tensor(f.dqh.get(), 2, matrix_shape);
      dk = bf16_tensor(f.dkh.get(), 2, matrix_shape);
      return;
    }
    q = fp32_tensor(f.q.get(), 2, matrix_shape);
    k = fp32_tensor(f.k.get(), 2, matrix_shape);
    dq = fp32_tensor(f.dq.get(), 2, matrix_shape);
    dk = fp32_tensor(f.dk.get(), 2, matrix_shape);
  }
};
DLTensor scalar_tensor(float *value) { return fp32_tensor(value, 0, nullptr); }

// A caller workspace of `bytes`, pre-faulted (as a framework allocator's would be).
std::unique_ptr<char[]> workspace_of(std::size_t bytes) {
  std::unique_ptr<char[]> workspace(new char[std::max<std::size_t>(bytes, 1)]);
  touch(workspace.get(), bytes);
  return workspace;
}

void report_isa(Report &report) {
  flatmem_cpu_isa isa = FLATMEM_CPU_ISA_DEFAULT;
  check(flatmem_cpu_isa_get(&isa, nullptr), "flatmem_cpu_isa_get");
  report.push_back({"cpu_isa", double(isa)});
}

Report run_flatmem(const VariantConfig &c) {
  Features f(c.b, c.d, c.seed, c.dtype);
  FeatureTensors t(f);
  std::int64_t vector_shape[1] = {c.b};
  std::vector<float> row_lse(static_cast<std::size_t>(c.b)), col_lse(static_cast<std::size_t>(c.b));
  float scale = c.scale, loss = 0.0f, dscale = 0.0f;
  DLTensor row_lse_t = fp32_tensor(row_lse.data(), 1, vector_shape);
  DLTensor col_lse_t = fp32_tensor(col_lse.data(), 1, vector_shape);
  DLTensor scale_t = scalar_tensor(&scale), loss_t = scalar_tensor(&loss), dscale_t = scalar_tensor(&dscale);

  flatmem_contrastive_options options = FLATMEM_CONTRASTIVE_OPTIONS_INIT;
  options.fp32_precision = c.fp32_precision;
  options.logit_cache_bytes = c.logit_cache_bytes;
  const Handle handle = make_handle(options);
  std::size_t forward_bytes = 0, backward_bytes = 0;
  check(flatmem_contrastive_forward_workspace_size(handle.get(), &t.q, &t.k, &forward_bytes),
        "forward_workspace_size");
  check(flatmem_contrastive_backward_workspace_size(handle.get(), &t.q, &t.k, &t.dq, &t.dk, &backward_bytes),
        "backward_workspace_size");
  const std::size_t workspace_bytes = std::max(forward_bytes, backward_bytes);
  const auto workspace = workspace_of(workspace_bytes);

  Report report;
  time_runs(c, [&] {
    const double t0 = now_seconds();
    check(flatmem_contrastive_forward(handle.get(), &t.q, &t.k, nullptr, &scale_t, &loss_t, &row_lse_t,
                                      &col_lse_t, workspace.get(), workspace_bytes, nullptr),
          "flatmem_contrastive_forward");
    const double t1 = now_seconds();
    check(flatmem_contrastive_backward(handle.get(), &t.q, &t.k, nullptr, &scale_t, &row_lse_t,
                                       &col_lse_t, nullptr, &t.dq, &t.dk, &dscale_t, workspace.get(),
                                       workspace_bytes, nullptr),
          "flatmem_contrastive_backward");
    return std::pair{t1 - t0, now_seconds() - t1};
  }, report);
  report.push_back({"loss", loss});
  report.push_back({"dscale", dscale});
  report.push_back({"workspace_forward", double(forward_bytes)});
  report.push_back({"workspace_backward", double(backward_bytes)});
  report.push_back({"logit_cache_bytes", double(c.logit_cache_bytes)});
  report_isa(report);
  return report;
}

// The sigmoid loss, value and every gradient in one call: a single timed
// phase (fwd_s and bwd_s are not reported).
Report run_sigmoid(const VariantConfig &c) {
  Features f(c.b, c.d, c.seed, c.dtype);
  FeatureTensors t(f);
  float scale = c.scale, bias = c.bias, loss = 0.0f, dscale = 0.0f, dbias = 0.0f;
  DLTensor scale_t = scalar_tensor(&scale), bias_t = scalar_tensor(&bias), loss_t = scalar_tensor(&loss);
  DLTensor dscale_t = scalar_tensor(&dscale), dbias_t = scalar_tensor(&dbias);

  flatmem_contrastive_options options = FLATMEM_CONTRASTIVE_OPTIONS_INIT;
  options.fp32_precision = c.fp32_precision;
  options.loss = FLATMEM_CONTRASTIVE_SIGMOID;
  const Handle handle = make_handle(options);
  std::size_t workspace_bytes = 0;
  check(flatmem_contrastive_sigmoid_workspace_size(handle.get(), &t.q, &t.k, &t.dq, &t.dk, &workspace_bytes),
        "flatmem_contrastive_sigmoid_workspace_size");
  const auto workspace = workspace_of(workspace_bytes);

  Report report;
  time_runs(c, [&] {
    const double t0 = now_seconds();
    check(flatmem_contrastive_sigmoid_value_and_grad(handle.get(), &t.q, &t.k, nullptr, &scale_t, &bias_t,
                                                     &loss_t, &t.dq, &t.dk, &dscale_t, &dbias_t,
                                                     workspace.get(), workspace_bytes, nullptr),
          "flatmem_contrastive_sigmoid_value_and_grad");
    return std::pair{now_seconds() - t0, 0.0};
  }, report, Phases::one);
  report.push_back({"loss", loss});
  report.push_back({"dscale", dscale});
  report.push_back({"dbias", dbias});
  report.push_back({"workspace_forward", double(workspace_bytes)});
  report_isa(report);
  return report;
}

// ---- naive: the materialised loss -----------------------------------------

// lse_i = log sum_j exp(x_ij) for rows [begin, end) of the b x b matrix x.
BENCH_SIMD_CLONES
void row_lse(const float *x, std::int64_t b, std::int64_t begin, std::int64_t end, float *lse) {
  for (std::int64_t i = begin; i < end; ++i) {
    const float *row = x + i * b;
    float m = -std::numeric_limits<float>::infinity(), sum = 0.0f;
#pragma omp simd reduction(max : m)
    for (std::int64_t j = 0; j < b; ++j) m = row[j] > m ? row[j] : m;
#pragma omp simd reduction(+ : sum)
    for (std::int64_t j = 0; j < b; ++j) sum += exp_nonpositive(row[j] - m);
    lse[i] = m + std::log(sum);
  }
}

// lse_j = log sum_i exp(x_ij) for columns [begin, end): two sweeps down the rows.
BENCH_SIMD_CLONES
void col_lse(const float *x, std::int64_t b, std::int64_t begin, std::int64_t end, float *max,
             float *sum, float *lse) {
  for (std::int64_t j = begin; j < end; ++j) max[j] = -std::numeric_limits<float>::infinity();
  for (std::int64_t i = 0; i < b; ++i) {
    const float *row = x + i * b;
#pragma omp simd
    for (std::int64_t j = begin; j < end; ++j) max[j] = row[j] > max[j] ? row[j] : max[j];
  }
  for (std::int64_t j = begin; j < end; ++j) sum[j] = 0.0f;
  for (std::int64_t i = 0; i < b; ++i) {
    const float *row = x + i * b;
#pragma omp simd
    for (std::int64_t j = begin; j < end; ++j) sum[j] += exp_nonpositive(row[j] - max[j]);
  }
  for (std::int64_t j = begin; j < end; ++j) lse[j] = max[j] + std::log(sum[j]);
}

// G_ij = coef (exp(x_ij - row_lse_i) + exp(x_ij - col_lse_j)) - 2 coef [i = j],
// coef = 1/(2b); returns sum_ij G_ij x_ij over rows [begin, end).
BENCH_SIMD_CLONES
double gradient_rows(const float *x, std::int64_t b, std::int64_t begin, std::int64_t end,
                     const float *rlse, const float *clse, float coef, float *g) {
  double total = 0.0;
  for (std::int64_t i = begin; i < end; ++i) {
    const float *xi = x + i * b;
    float *gi = g + i * b;
    const float li = rlse[i];
    float partial = 0.0f;
#pragma omp simd reduction(+ : partial)
    for (std::int64_t j = 0; j < b; ++j) {
      const float v = coef * (exp_nonpositive(xi[j] - li) + exp_nonpositive(xi[j] - clse[j]));
      gi[j] = v;
      partial += v * xi[j];
    }
    gi[i] -= 2.0f * coef;
    partial -= 2.0f * coef * xi[i];
    total += partial;
  }
  return total;
}

Report run_naive(const VariantConfig &c) {
  Features f(c.b, c.d, c.seed);
  const std::int64_t b = c.b, d = c.d;
  Matrix x = allocate(b, b), g = allocate(b, b);  // pre-faulted: a caching allocator's state
  std::vector<float> rlse(static_cast<std::size_t>(b)), clse(static_cast<std::size_t>(b)), cmax(static_cast<std::size_t>(b)),
      csum(static_cast<std::size_t>(b));
  const int threads = hardware_threads();
  std::vector<double> ds_part(static_cast<std::size_t>(threads));
  double loss = 0.0, dscale = 0.0;

  Report report;
  time_runs(c, [&] {
    const double t0 = now_seconds();
    // forward: logits, both log-sum-exps, the loss
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(b), int(b), int(d), c.scale,
                f.q.get(), int(d), f.k.get(), int(d), 0.0f, x.get(), int(b));
    parallel_for(b, [&](std::int64_t lo, std::int64_t hi, int) { row_lse(x.get(), b, lo, hi, rlse.data()); });
    parallel_for(b, [&](std::int64_t lo, std::int64_t hi, int) {
      col_lse(x.get(), b, lo, hi, cmax.data(), csum.data(), clse.data());
    });
    double total = 0.0;
    for (std::int64_t i = 0; i < b; ++i) total += double(rlse[i]) + clse[i] - 2.0 * x[i * b + i];
    loss = total / (2.0 * double(b));
    const double t1 = now_seconds();
    // backward: G, dL/ds, then dq = s G K and dk = s G^T Q
    const float coef = float(1.0 / (2.0 * double(b)));
    std::fill(ds_part.begin(), ds_part.end(), 0.0);
    parallel_for(b, [&](std::int64_t lo, std::int64_t hi, int thread) {
      ds_part[std::size_t(thread)] =
          gradient_rows(x.get(), b, lo, hi, rlse.data(), clse.data(), coef, g.get());
    });
    dscale = 0.0;
    for (double p : ds_part) dscale += p;
    dscale /= c.scale;  // x holds s <q_i, k_j>
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(b), int(d), int(b), c.scale, g.get(),
                int(b), f.k.get(), int(d), 0.0f, f.dq.get(), int(d));
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(b), int(d), int(b), c.scale, g.get(),
                int(b), f.q.get(), int(d), 0.0f, f.dk.get(), int(d));
    return std::pair{t1 - t0, now_seconds() - t1};
  }, report);
  report.push_back({"loss", loss});
  report.push_back({"dscale", dscale});
  return report;
}

// ---- the naive sigmoid loss: materialised logits, G in place ----------------

struct SigmoidSums {
  double loss = 0.0, ds = 0.0, dt = 0.0;  // sum softplus(v), sum G_ij X_ij, sum G_ij
};

// softplus(v) = max(v, 0) + log1p(e) and sigmoid(v) = (v >= 0 ? 1 : e) / (1 + e),
// e = exp(-|v|): the stable forms (nothing overflows at s = 100, t = -10).
inline float softplus(float v, float e) { return (v > 0.0f ? v : 0.0f) + log1p_series(e); }
inline float sigmoid(float v, float e) { return (v >= 0.0f ? 1.0f : e) / (1.0f + e); }

// Rows [begin, end) of X = s Q K^T (b x b, the diagonal positive): the
// vectorised loop treats every pair as a negative (z = -1, v = x = X + t,
// G = coef sigmoid(v)), then the diagonal element is swapped for the positive
// (v = -x, G = -coef sigmoid(v)). Writes s G over X.
BENCH_SIMD_CLONES
SigmoidSums sigmoid_rows(float *x, std::int64_t b, std::int64_t begin, std::int64_t end, float scale,
                         float bias, float coef) {
  SigmoidSums sums;
  for (std::int64_t i = begin; i < end; ++i) {
    float *xi = x + i * b;
    const float diagonal = xi[i];
    float loss = 0.0f, ds = 0.0f, dt = 0.0f;
#pragma omp simd reduction(+ : loss, ds, dt)
    for (std::int64_t j = 0; j < b; ++j) {
      const float v = xi[j] + bias;
      const float e = exp_nonpositive(-std::fabs(v));
      const float g = coef * sigmoid(v, e);
      loss += softplus(v, e);
      ds += g * xi[j];
      dt += g;
      xi[j] = scale * g;
    }
    const float vn = diagonal + bias, en = exp_nonpositive(-std::fabs(vn)), gn = coef * sigmoid(vn, en);
    const float vp = -vn, ep = en, gp = -coef * sigmoid(vp, ep);  // |vp| = |vn|: the same exp
    loss += softplus(vp, ep) - softplus(vn, en);
    ds += (gp - gn) * diagonal;
    dt += gp - gn;
    xi[i] = scale * gp;
    sums.loss += loss;
    sums.ds += ds;
    sums.dt += dt;
  }
  return sums;
}

// max_i |m_i| (Euclidean) over the rows of an n x d matrix, in double.
double max_norm(const float *m, std::int64_t n, std::int64_t d) {
  double largest = 0.0;
  for (std::int64_t i = 0; i < n; ++i) {
    double sq = 0.0;
    for (std::int64_t t = 0; t < d; ++t) sq += double(m[i * d + t]) * m[i * d + t];
    largest = std::max(largest, std::sqrt(sq));
  }
  return largest;
}

Report run_sigmoid_naive(const VariantConfig &c) {
  Features f(c.b, c.d, c.seed);
  const std::int64_t b = c.b, d = c.d;
  Matrix x = allocate(b, b);  // pre-faulted: a caching allocator's state
  std::vector<SigmoidSums> parts(static_cast<std::size_t>(hardware_threads()));
  SigmoidSums total;

  Report report;
  time_runs(c, [&] {
    const double t0 = now_seconds();
    // forward: logits, then loss, ds, dt and s G (in place) in one pass
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(b), int(b), int(d), c.scale,
                f.q.get(), int(d), f.k.get(), int(d), 0.0f, x.get(), int(b));
    const float coef = float(1.0 / double(b));
    std::fill(parts.begin(), parts.end(), SigmoidSums{});
    parallel_for(b, [&](std::int64_t lo, std::int64_t hi, int thread) {
      parts[std::size_t(thread)] = sigmoid_rows(x.get(), b, lo, hi, c.scale, c.bias, coef);
    });
    total = SigmoidSums{};
    for (const auto &p : parts) {
      total.loss += p.loss;
      total.ds += p.ds;
      total.dt += p.dt;
    }
    const double t1 = now_seconds();
    // backward: dq = (s G) K, dk = (s G)^T Q
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(b), int(d), int(b), 1.0f, x.get(),
                int(b), f.k.get(), int(d), 0.0f, f.dq.get(), int(d));
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(b), int(d), int(b), 1.0f, x.get(),
                int(b), f.q.get(), int(d), 0.0f, f.dk.get(), int(d));
    return std::pair{t1 - t0, now_seconds() - t1};
  }, report);
  report.push_back({"loss", total.loss / double(b)});
  report.push_back({"dscale", total.ds / c.scale});  // X holds s <q_i, k_j>
  report.push_back({"dbias", total.dt});
  // For contrastive_bench --check (untimed): sum_ij |G_ij| (X holds s G) and
  // A = max_i |q_i| max_j |k_j| >= max_ij sum_t |q_it k_jt|.
  std::vector<double> part_abs(parts.size());
  parallel_for(b, [&](std::int64_t lo, std::int64_t hi, int thread) {
    double sum = 0.0;
    for (std::int64_t i = lo * b; i < hi * b; ++i) sum += std::fabs(double(x[i]));
    part_abs[std::size_t(thread)] = sum;
  });
  double sum_abs = 0.0;
  for (double p : part_abs) sum_abs += p;
  report.push_back({"sum_abs_g", sum_abs / c.scale});
  report.push_back({"max_dot_bound", max_norm(f.q.get(), b, d) * max_norm(f.k.get(), b, d)});
  return report;
}

// ---- the GEMM floors, in column strips ----------------------------------------

// gemm4 (recompute = true): the CLIP loss's four products, the logits twice;
// gemm3: the sigmoid's three, the logits once.
Report run_gemm_strips(const VariantConfig &c, bool recompute) {
  Features f(c.b, c.d, c.seed);
  const std::int64_t b = c.b, d = c.d, strip = std::min(c.strip, c.b);
  Matrix s = allocate(b, strip);
  Report report;
  time_runs(c, [&] {
    const double t0 = now_seconds();
    double forward = 0.0;
    for (std::int64_t j0 = 0; j0 < b; j0 += strip) {
      const std::int64_t w = std::min(strip, b - j0);
      const float *kj = f.k.get() + j0 * d;
      const double t = now_seconds();
      // forward logits (and for gemm4 the backward's recompute): S = s Q K_J^T (b x w x d)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(b), int(w), int(d), c.scale,
                  f.q.get(), int(d), kj, int(d), 0.0f, s.get(), int(w));
      forward += now_seconds() - t;
      if (recompute)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(b), int(w), int(d), c.scale,
                    f.q.get(), int(d), kj, int(d), 0.0f, s.get(), int(w));
      // dq += S K_J (b x d x w), dk_J = S^T Q (w x d x b)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(b), int(d), int(w), 1.0f, s.get(),
                  int(w), kj, int(d), j0 == 0 ? 0.0f : 1.0f, f.dq.get(), int(d));
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(w), int(d), int(b), 1.0f, s.get(),
                  int(w), f.q.get(), int(d), 0.0f, f.dk.get() + j0 * d, int(d));
    }
    const double elapsed = now_seconds() - t0;
    return std::pair{forward, elapsed - forward};
  }, report);
  report.push_back({"strip", double(strip)});
  return report;
}

// ---- the four GEMMs at tile shapes, flatmem's own single-threaded sgemm per thread --------
// (src/core/gemm at the CPU ISA level flatmem runs under: the same engine as flatmem's rows)

Report run_tilegemm(const VariantConfig &c) {
  using flatmem::gemm::Op;
  flatmem_cpu_isa in_use = FLATMEM_CPU_ISA_BASELINE;
  flatmem_cpu_isa_get(&in_use, nullptr);
  const auto isa = flatmem::cpu_isa::Isa(in_use);
  Features f(c.b, c.d, c.seed);
  const std::int64_t b = c.b, d = c.d, t = std::min(c.tile, c.b), tiles = (b + t - 1) / t;
  const int threads = hardware_threads();
  std::vector<Matrix> logits, dk_scratch;
  for (int i = 0; i < threads; ++i) {
    logits.push_back(allocate(t, t));
    dk_scratch.push_back(allocate(t, d));
  }
  Report report;
  time_runs(c, [&] {
    const double t0 = now_seconds();
    parallel_for(tiles, [&](std::int64_t lo, std::int64_t hi, int thread) {
      const std::size_t me = std::size_t(thread);
      float *x = logits[me].get(), *dk = dk_scratch[me].get();
      for (std::int64_t r = lo; r < hi; ++r) {
        const std::int64_t i0 = r * t, rows = std::min(t, b - i0);
        const float *qi = f.q.get() + i0 * d;
        for (std::int64_t j0 = 0; j0 < b; j0 += t) {
          const std::int64_t cols = std::min(t, b - j0);
          const float *kj = f.k.get() + j0 * d;
          for (int pass = 0; pass < 2; ++pass)
            flatmem::gemm::sgemm(isa, Op::none, Op::transpose, rows, cols, d, c.scale, qi, d, kj, d, 0.0f, x, cols);
          flatmem::gemm::sgemm(isa, Op::none, Op::none, rows, d, cols, 1.0f, x, cols, kj, d, 1.0f,
                               f.dq.get() + i0 * d, d);
          flatmem::gemm::sgemm(isa, Op::transpose, Op::none, cols, d, rows, 1.0f, x, cols, qi, d, 1.0f, dk, d);
        }
      }
    });
    return std::pair{0.0, now_seconds() - t0};
  }, report);
  report.push_back({"tile", double(t)});
  return report;
}

Report run_inputs(const VariantConfig &c) {
  Features f(c.b, c.d, c.seed, c.dtype);
  double sum = 0.0;  // use the data so that nothing is optimised away
  for (std::int64_t i = 0; i < c.b; ++i) sum += f.q[i * c.d];
  return {{"checksum", sum}};
}

// ---- the float64 references (untimed: the loss error column) -----------------

// The loss of the very inputs a flatmem row used (for bf16: the rounded values), in
// double: X = s Q K^T by dgemm in column strips of at most 128 MiB (the products of
// fp32 or bf16 values are exact in double; the sums round at 2^-53), then the loss
// element by element in double: the CLIP loss's row log-sum-exps merged strip by strip
// (running maximum and sum), its column log-sum-exps whole within a strip; the
// sigmoid loss's softplus terms max(v, 0) + log1p(exp(-|v|)). 2 b^2 d FLOPs in dgemm
// and two exp (CLIP) or an exp and a log1p (sigmoid) per logit.
Report run_reference(const VariantConfig &c, bool sigmoid) {
  const double t0 = now_seconds();
  std::int64_t b = c.b, d = c.d;
  std::vector<double> q(std::size_t(b * d)), k(std::size_t(b * d));
  {
    Features f(c.b, c.d, c.seed, c.dtype);  // for bf16: q, k hold the rounded values
    parallel_for(b * d, [&](std::int64_t lo, std::int64_t hi, int) {
      for (std::int64_t i = lo; i < hi; ++i) {
        q[std::size_t(i)] = f.q[i];
        k[std::size_t(i)] = f.k[i];
      }
    });
  }
  const double s = double(c.scale), t = double(c.bias);
  const std::int64_t w = std::min(b, std::clamp<std::int64_t>((std::int64_t(128) << 20) / (8 * b), 64, 2048));
  std::vector<double> x(std::size_t(b * w));
  const int threads = hardware_threads();
  std::vector<double> parts(std::size_t(threads), 0.0);
  constexpr double inf = std::numeric_limits<double>::infinity();
  std::vector<double> rmax(std::size_t(b), -inf), rsum(std::size_t(b), 0.0), diag(std::size_t(b), 0.0);
  std::vector<double> cmax(static_cast<std::size_t>(w)), csum(static_cast<std::size_t>(w));
  for (std::int64_t j0 = 0; j0 < b; j0 += w) {
    const std::int64_t n = std::min(w, b - j0);
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(b), int(n), int(d), s, q.data(), int(d),
                k.data() + j0 * d, int(d), 0.0, x.data(), int(n));
    if (sigmoid) {
      parallel_for(b, [&](std::int64_t lo, std::int64_t hi, int thread) {
        double sum = 0.0;
        for (std::int64_t i = lo; i < hi; ++i) {
          const double *row = x.data() + i * n;
          for (std::int64_t j = 0; j < n; ++j) {
            const double u = j0 + j == i ? -(row[j] + t) : row[j] + t;  // -log sigmoid(z v) = softplus(-z v)
            sum += std::max(u, 0.0) + std::log1p(std::exp(-std::fabs(u)));
          }
        }
        parts[std::size_t(thread)] += sum;
      });
      continue;
    }
    parallel_for(b, [&](std::int64_t lo, std::int64_t hi, int) {  // rows: merge this strip in
      for (std::int64_t i = lo; i < hi; ++i) {
        const double *row = x.data() + i * n;
        double m = rmax[std::size_t(i)];
        for (std::int64_t j = 0; j < n; ++j) m = std::max(m, row[j]);
        double sum = rmax[std::size_t(i)] == -inf ? 0.0 : rsum[std::size_t(i)] * std::exp(rmax[std::size_t(i)] - m);
        for (std::int64_t j = 0; j < n; ++j) sum += std::exp(row[j] - m);
        rmax[std::size_t(i)] = m;
        rsum[std::size_t(i)] = sum;
        if (i >= j0 && i < j0 + n) diag[std::size_t(i)] = row[i - j0];
      }
    });
    parallel_for(n, [&](std::int64_t lo, std::int64_t hi, int thread) {  // columns: whole in this strip
      for (std::int64_t j = lo; j < hi; ++j) cmax[std::size_t(j)] = -inf, csum[std::size_t(j)] = 0.0;
      for (std::int64_t i = 0; i < b; ++i)
        for (std::int64_t j = lo; j < hi; ++j) cmax[std::size_t(j)] = std::max(cmax[std::size_t(j)], x[std::size_t(i * n + j)]);
      for (std::int64_t i = 0; i < b; ++i)
        for (std::int64_t j = lo; j < hi; ++j) csum[std::size_t(j)] += std::exp(x[std::size_t(i * n + j)] - cmax[std::size_t(j)]);
      double sum = 0.0;
      for (std::int64_t j = lo; j < hi; ++j) sum += cmax[std::size_t(j)] + std::log(csum[std::size_t(j)]);
      parts[std::size_t(thread)] += sum;
    });
  }
  double total = 0.0;
  for (double p : parts) total += p;
  double loss;
  if (sigmoid) {
    loss = total / double(b);
  } else {
    double rows = 0.0, diagonal = 0.0;
    for (std::int64_t i = 0; i < b; ++i) {
      rows += rmax[std::size_t(i)] + std::log(rsum[std::size_t(i)]);
      diagonal += diag[std::size_t(i)];
    }
    loss = (rows + total - 2.0 * diagonal) / (2.0 * double(b));
  }
  return {{"loss", loss}, {"ref_s", now_seconds() - t0}, {"strip", double(w)}};
}

}  // namespace

std::uint16_t bf16_bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return std::uint16_t((u >> 16) | 0x40u);  // NaN stays (quiet) NaN
  u += 0x7fffu + ((u >> 16) & 1u);                                             // round to nearest even
  return std::uint16_t(u >> 16);
}

float bf16_value(std::uint16_t bits) {
  const std::uint32_t u = std::uint32_t(bits) << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

double planned_extra_bytes(const std::string &variant, std::int64_t b, std::int64_t d,
                           std::int64_t strip) {
  const double bb = double(b) * double(b);
  if (variant == "naive") return 2.0 * 4.0 * bb;                          // X and G
  if (variant == "gemm4" || variant == "gemm3") return 4.0 * double(b) * double(std::min(strip, b));  // one strip
  if (variant == "sigmoid-naive") return 4.0 * bb;                        // X, then G in place
  if (variant == "flatmem-cache") return 4.0 * bb;                        // every logit tile
  (void)d;
  return 0.0;  // flatmem, sigmoid, tilegemm: O(b + tile^2) -- negligible for the fit test
}

Report run_variant(const VariantConfig &c) {
  Report r;
  const bool any_dtype = c.variant == "inputs" || c.variant == "flatmem" || c.variant == "sigmoid" ||
                         c.variant == "reference" || c.variant == "sigmoid-reference";
  if (is_bf16(c.dtype) && !any_dtype)
    throw std::runtime_error("variant '" + c.variant + "' runs fp32 only (dtype " + c.dtype + ")");
  if (c.variant == "inputs") r = run_inputs(c);
  else if (c.variant == "reference") r = run_reference(c, false);
  else if (c.variant == "sigmoid-reference") r = run_reference(c, true);
  else if (c.variant == "flatmem") r = run_flatmem(c);
  else if (c.variant == "naive") r = run_naive(c);
  else if (c.variant == "gemm4") r = run_gemm_strips(c, true);
  else if (c.variant == "gemm3") r = run_gemm_strips(c, false);
  else if (c.variant == "sigmoid") r = run_sigmoid(c);
  else if (c.variant == "sigmoid-naive") r = run_sigmoid_naive(c);
  else if (c.variant == "tilegemm") r = run_tilegemm(c);
  else throw std::runtime_error("unknown variant '" + c.variant + "'");
  r.push_back({"blas_threads", double(blas_threads())});
  r.push_back({"blas_parallel", double(blas_parallel())});
  return r;
}

}  // namespace bench
