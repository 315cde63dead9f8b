/*
 * reversible_transformer.c -- a reversible transformer segment of flatmem's
 * built-in blocks (pre-LN attention as F, pre-LN MLP as G) through the C ABI.
 *
 * Build against an installed flatmem:
 *     cc examples/reversible_transformer.c $(pkg-config --cflags --libs flatmem) -o reversible_transformer
 *     ./reversible_transformer
 *
 * What it shows:
 *   - built-in blocks: options, parameters and their gradients as DLTensors;
 *   - a segment of DEPTH blocks whose forward keeps only its output;
 *   - the OVERLAPPED backward (the rebuild of block k-1 runs on a second
 *     thread while the gradients of block k are computed), which also returns
 *     the rebuilt segment input: it matches the true input to fp32 roundoff;
 *   - VANILLA gives bitwise the same gradients;
 *   - the rebuild error over depth (flatmem_reversible_rebuild_error).
 */
#include <flatmem/flatmem.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { DEPTH = 4, BATCH = 2, TOKENS = 17, WIDTH = 48, HEADS = 4, HIDDEN = 4 * WIDTH };
enum { STATE = BATCH * TOKENS * WIDTH };

#define CHECK(call)                                                                        \
  do {                                                                                     \
    flatmem_status status_ = (call);                                                       \
    if (status_ != FLATMEM_STATUS_SUCCESS) {                                               \
      fprintf(stderr, "%s failed: %s: %s\n", #call, flatmem_status_string(status_),        \
              flatmem_last_error());                                                       \
      exit(1);                                                                             \
    }                                                                                      \
  } while (0)

/* A tiny deterministic generator: uniform in [-scale, scale). */
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static float uniform(float scale) {
  rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
  return scale * (2.0f * (float)(rng_state >> 40) / (float)(1ull << 24) - 1.0f);
}

/* A compact fp32 CPU tensor over `data`. */
static DLTensor tensor(float *data, int ndim, int64_t *shape) {
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

/* One built-in block with its 6 parameters (LN weight 1, bias 0, the rest
 * small random) and zeroed gradients, owned by the caller. */
typedef struct {
  flatmem_block_t *block;
  float *values[FLATMEM_BLOCK_NUM_PARAMETERS], *grads[FLATMEM_BLOCK_NUM_PARAMETERS];
  int64_t shapes[FLATMEM_BLOCK_NUM_PARAMETERS][2];
} Block;

static void make_block(Block *b, flatmem_block_kind kind) {
  flatmem_block_options o;
  DLTensor params[FLATMEM_BLOCK_NUM_PARAMETERS], grads[FLATMEM_BLOCK_NUM_PARAMETERS];
  const int64_t inner = kind == FLATMEM_BLOCK_ATTENTION ? 3 * WIDTH : HIDDEN;
  const int64_t second = kind == FLATMEM_BLOCK_ATTENTION ? WIDTH : HIDDEN;
  /* (rows, cols) of each parameter; rows 0 = a vector. */
  const int64_t dims[FLATMEM_BLOCK_NUM_PARAMETERS][2] = {
      {0, WIDTH}, {0, WIDTH}, {WIDTH, inner}, {0, inner}, {second, WIDTH}, {0, WIDTH}};
  int i;
  CHECK(flatmem_block_options_init(&o, sizeof(flatmem_block_options)));
  o.kind = kind;
  o.width = WIDTH;
  o.heads = HEADS;
  o.hidden = HIDDEN;
  CHECK(flatmem_block_create(&b->block, &o));
  for (i = 0; i < FLATMEM_BLOCK_NUM_PARAMETERS; ++i) {
    const int64_t n = (dims[i][0] ? dims[i][0] : 1) * dims[i][1];
    int64_t j;
    b->values[i] = malloc((size_t)n * sizeof(float));
    b->grads[i] = calloc((size_t)n, sizeof(float));
    for (j = 0; j < n; ++j) b->values[i][j] = i == 0 ? 1.0f : i == 1 ? 0.0f : uniform(0.05f);
    b->shapes[i][0] = dims[i][0] ? dims[i][0] : dims[i][1];
    b->shapes[i][1] = dims[i][1];
    params[i] = tensor(b->values[i], dims[i][0] ? 2 : 1, b->shapes[i]);
    grads[i] = tensor(b->grads[i], dims[i][0] ? 2 : 1, b->shapes[i]);
  }
  CHECK(flatmem_block_set_parameters(b->block, params, grads));
}

static void free_block(Block *b) {
  int i;
  for (i = 0; i < FLATMEM_BLOCK_NUM_PARAMETERS; ++i) free(b->values[i]), free(b->grads[i]);
  CHECK(flatmem_block_destroy(b->block));
}

static float *filled(float scale) {
  float *p = malloc(STATE * sizeof(float));
  int i;
  for (i = 0; i < STATE; ++i) p[i] = uniform(scale);
  return p;
}

int main(void) {
  Block attention[DEPTH], mlp[DEPTH];
  flatmem_reversible_block blocks[DEPTH];
  flatmem_reversible_options options;
  flatmem_reversible_t *overlapped, *vanilla;
  int64_t shape[3] = {BATCH, TOKENS, WIDTH}, depth_shape[1] = {DEPTH};
  float *x1 = filled(1), *x2 = filled(1), *dy1 = filled(1), *dy2 = filled(1);
  float *y1 = filled(0), *y2 = filled(0), *dx1 = filled(0), *dx2 = filled(0);
  float *rx1 = filled(0), *rx2 = filled(0), *vdx1 = filled(0), *vdx2 = filled(0);
  double errors[DEPTH], worst = 0;
  DLTensor tx1 = tensor(x1, 3, shape), tx2 = tensor(x2, 3, shape), ty1 = tensor(y1, 3, shape),
           ty2 = tensor(y2, 3, shape), tdy1 = tensor(dy1, 3, shape), tdy2 = tensor(dy2, 3, shape),
           tdx1 = tensor(dx1, 3, shape), tdx2 = tensor(dx2, 3, shape), trx1 = tensor(rx1, 3, shape),
           trx2 = tensor(rx2, 3, shape), tvdx1 = tensor(vdx1, 3, shape),
           tvdx2 = tensor(vdx2, 3, shape);
  DLTensor terrors;
  int k, i, same;

  for (k = 0; k < DEPTH; ++k) {
    make_block(&attention[k], FLATMEM_BLOCK_ATTENTION);
    make_block(&mlp[k], FLATMEM_BLOCK_MLP);
    CHECK(flatmem_block_function(attention[k].block, &blocks[k].f));
    CHECK(flatmem_block_function(mlp[k].block, &blocks[k].g));
  }
  CHECK(flatmem_reversible_options_init(&options, sizeof(flatmem_reversible_options)));
  options.mode = FLATMEM_REVERSIBLE_OVERLAPPED;
  CHECK(flatmem_reversible_create(&overlapped, blocks, DEPTH, &options));
  options.mode = FLATMEM_REVERSIBLE_VANILLA;
  CHECK(flatmem_reversible_create(&vanilla, blocks, DEPTH, &options));

  /* Forward: only (y1, y2) leave it. NULL workspace: the handle keeps one. */
  CHECK(flatmem_reversible_forward(overlapped, &tx1, &tx2, 1, 0, &ty1, &ty2, NULL, 0, NULL));
  /* Backward, OVERLAPPED, also returning the rebuilt input. */
  CHECK(flatmem_reversible_backward(overlapped, &ty1, &ty2, &tdy1, &tdy2, 1, 0, &tdx1, &tdx2,
                                    &trx1, &trx2, NULL, 0, NULL));
  for (i = 0; i < STATE; ++i) {
    const double e1 = (double)rx1[i] - x1[i], e2 = (double)rx2[i] - x2[i];
    if (e1 > worst || -e1 > worst) worst = e1 > 0 ? e1 : -e1;
    if (e2 > worst || -e2 > worst) worst = e2 > 0 ? e2 : -e2;
  }
  printf("segment: %d blocks (attention + MLP), state (%d, %d, %d) fp32\n", DEPTH, BATCH, TOKENS, WIDTH);
  printf("rebuilt input vs true input: max |difference| = %.3g\n", worst);

  /* VANILLA: the same gradients, bit for bit (parameter gradients accumulate
   * into the same buffers a second time here; dx is what we compare). */
  CHECK(flatmem_reversible_backward(vanilla, &ty1, &ty2, &tdy1, &tdy2, 1, 0, &tvdx1, &tvdx2, NULL,
                                    NULL, NULL, 0, NULL));
  same = memcmp(dx1, vdx1, STATE * sizeof(float)) == 0 && memcmp(dx2, vdx2, STATE * sizeof(float)) == 0;
  printf("OVERLAPPED == VANILLA bitwise: %s\n", same ? "yes" : "NO");

  terrors = tensor(NULL, 1, depth_shape);
  terrors.data = errors;
  terrors.dtype.bits = 64;
  CHECK(flatmem_reversible_rebuild_error(vanilla, &tx1, &tx2, 1, 0, &terrors, NULL));
  printf("rebuild error by block input (relative):");
  for (k = 0; k < DEPTH; ++k) printf(" %.2g", errors[k]);
  printf("\n");

  CHECK(flatmem_reversible_destroy(overlapped));
  CHECK(flatmem_reversible_destroy(vanilla));
  for (k = 0; k < DEPTH; ++k) free_block(&attention[k]), free_block(&mlp[k]);
  free(x1), free(x2), free(dy1), free(dy2), free(y1), free(y2), free(dx1), free(dx2);
  free(rx1), free(rx2), free(vdx1), free(vdx2);
  return worst < 1e-3 && same ? 0 : 1;
}
