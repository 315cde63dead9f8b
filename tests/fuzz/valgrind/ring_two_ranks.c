/*
 * ring_two_ranks.c -- the multi-process program scripts/test-valgrind.sh runs under
 * valgrind memcheck: two ranks (this process, rank 0, and a fork()ed rank 1) over UCX on
 * loopback, as docs/communicators.md and docs/contrastive/ring.md
 * use them: unique id from rank 0 (handed to rank 1 through a pipe),
 * flatmem_comm_create, an all-reduce, a ring shift, then the ring contrastive loss
 * (symmetric, b = 6 rows per rank, d = 8) forward and backward, and destroy.
 * Exit status 0 when both ranks succeeded and rank 1 exited 0.
 * Usage: ring_two_ranks   (UCX_TLS=tcp,self UCX_NET_DEVICES=lo recommended)
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <flatmem/flatmem.h>

#define B 6
#define D 8

static int check(flatmem_status s, const char *what, int rank) {
  if (s == FLATMEM_STATUS_SUCCESS) return 0;
  fprintf(stderr, "rank %d: %s: %s: %s\n", rank, what, flatmem_status_string(s), flatmem_last_error());
  return 1;
}

static DLTensor tensor(float *data, int ndim, int64_t *shape) {
  DLTensor t = {0};
  t.data = data;
  t.device.device_type = kDLCPU;
  t.dtype.code = kDLFloat;
  t.dtype.bits = 32;
  t.dtype.lanes = 1;
  t.ndim = ndim;
  t.shape = shape;
  return t;
}

static int run_rank(int rank, const flatmem_comm_unique_id *id) {
  flatmem_comm_options co = FLATMEM_COMM_OPTIONS_INIT;
  flatmem_contrastive_options o = FLATMEM_CONTRASTIVE_OPTIONS_INIT;
  flatmem_comm_t *comm = NULL;
  flatmem_contrastive_t *loss_handle = NULL;
  float q[B * D], k[B * D], dq[B * D], dk[B * D], v[4], w[4];
  float scale = 10.0f, loss = 0, row_lse[B], col_lse[B], dscale = 0;
  int64_t matrix_shape[2] = {B, D}, vector_shape[1] = {B}, four[1] = {4};
  DLTensor tq = tensor(q, 2, matrix_shape), tk = tensor(k, 2, matrix_shape);
  DLTensor tdq = tensor(dq, 2, matrix_shape), tdk = tensor(dk, 2, matrix_shape);
  DLTensor ts = tensor(&scale, 0, NULL), tl = tensor(&loss, 0, NULL), tds = tensor(&dscale, 0, NULL);
  DLTensor trow = tensor(row_lse, 1, vector_shape), tcol = tensor(col_lse, 1, vector_shape);
  DLTensor tv = tensor(v, 1, four), tw = tensor(w, 1, four);
  int i, failed = 0;

  for (i = 0; i < B * D; ++i) {
    q[i] = (float)((i * 7 + rank * 3) % 11 - 5) / 8.0f;
    k[i] = (float)((i * 5 + rank) % 13 - 6) / 8.0f;
  }
  for (i = 0; i < 4; ++i) v[i] = (float)(rank + i);
  co.timeout_ms = 20000;
  co.connect_timeout_ms = 60000; /* valgrind is slow to start a UCX context */
  if (check(flatmem_comm_create(&comm, rank, 2, id, &co), "flatmem_comm_create", rank)) return 1;
  failed |= check(flatmem_comm_all_reduce(comm, &tv, &tv, 0, NULL), "all_reduce", rank);
  for (i = 0; i < 4 && !failed; ++i)
    if (v[i] != (float)(1 + 2 * i)) failed = check(FLATMEM_STATUS_INTERNAL, "all_reduce value", rank);
  failed |= check(flatmem_comm_ring_shift(comm, &tv, &tw, 0, NULL), "ring_shift", rank);
  o.comm = comm;
  o.num_threads = 2;
  failed |= check(flatmem_contrastive_create(&loss_handle, &o), "flatmem_contrastive_create", rank);
  if (!failed) {
    failed |= check(flatmem_contrastive_forward(loss_handle, &tq, &tk, NULL, &ts, &tl, &trow, &tcol, NULL, 0, NULL),
                    "ring forward", rank);
    failed |= check(flatmem_contrastive_backward(loss_handle, &tq, &tk, NULL, &ts, &trow, &tcol, NULL, &tdq, &tdk,
                                                 &tds, NULL, 0, NULL),
                    "ring backward", rank);
    if (!failed && !(loss > 0.0f)) failed = check(FLATMEM_STATUS_INTERNAL, "loss > 0", rank);
  }
  failed |= check(flatmem_contrastive_destroy(loss_handle), "flatmem_contrastive_destroy", rank);
  failed |= check(flatmem_comm_destroy(comm), "flatmem_comm_destroy", rank);
  if (!failed) printf("rank %d: loss %.6f, all-reduce and ring shift fine\n", rank, loss);
  return failed;
}

int main(void) {
  int channel[2], status = 0, failed;
  flatmem_comm_unique_id id;
  pid_t child;
  if (pipe(channel) != 0) return 2;
  child = fork();
  if (child < 0) return 2;
  if (child == 0) { /* rank 1: the id arrives through the pipe */
    size_t got = 0;
    close(channel[1]);
    while (got < sizeof id) {
      ssize_t n = read(channel[0], (char *)&id + got, sizeof id - got);
      if (n <= 0) return 3;
      got += (size_t)n;
    }
    close(channel[0]);
    return run_rank(1, &id);
  }
  close(channel[0]);
  if (check(flatmem_comm_unique_id_create("127.0.0.1:0", &id), "flatmem_comm_unique_id_create", 0)) {
    close(channel[1]);
    waitpid(child, &status, 0);
    return 1;
  }
  if (write(channel[1], &id, sizeof id) != (ssize_t)sizeof id) return 2;
  close(channel[1]);
  failed = run_rank(0, &id);
  if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fprintf(stderr, "rank 1 failed (wait status %d)\n", status);
    failed = 1;
  }
  return failed;
}
