/*
 * consumer.c -- the smallest program that uses an *installed* flatmem: it checks
 * that the header and the loaded library agree on the version, then runs one
 * symmetric-loss forward and backward on 4 pairs of 8-dim features.
 *
 * Built by scripts/check-install.sh through the CMake package (find_package/;
 * the pkg-config route builds examples/clip_loss.c). Exit status 0 means the
 * install can be compiled against, linked and loaded.
 */
#include <flatmem/flatmem.h>

#include <stdio.h>
#include <string.h>

enum { B = 4, D = 8 };

static DLTensor fp32(float *data, int ndim, int64_t *shape) {
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

static int check(flatmem_status s, const char *what) {
  if (s == FLATMEM_STATUS_SUCCESS) return 1;
  fprintf(stderr, "consumer: %s: %s: %s\n", what, flatmem_status_string(s), flatmem_last_error());
  return 0;
}

int main(void) {
  float q[B * D], k[B * D], dq[B * D], dk[B * D], row_lse[B], col_lse[B];
  float scale = 1.0f, loss = -1.0f, dscale = 0.0f;
  int64_t mat[2] = {B, D}, vec[1] = {B};
  int i, ok;
  flatmem_contrastive_t *h = NULL;
  flatmem_contrastive_options opt = FLATMEM_CONTRASTIVE_OPTIONS_INIT;
  DLTensor tq = fp32(q, 2, mat), tk = fp32(k, 2, mat), tdq = fp32(dq, 2, mat), tdk = fp32(dk, 2, mat);
  DLTensor ts = fp32(&scale, 0, NULL), tl = fp32(&loss, 0, NULL), tds = fp32(&dscale, 0, NULL);
  DLTensor trow = fp32(row_lse, 1, vec), tcol = fp32(col_lse, 1, vec);

  if (flatmem_version() != FLATMEM_VERSION) {
    fprintf(stderr, "consumer: header says %d, library says %d\n", FLATMEM_VERSION, flatmem_version());
    return 1;
  }
  for (i = 0; i < B * D; ++i) { /* k_i = q_i: the loss is below log(B) but not 0 */
    q[i] = (float)((i * 37 % 17) - 8) / 8.0f;
    k[i] = q[i];
  }
  opt.num_threads = 2;
  if (!check(flatmem_contrastive_create(&h, &opt), "create")) return 1;
  ok = check(flatmem_contrastive_forward(h, &tq, &tk, NULL, &ts, &tl, &trow, &tcol, NULL, 0, NULL),
             "forward") &&
       check(flatmem_contrastive_backward(h, &tq, &tk, NULL, &ts, &trow, &tcol, NULL, &tdq, &tdk,
                                          &tds, NULL, 0, NULL),
             "backward");
  if (!check(flatmem_contrastive_destroy(h), "destroy")) ok = 0;
  if (ok && !(loss > 0.0f && loss < 1.3863f)) {
    fprintf(stderr, "consumer: loss %g outside (0, log 4)\n", (double)loss);
    ok = 0;
  }
  if (!ok) return 1;
  printf("flatmem %s: installed library works (loss %.4f, dL/ds %.4f)\n", flatmem_version_string(),
         (double)loss, (double)dscale);
  return 0;
}
