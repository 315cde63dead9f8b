/*
 * demo_large_batch.c -- a symmetric CLIP loss at a batch whose logit matrix
 * cannot exist on this machine, then a check against a materialised reference.
 *
 *     ./build/examples/demo_large_batch                    # b = 65536, d = 256
 *     ./build/examples/demo_large_batch --batch 16384 --dim 128
 *
 * Against an installed flatmem:
 *     cc examples/demo_large_batch.c $(pkg-config --cflags --libs flatmem) -lm -o demo_large_batch
 *
 * At b = 65536 one b x b fp32 matrix is 16 GiB; a materialised loss keeps at
 * least the logits and their gradient (32 GiB, more in a framework that also
 * stores both softmaxes). flatmem walks 256 x 256 tiles instead: beyond the
 * features and their gradients it needs O(b) floats plus a few tiles per thread.
 *
 * Phases: generate features, forward (loss + saved log-sum-exp vectors),
 * backward (dq, dk, dL/ds), then an agreement check of flatmem against a plain
 * double-precision implementation that materialises the logit matrix, at sizes
 * where that is cheap. Exits non-zero when the check fails.
 */
#define _POSIX_C_SOURCE 200809L

#include <flatmem/flatmem.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

static const double GIB = 1024.0 * 1024.0 * 1024.0, MIB = 1024.0 * 1024.0;

/* ---- small utilities ------------------------------------------------------ */

static double now_seconds(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Peak resident set size of this process so far, in bytes (Linux: KiB units). */
static double peak_rss_bytes(void) {
  struct rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  return 1024.0 * (double)usage.ru_maxrss;
}

static double physical_memory_bytes(void) {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? (double)pages * (double)page : 0.0;
}

static int ok(flatmem_status status, const char *what) {
  if (status == FLATMEM_STATUS_SUCCESS) return 1;
  fprintf(stderr, "demo: %s failed: %s: %s\n", what, flatmem_status_string(status),
          flatmem_last_error());
  return 0;
}

static DLTensor fp32_tensor(float *data, int ndim, int64_t *shape) {
  DLTensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.device.device_type = kDLCPU;
  t.ndim = ndim;
  t.dtype.code = kDLFloat;
  t.dtype.bits = 32;
  t.dtype.lanes = 1;
  t.shape = shape;
  return t;
}

/* ---- features --------------------------------------------------------------- */

static uint64_t rng_state;

static double uniform01(void) { /* splitmix64, (0, 1) */
  uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return ((double)(z >> 11) + 0.5) / 9007199254740992.0;
}

static void fill_normal(float *x, size_t n) { /* Box-Muller, two values per draw */
  size_t i;
  for (i = 0; i < n; i += 2) {
    const double r = sqrt(-2.0 * log(uniform01())), a = 6.283185307179586 * uniform01();
    x[i] = (float)(r * cos(a));
    if (i + 1 < n) x[i + 1] = (float)(r * sin(a));
  }
}

static void normalize_rows(float *m, int64_t rows, int64_t cols) {
  int64_t i, j;
  for (i = 0; i < rows; ++i) {
    float *row = m + i * cols;
    double norm = 0.0;
    for (j = 0; j < cols; ++j) norm += (double)row[j] * row[j];
    norm = sqrt(norm);
    for (j = 0; j < cols; ++j) row[j] = (float)(row[j] / norm);
  }
}

/* CLIP-like pairs: q_i uniform on the unit sphere, k_i = normalize(q_i + noise). */
static void make_pairs(float *q, float *k, int64_t b, int64_t d, double noise, uint64_t seed) {
  const size_t n = (size_t)b * (size_t)d;
  size_t i;
  rng_state = seed;
  fill_normal(q, n);
  fill_normal(k, n);
  for (i = 0; i < n; ++i) k[i] = (float)(q[i] + noise * k[i]);
  normalize_rows(q, b, d);
  normalize_rows(k, b, d);
}

/* ---- flatmem: forward + backward with a caller workspace ------------------ */

typedef struct {
  float loss, dscale;
  double forward_s, backward_s;
  size_t workspace_bytes;
} clip_result;

/* Symmetric loss of (q, k) at scale s; writes dq, dk (b x d). Returns 1 on success. */
static int flatmem_clip(int64_t b, int64_t d, float s, int threads, float *q, float *k, float *dq,
                        float *dk, int verbose, clip_result *r) {
  int64_t matrix_shape[2], vector_shape[1];
  float *row_lse = malloc((size_t)b * sizeof(float)), *col_lse = malloc((size_t)b * sizeof(float));
  flatmem_contrastive_options options = FLATMEM_CONTRASTIVE_OPTIONS_INIT;
  flatmem_contrastive_t *handle = NULL;
  void *workspace = NULL;
  size_t forward_bytes = 0, backward_bytes = 0;
  DLTensor q_t, k_t, dq_t, dk_t, row_lse_t, col_lse_t, scale_t, loss_t, dscale_t;
  int success = 0;
  double t0;

  matrix_shape[0] = b;
  matrix_shape[1] = d;
  vector_shape[0] = b;
  q_t = fp32_tensor(q, 2, matrix_shape);
  k_t = fp32_tensor(k, 2, matrix_shape);
  dq_t = fp32_tensor(dq, 2, matrix_shape);
  dk_t = fp32_tensor(dk, 2, matrix_shape);
  row_lse_t = fp32_tensor(row_lse, 1, vector_shape);
  col_lse_t = fp32_tensor(col_lse, 1, vector_shape);
  scale_t = fp32_tensor(&s, 0, NULL);
  loss_t = fp32_tensor(&r->loss, 0, NULL);
  dscale_t = fp32_tensor(&r->dscale, 0, NULL);
  if (!row_lse || !col_lse) {
    fprintf(stderr, "demo: out of memory\n");
    goto done;
  }

  options.loss = FLATMEM_CONTRASTIVE_SYMMETRIC;
  options.num_threads = threads;
  if (!ok(flatmem_contrastive_create(&handle, &options), "flatmem_contrastive_create") ||
      !ok(flatmem_contrastive_forward_workspace_size(handle, &q_t, &k_t, &forward_bytes),
          "flatmem_contrastive_forward_workspace_size") ||
      !ok(flatmem_contrastive_backward_workspace_size(handle, &q_t, &k_t, &dq_t, &dk_t,
                                                      &backward_bytes),
          "flatmem_contrastive_backward_workspace_size"))
    goto done;
  r->workspace_bytes = forward_bytes > backward_bytes ? forward_bytes : backward_bytes;
  workspace = malloc(r->workspace_bytes);
  if (!workspace) {
    fprintf(stderr, "demo: cannot allocate %zu bytes of workspace\n", r->workspace_bytes);
    goto done;
  }

  if (verbose) {
    printf("[2/4] forward: loss and row/column log-sum-exp (%.2f TFLOP)... ",
           2.0 * (double)b * (double)b * (double)d / 1e12);
    fflush(stdout);
  }
  t0 = now_seconds();
  if (!ok(flatmem_contrastive_forward(handle, &q_t, &k_t, NULL, &scale_t, &loss_t, &row_lse_t,
                                      &col_lse_t, workspace, r->workspace_bytes, NULL),
          "flatmem_contrastive_forward"))
    goto done;
  r->forward_s = now_seconds() - t0;
  if (verbose) {
    printf("%.1f s\n[3/4] backward: dq, dk, dL/ds (%.2f TFLOP)... ", r->forward_s,
           6.0 * (double)b * (double)b * (double)d / 1e12);
    fflush(stdout);
  }
  t0 = now_seconds();
  if (!ok(flatmem_contrastive_backward(handle, &q_t, &k_t, NULL, &scale_t, &row_lse_t, &col_lse_t,
                                       NULL, &dq_t, &dk_t, &dscale_t, workspace,
                                       r->workspace_bytes, NULL),
          "flatmem_contrastive_backward"))
    goto done;
  r->backward_s = now_seconds() - t0;
  if (verbose) printf("%.1f s\n", r->backward_s);
  success = 1;

done:
  if (handle && !ok(flatmem_contrastive_destroy(handle), "flatmem_contrastive_destroy"))
    success = 0;
  free(workspace);
  free(row_lse);
  free(col_lse);
  return success;
}

/* ---- the materialised double-precision reference ---------------------------- */

typedef struct {
  double loss, dscale;
  double dscale_terms; /* sum_ij (P_ij + Q_ij + 2[i = j]) |x_ij| / (2bs): the size of
                          dL/ds's terms before they cancel */
  double *dq, *dk;     /* b x d */
} reference_result;

/* x = s Q K^T (b x b) in double, then the symmetric loss and
 *   G_ij = (exp(x_ij - row_lse_i) + exp(x_ij - col_lse_j) - 2 [i = j]) / (2b),
 *   dq = s G K,  dk = s G^T Q,  dL/ds = sum_ij G_ij x_ij / s. */
static int reference_clip(int64_t b, int64_t d, double s, const float *q, const float *k,
                          reference_result *r) {
  const size_t bb = (size_t)b * (size_t)b;
  double *x = malloc(bb * sizeof(double));
  double *row_lse = malloc((size_t)b * sizeof(double)), *col_lse = malloc((size_t)b * sizeof(double));
  int64_t i, j, t;
  double lse_total = 0.0, positive_total = 0.0;
  r->dq = calloc((size_t)(b * d), sizeof(double));
  r->dk = calloc((size_t)(b * d), sizeof(double));
  if (!x || !row_lse || !col_lse || !r->dq || !r->dk) {
    free(x);
    free(row_lse);
    free(col_lse);
    return 0;
  }
  for (i = 0; i < b; ++i)
    for (j = 0; j < b; ++j) {
      double dot = 0.0;
      for (t = 0; t < d; ++t) dot += (double)q[i * d + t] * (double)k[j * d + t];
      x[i * b + j] = s * dot;
    }
  for (i = 0; i < b; ++i) { /* log-sum-exp of row i, and of column i */
    double row_max = -HUGE_VAL, col_max = -HUGE_VAL, row_sum = 0.0, col_sum = 0.0;
    for (j = 0; j < b; ++j) {
      row_max = fmax(row_max, x[i * b + j]);
      col_max = fmax(col_max, x[j * b + i]);
    }
    for (j = 0; j < b; ++j) {
      row_sum += exp(x[i * b + j] - row_max);
      col_sum += exp(x[j * b + i] - col_max);
    }
    row_lse[i] = row_max + log(row_sum);
    col_lse[i] = col_max + log(col_sum);
    lse_total += row_lse[i] + col_lse[i];
    positive_total += x[i * b + i];
  }
  r->loss = (lse_total - 2.0 * positive_total) / (2.0 * (double)b);
  r->dscale = r->dscale_terms = 0.0;
  for (i = 0; i < b; ++i)
    for (j = 0; j < b; ++j) {
      const double xij = x[i * b + j];
      const double p_row = exp(xij - row_lse[i]), p_col = exp(xij - col_lse[j]);
      const double positive = i == j ? 2.0 : 0.0;
      const double g = (p_row + p_col - positive) / (2.0 * (double)b);
      r->dscale += g * xij / s;
      r->dscale_terms += (p_row + p_col + positive) * fabs(xij) / (2.0 * (double)b * s);
      for (t = 0; t < d; ++t) {
        r->dq[i * d + t] += s * g * (double)k[j * d + t];
        r->dk[j * d + t] += s * g * (double)q[i * d + t];
      }
    }
  free(x);
  free(row_lse);
  free(col_lse);
  return 1;
}

static double max_abs_diff(const float *a, const double *ref, size_t n, double *ref_max) {
  double worst = 0.0;
  size_t i;
  *ref_max = 0.0;
  for (i = 0; i < n; ++i) {
    const double e = fabs((double)a[i] - ref[i]);
    if (!(e <= worst)) worst = e; /* NaN becomes the worst */
    if (fabs(ref[i]) > *ref_max) *ref_max = fabs(ref[i]);
  }
  return worst;
}

/* Tolerance on each error, measured against the quantity's natural scale:
 * max |reference| for dq and dk, max(1, |L|) for the loss, and for dL/ds
 * (a sum that cancels: P_ii + Q_ii - 2 is tiny when the pairs match well) the
 * size of its terms before cancelling, sum_ij (P_ij + Q_ij + 2[i = j]) |x_ij| / (2bs).
 * The logits are
 * fp32 dot products of length d, with an absolute error of about
 * |x| sqrt(d) 2^-24, and |x| reaches s; exp(x - lse) turns that into a
 * relative error of the same size: ~5e-5 at s = 100, d = 64. 5e-4 leaves a
 * 10x margin over fp32 rounding, while a wrong term (a missed tile, a wrong
 * sign or scale) gives errors of order 1. */
static const double TOLERANCE = 5e-4;

/* The full-size identity <dq,q> = <dk,k> = s dL/ds compares sums of b row
 * products of gradients accumulated over b columns in fp32: relative error
 * of order sqrt(b) 2^-24 ~ 1.5e-5 at b = 65536 at worst (measured: 3e-8 at
 * b = 65536, d = 256). 1e-4 leaves a margin. It catches errors spread over
 * much of the work (a wrong scale or sign, a lost row or column group,
 * accumulations that race); one lost tile among thousands is below its
 * resolution: the small-size reference check covers that. */
static const double IDENTITY_TOLERANCE = 1e-4;

static int agreement_check(int64_t b, int64_t d, float s, int threads) {
  const size_t n = (size_t)b * (size_t)d;
  float *q = malloc(n * sizeof(float)), *k = malloc(n * sizeof(float));
  float *dq = malloc(n * sizeof(float)), *dk = malloc(n * sizeof(float));
  clip_result got;
  reference_result ref = {0.0, 0.0, 0.0, NULL, NULL};
  double a_loss, a_ds, a_dq, a_dk, m_dq, m_dk, e_loss, e_ds, e_dq, e_dk, worst;
  int pass = 0;
  memset(&got, 0, sizeof got);
  if (!q || !k || !dq || !dk) {
    fprintf(stderr, "demo: out of memory\n");
    goto done;
  }
  make_pairs(q, k, b, d, 1.0, 0x5EEDull + (uint64_t)b);
  if (!flatmem_clip(b, d, s, threads, q, k, dq, dk, 0, &got)) goto done;
  if (!reference_clip(b, d, s, q, k, &ref)) {
    fprintf(stderr, "demo: out of memory (reference)\n");
    goto done;
  }
  /* max abs errors, then the same divided by each quantity's scale */
  a_loss = fabs((double)got.loss - ref.loss);
  a_ds = fabs((double)got.dscale - ref.dscale);
  a_dq = max_abs_diff(dq, ref.dq, n, &m_dq);
  a_dk = max_abs_diff(dk, ref.dk, n, &m_dk);
  e_loss = a_loss / fmax(1.0, fabs(ref.loss));
  e_ds = a_ds / ref.dscale_terms;
  e_dq = a_dq / m_dq;
  e_dk = a_dk / m_dk;
  worst = fmax(fmax(e_loss, e_ds), fmax(e_dq, e_dk));
  pass = worst <= TOLERANCE; /* false for NaN */
  printf("  b = %lld, d = %lld, s = %.1f: loss %.7f (reference %.7f), dL/ds %.6e (reference %.6e)\n",
         (long long)b, (long long)d, (double)s, (double)got.loss, ref.loss, (double)got.dscale,
         ref.dscale);
  printf("    max abs error   loss %.2e  ds %.2e  dq %.2e  dk %.2e\n", a_loss, a_ds, a_dq, a_dk);
  printf("    / scale         loss %.2e  ds %.2e  dq %.2e  dk %.2e  (tolerance %.0e) -> %s\n",
         e_loss, e_ds, e_dq, e_dk, TOLERANCE, pass ? "PASS" : "FAIL");
done:
  free(q);
  free(k);
  free(dq);
  free(dk);
  free(ref.dq);
  free(ref.dk);
  return pass;
}

/* ---- main ----------------------------------------------------------------- */

static void usage(const char *argv0) {
  fprintf(stderr,
          "usage: %s [--batch N] [--dim D] [--scale S] [--threads T]\n"
          "  symmetric CLIP loss + gradients at batch N (default 65536), feature dim D (256),\n"
          "  logit scale S (14.3), T threads (0 = all cores); then a small-size check against a\n"
          "  materialised double-precision reference. Exit status 1 when the check fails.\n",
          argv0);
}

int main(int argc, char **argv) {
  int64_t b = 65536, d = 256;
  float s = 14.3f;
  int threads = 0, i, all_pass = 1;
  size_t n;
  float *q, *k, *dq, *dk;
  clip_result r;
  double t0, generate_s, dq_norm = 0.0, dk_norm = 0.0, dq_inner = 0.0, dk_inner = 0.0;
  double dq_magnitude = 0.0, dk_magnitude = 0.0, identity_error = 0.0;
  const double matrix_bytes_per_entry = 4.0;

  for (i = 1; i < argc; ++i) {
    const char *value = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      usage(argv[0]);
      return 0;
    } else if (value && !strcmp(argv[i], "--batch")) {
      b = strtoll(value, NULL, 10), ++i;
    } else if (value && !strcmp(argv[i], "--dim")) {
      d = strtoll(value, NULL, 10), ++i;
    } else if (value && !strcmp(argv[i], "--scale")) {
      s = strtof(value, NULL), ++i;
    } else if (value && !strcmp(argv[i], "--threads")) {
      threads = atoi(value), ++i;
    } else {
      usage(argv[0]);
      return 2;
    }
  }
  if (b < 1 || d < 1) {
    usage(argv[0]);
    return 2;
  }
  n = (size_t)b * (size_t)d;

  printf("flatmem %s demo: symmetric CLIP loss, b = %lld, d = %lld, fp32, s = %.1f\n",
         flatmem_version_string(), (long long)b, (long long)d, (double)s);
  printf("  one b x b fp32 matrix:       %8.2f GiB  (a materialised loss keeps >= 2: %.2f GiB)\n",
         matrix_bytes_per_entry * (double)b * (double)b / GIB,
         2.0 * matrix_bytes_per_entry * (double)b * (double)b / GIB);
  printf("  physical memory here:        %8.2f GiB\n", physical_memory_bytes() / GIB);
  printf("  q, k, dq, dk (b x d each):   %8.2f GiB\n", 4.0 * 4.0 * (double)n / GIB);

  memset(&r, 0, sizeof r);
  q = malloc(n * sizeof(float));
  k = malloc(n * sizeof(float));
  dq = malloc(n * sizeof(float));
  dk = malloc(n * sizeof(float));
  if (!q || !k || !dq || !dk) {
    fprintf(stderr, "demo: cannot allocate the features (%.2f GiB)\n", 16.0 * (double)n / GIB);
    return 1;
  }

  printf("[1/4] generating features: q on the unit sphere, k = normalize(q + noise)... ");
  fflush(stdout);
  t0 = now_seconds();
  make_pairs(q, k, b, d, 1.0, 42);
  memset(dq, 0, n * sizeof(float)); /* touch the outputs so the peak below counts them */
  memset(dk, 0, n * sizeof(float));
  generate_s = now_seconds() - t0;
  printf("%.1f s (peak RSS so far %.0f MiB)\n", generate_s, peak_rss_bytes() / MIB);
  {
    const double before = peak_rss_bytes();
    if (!flatmem_clip(b, d, s, threads, q, k, dq, dk, 1, &r)) return 1;
    for (i = 0; i < 2; ++i) { /* norms, and the inner products of the identity below */
      const float *g = i == 0 ? dq : dk, *x = i == 0 ? q : k;
      double sum = 0.0, inner = 0.0, magnitude = 0.0;
      int64_t row, t;
      for (row = 0; row < b; ++row) {
        double row_inner = 0.0;
        for (t = 0; t < d; ++t) {
          sum += (double)g[row * d + t] * g[row * d + t];
          row_inner += (double)g[row * d + t] * x[row * d + t];
        }
        inner += row_inner;
        magnitude += fabs(row_inner);
      }
      *(i == 0 ? &dq_norm : &dk_norm) = sqrt(sum);
      *(i == 0 ? &dq_inner : &dk_inner) = inner;
      *(i == 0 ? &dq_magnitude : &dk_magnitude) = magnitude;
    }
    printf("\nresult\n");
    printf("  loss                      %.6f   (log b = %.3f for unrelated features)\n",
           (double)r.loss, log((double)b));
    printf("  dL/ds                     %.6e\n", (double)r.dscale);
    printf("  |dq|_F, |dk|_F            %.6e, %.6e\n", dq_norm, dk_norm);
    /* sum_i <dq_i, q_i> = s sum_ij G_ij <q_i, k_j> = s dL/ds, and so is sum_j <dk_j, k_j>:
     * an O(b d) check of all three outputs at full size. Error measured against
     * sum_i |<dq_i, q_i>| (resp. dk), the size of the terms before they cancel. */
    identity_error = fmax(fabs(dq_inner - (double)s * r.dscale) / dq_magnitude,
                          fabs(dk_inner - (double)s * r.dscale) / dk_magnitude);
    printf("  <dq,q>, <dk,k>, s dL/ds   %.6e, %.6e, %.6e  (must agree: relative error %.1e, "
           "tolerance %.0e -> %s)\n",
           dq_inner, dk_inner, (double)s * (double)r.dscale, identity_error, IDENTITY_TOLERANCE,
           identity_error <= IDENTITY_TOLERANCE ? "PASS" : "FAIL");
    all_pass &= identity_error <= IDENTITY_TOLERANCE; /* false for NaN */
    printf("time\n");
    printf("  generate features         %8.2f s\n", generate_s);
    printf("  forward                   %8.2f s  (%.0f GFLOP/s)\n", r.forward_s,
           2.0 * (double)b * (double)b * (double)d / r.forward_s / 1e9);
    printf("  backward                  %8.2f s  (%.0f GFLOP/s)\n", r.backward_s,
           6.0 * (double)b * (double)b * (double)d / r.backward_s / 1e9);
    printf("memory\n");
    printf("  peak RSS (whole process)  %8.1f MiB\n", peak_rss_bytes() / MIB);
    printf("  of which features + grads %8.1f MiB  (q, k, dq, dk)\n", 16.0 * (double)n / MIB);
    printf("  growth during the loss    %8.1f MiB  (workspace query: %.2f MiB)\n",
           (peak_rss_bytes() - before) / MIB, (double)r.workspace_bytes / MIB);
    printf("  one b x b fp32 matrix     %8.1f MiB  (what a materialised loss needs, at least twice)\n",
           matrix_bytes_per_entry * (double)b * (double)b / MIB);
  }
  free(q);
  free(k);
  free(dq);
  free(dk);

  printf("\n[4/4] agreement with a materialised double-precision reference "
         "(tolerance %.0e relative to each quantity's scale)\n",
         TOLERANCE);
  all_pass &= agreement_check(256, 64, 14.3f, threads);
  all_pass &= agreement_check(300, 50, 100.0f, threads); /* odd sizes, large scale */
  printf("%s\n", all_pass ? "PASS" : "FAIL");
  return all_pass ? 0 : 1;
}
