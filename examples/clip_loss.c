/*
 * clip_loss.c -- the symmetric CLIP loss and its gradients through flatmem's C ABI.
 *
 * Build against an installed flatmem:
 *     cc examples/clip_loss.c $(pkg-config --cflags --libs flatmem) -o clip_loss
 *     ./clip_loss
 * (No -lm: the few square roots below are done by hand so that the line above
 * is the whole build.)
 *
 * What it shows:
 *   - wrapping plain C arrays as DLPack DLTensors (compact row-major, kDLCPU);
 *   - the handle life cycle (create / destroy);
 *   - asking the workspace sizes and passing one caller-owned workspace to both
 *     the forward and the backward;
 *   - checking every status and printing flatmem_status_string + flatmem_last_error;
 *   - the saved state between forward and backward: row_lse and col_lse;
 *   - a finite-difference check of dL/ds using two more forward calls.
 *
 * Features: b pairs (q_i, k_i) of unit vectors in R^d, k_i a noisy copy of q_i,
 * so the loss is well below the log(b) of unrelated features. s = 14.3 is
 * CLIP's initial logit scale 1/0.07.
 */
#include <flatmem/flatmem.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { BATCH = 512, DIM = 128 };
static const float LOGIT_SCALE = 14.3f;

/* ---- DLPack views of plain arrays --------------------------------------- */

/* A compact row-major fp32 tensor of ndim 0, 1 or 2 over `data`. `shape`
 * must outlive the returned DLTensor (flatmem only reads it during a call). */
static DLTensor fp32_tensor(float *data, int ndim, int64_t *shape) {
  DLTensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.device.device_type = kDLCPU;
  t.device.device_id = 0;
  t.ndim = ndim;
  t.dtype.code = kDLFloat;
  t.dtype.bits = 32;
  t.dtype.lanes = 1;
  t.shape = shape;
  t.strides = NULL; /* compact row-major */
  t.byte_offset = 0;
  return t;
}

/* ---- error handling ------------------------------------------------------ */

/* Returns 1 on success; otherwise prints what failed and returns 0. */
static int ok(flatmem_status status, const char *what) {
  if (status == FLATMEM_STATUS_SUCCESS) return 1;
  fprintf(stderr, "clip_loss: %s failed: %s: %s\n", what, flatmem_status_string(status),
          flatmem_last_error());
  return 0;
}

/* ---- random features ------------------------------------------------------ */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static double uniform01(void) { /* splitmix64 -> [0, 1) */
  uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return (double)(z >> 11) / 9007199254740992.0;
}

/* Roughly standard normal: a sum of 12 uniforms minus 6 (mean 0, variance 1). */
static double normal01(void) {
  double sum = -6.0;
  int i;
  for (i = 0; i < 12; ++i) sum += uniform01();
  return sum;
}

/* sqrt(x) for x >= 0 by Newton's method (converges in a few dozen steps at most). */
static double square_root(double x) {
  double r = x > 1.0 ? x : 1.0, previous = 0.0;
  if (x <= 0.0) return 0.0;
  while (r != previous) {
    previous = r;
    r = 0.5 * (r + x / r);
    if (r >= previous) break; /* monotone from above: stop at the fixed point */
  }
  return r;
}

static void normalize_rows(float *m, int rows, int cols) {
  int i, j;
  for (i = 0; i < rows; ++i) {
    double norm = 0.0;
    for (j = 0; j < cols; ++j) norm += (double)m[i * cols + j] * m[i * cols + j];
    norm = square_root(norm);
    for (j = 0; j < cols; ++j) m[i * cols + j] = (float)(m[i * cols + j] / norm);
  }
}

static double frobenius(const float *m, size_t n) {
  double sum = 0.0;
  size_t i;
  for (i = 0; i < n; ++i) sum += (double)m[i] * m[i];
  return square_root(sum);
}

/* ---- the program ------------------------------------------------------------ */

int main(void) {
  const size_t n = (size_t)BATCH * DIM;
  int exit_code = 1, i;
  size_t j;
  flatmem_contrastive_t *handle = NULL;
  float *q = malloc(n * sizeof(float)), *k = malloc(n * sizeof(float));
  float *dq = malloc(n * sizeof(float)), *dk = malloc(n * sizeof(float));
  float *row_lse = malloc(BATCH * sizeof(float)), *col_lse = malloc(BATCH * sizeof(float));
  float scale = LOGIT_SCALE, loss = 0.0f, dscale = 0.0f;
  void *workspace = NULL;
  size_t forward_bytes = 0, backward_bytes = 0, workspace_bytes;

  /* Shapes: q, k, dq, dk are (b, d); row_lse, col_lse (b,); scalars ndim 0. */
  int64_t matrix_shape[2] = {BATCH, DIM}, vector_shape[1] = {BATCH};
  DLTensor q_t = fp32_tensor(q, 2, matrix_shape), k_t = fp32_tensor(k, 2, matrix_shape);
  DLTensor dq_t = fp32_tensor(dq, 2, matrix_shape), dk_t = fp32_tensor(dk, 2, matrix_shape);
  DLTensor row_lse_t = fp32_tensor(row_lse, 1, vector_shape);
  DLTensor col_lse_t = fp32_tensor(col_lse, 1, vector_shape);
  DLTensor scale_t = fp32_tensor(&scale, 0, NULL), loss_t = fp32_tensor(&loss, 0, NULL);
  DLTensor dscale_t = fp32_tensor(&dscale, 0, NULL);
  flatmem_contrastive_options options = FLATMEM_CONTRASTIVE_OPTIONS_INIT;

  if (!q || !k || !dq || !dk || !row_lse || !col_lse) {
    fprintf(stderr, "clip_loss: out of memory\n");
    goto done;
  }
  if (flatmem_version() != FLATMEM_VERSION)
    fprintf(stderr, "clip_loss: warning: header %d, library %d\n", FLATMEM_VERSION,
            flatmem_version());

  /* q_i random on the unit sphere; k_i = normalize(q_i + noise). */
  for (j = 0; j < n; ++j) q[j] = (float)normal01();
  for (j = 0; j < n; ++j) k[j] = q[j] + (float)(0.8 * normal01());
  normalize_rows(q, BATCH, DIM);
  normalize_rows(k, BATCH, DIM);

  options.loss = FLATMEM_CONTRASTIVE_SYMMETRIC; /* the default, spelled out */
  if (!ok(flatmem_contrastive_create(&handle, &options), "flatmem_contrastive_create")) goto done;

  /* One caller workspace large enough for both passes (any alignment will do). */
  if (!ok(flatmem_contrastive_forward_workspace_size(handle, &q_t, &k_t, &forward_bytes),
          "flatmem_contrastive_forward_workspace_size") ||
      !ok(flatmem_contrastive_backward_workspace_size(handle, &q_t, &k_t, &dq_t, &dk_t,
                                                      &backward_bytes),
          "flatmem_contrastive_backward_workspace_size"))
    goto done;
  workspace_bytes = forward_bytes > backward_bytes ? forward_bytes : backward_bytes;
  workspace = malloc(workspace_bytes);
  if (!workspace) {
    fprintf(stderr, "clip_loss: cannot allocate %zu bytes of workspace\n", workspace_bytes);
    goto done;
  }

  /* Forward: the loss and the saved log-sum-exp vectors. No labels (row i
   * pairs with column i). */
  if (!ok(flatmem_contrastive_forward(handle, &q_t, &k_t, NULL, &scale_t, &loss_t, &row_lse_t,
                                      &col_lse_t, workspace, workspace_bytes, NULL),
          "flatmem_contrastive_forward"))
    goto done;

  /* Backward with dloss = NULL (g = 1): dq, dk and dL/ds. */
  if (!ok(flatmem_contrastive_backward(handle, &q_t, &k_t, NULL, &scale_t, &row_lse_t, &col_lse_t,
                                       NULL, &dq_t, &dk_t, &dscale_t, workspace, workspace_bytes,
                                       NULL),
          "flatmem_contrastive_backward"))
    goto done;

  printf("flatmem %s: symmetric CLIP loss, b = %d, d = %d, s = %.1f\n", flatmem_version_string(),
         BATCH, DIM, (double)LOGIT_SCALE);
  printf("  workspace       %zu bytes (forward %zu, backward %zu)\n", workspace_bytes,
         forward_bytes, backward_bytes);
  printf("  loss            %.6f   (about log b = 6.24 for unrelated features)\n", (double)loss);
  printf("  dL/ds           %.6f\n", (double)dscale);
  printf("  |dq|_F          %.6e\n", frobenius(dq, n));
  printf("  |dk|_F          %.6e\n", frobenius(dk, n));
  printf("  |dq_0|, |dk_0|  %.6e, %.6e\n", frobenius(dq, DIM), frobenius(dk, DIM));
  printf("  row_lse[0..2]   %.5f %.5f %.5f\n", (double)row_lse[0], (double)row_lse[1],
         (double)row_lse[2]);

  /* dL/ds against a central difference of two more forward calls. */
  {
    const float h = 0.01f;
    float losses[2];
    for (i = 0; i < 2; ++i) {
      scale = LOGIT_SCALE + (i == 0 ? h : -h);
      if (!ok(flatmem_contrastive_forward(handle, &q_t, &k_t, NULL, &scale_t, &loss_t, &row_lse_t,
                                          &col_lse_t, workspace, workspace_bytes, NULL),
              "flatmem_contrastive_forward (finite difference)"))
        goto done;
      losses[i] = loss;
    }
    scale = LOGIT_SCALE;
    printf("  (L(s+h) - L(s-h)) / 2h = %.6f with h = %.2f (compare dL/ds)\n",
           ((double)losses[0] - (double)losses[1]) / (2.0 * h), (double)h);
  }

  /* Errors come back as statuses with a message, and nothing is written:
   * here a logit scale that is not > 0. */
  scale = -1.0f;
  {
    flatmem_status status =
        flatmem_contrastive_forward(handle, &q_t, &k_t, NULL, &scale_t, &loss_t, &row_lse_t,
                                    &col_lse_t, workspace, workspace_bytes, NULL);
    printf("  with s = -1:    %s: %s\n", flatmem_status_string(status), flatmem_last_error());
    if (status == FLATMEM_STATUS_SUCCESS) goto done; /* a negative scale must be refused */
  }
  exit_code = 0;

done:
  if (handle && !ok(flatmem_contrastive_destroy(handle), "flatmem_contrastive_destroy"))
    exit_code = 1;
  free(workspace);
  free(q);
  free(k);
  free(dq);
  free(dk);
  free(row_lse);
  free(col_lse);
  return exit_code;
}
