/*
 * A caller of the C ABI compiled against the FROZEN headers of ABI 1
 * (tests/abi/v1/, a copy of include/flatmem/ at the release of ABI 1, never
 * edited) and run against the library built from this tree: the caller of an
 * older release meets a newer library. Built twice:
 *
 *   abi_old_caller   every struct exactly as the frozen header lays it out
 *   abi_new_caller   -DABI_NEWER_CALLER: every struct as a NEWER header
 *                    would lay it out, with APPENDED bytes of fields this
 *                    library does not know appended (a caller ahead of its
 *                    library, the reverse case)
 *
 * Every struct the library reads or writes lives in a heap block of exactly
 * the caller's size followed by guard bytes, so a write past the caller's
 * struct is caught by the guard check in every build and by ASan in the
 * sanitizer suite (which builds this with the library instrumented). For the
 * newer caller the appended bytes must read 0 after the library filled the
 * struct, and an options struct that sets them must be refused with
 * FLATMEM_STATUS_UNSUPPORTED. Exit status 0 when every check held; every
 * failed check prints one line.
 */
#include <flatmem/flatmem.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef ABI_NEWER_CALLER
#define APPENDED 24
#define CALLER "new caller"
#else
#define APPENDED 0
#define CALLER "old caller"
#endif
#define GUARD 64
#define GUARD_BYTE 0xA5

static int failures = 0;

#define CHECK(cond)                                                                      \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      ++failures;                                                                        \
      fprintf(stderr, "abi_caller (" CALLER "): line %d: CHECK(%s) failed; last error: %s\n", \
              __LINE__, #cond, flatmem_last_error());                                    \
    }                                                                                    \
  } while (0)

#define OK(call) CHECK((call) == FLATMEM_STATUS_SUCCESS)

/* The caller's size of a struct type: the frozen sizeof plus what a newer
 * header appended. */
#define SIZE(type) (sizeof(type) + APPENDED)

/* A struct of `size` bytes on the heap, filled with GUARD_BYTE, then GUARD
 * guard bytes. */
static void *caller_struct(size_t size) {
  unsigned char *p = (unsigned char *)malloc(size + GUARD);
  if (p == NULL) {
    fprintf(stderr, "abi_caller: out of memory\n");
    exit(2);
  }
  memset(p, GUARD_BYTE, size + GUARD);
  return p;
}

/* Bytes known .. size - 1 (the appended fields) zero. */
static void check_zero(const void *p, size_t known, size_t size, int line) {
  const unsigned char *b = (const unsigned char *)p;
  size_t i;
  for (i = known; i < size; ++i)
    if (b[i] != 0) {
      ++failures;
      fprintf(stderr, "abi_caller (" CALLER "): line %d: byte %zu of an appended field is 0x%02x, not 0\n",
              line, i, b[i]);
      return;
    }
}

/* The GUARD bytes after the caller's `size` untouched. */
static void check_guard(const void *p, size_t size, int line) {
  const unsigned char *b = (const unsigned char *)p;
  size_t i;
  for (i = size; i < size + GUARD; ++i)
    if (b[i] != GUARD_BYTE) {
      ++failures;
      fprintf(stderr, "abi_caller (" CALLER "): line %d: the library wrote byte %zu, past the caller's %zu\n",
              line, i, size);
      return;
    }
}

static void check_struct(const void *p, size_t known, size_t size, int line) {
  check_zero(p, known, size, line);
  check_guard(p, size, line);
}
#define CHECK_STRUCT(p, type) check_struct((p), sizeof(type), SIZE(type), __LINE__)

/* An options struct read by create: with APPENDED bytes, they must be 0 to be
 * accepted; a non-zero one is refused. Sets the first appended byte and
 * calls `create` expecting UNSUPPORTED, then clears it. */
#define CHECK_UNKNOWN_FIELD_REFUSED(options, type, create_call)                        \
  do {                                                                               \
    if (APPENDED > 0) {                                                              \
      ((unsigned char *)(options))[sizeof(type)] = 1;                                \
      CHECK((create_call) == FLATMEM_STATUS_UNSUPPORTED);                            \
      CHECK(strstr(flatmem_last_error(), "newer flatmem.h") != NULL);                \
      ((unsigned char *)(options))[sizeof(type)] = 0;                                \
    }                                                                                \
  } while (0)

/* A CPU fp32 tensor of `ndim` dimensions (0: a scalar). */
static DLTensor tensor_f32(float *data, int32_t ndim, int64_t *shape) {
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

static void contrastive(void) {
  flatmem_contrastive_options *o = caller_struct(SIZE(flatmem_contrastive_options));
  flatmem_contrastive_t *h = NULL;
  OK(flatmem_contrastive_options_init(o, SIZE(flatmem_contrastive_options)));
  CHECK_STRUCT(o, flatmem_contrastive_options);
  CHECK(o->struct_size == SIZE(flatmem_contrastive_options));
  CHECK(o->loss == FLATMEM_CONTRASTIVE_DEFAULT && o->num_threads == 0 && o->comm == NULL &&
        o->logit_cache_bytes == 0);
  o->num_threads = 1;
  CHECK_UNKNOWN_FIELD_REFUSED(o, flatmem_contrastive_options, flatmem_contrastive_create(&h, o));
  CHECK(h == NULL);
  OK(flatmem_contrastive_create(&h, o));
  {
    /* A real call: loss of two aligned pairs, the handle works. */
    float q[2 * 3] = {1, 0, 0, 0, 1, 0}, scale = 1.0f, loss = -1.0f, row_lse[2], col_lse[2];
    int64_t shape[2] = {2, 3}, two = 2;
    DLTensor tq = tensor_f32(q, 2, shape), ts = tensor_f32(&scale, 0, NULL), tl = tensor_f32(&loss, 0, NULL),
             tr = tensor_f32(row_lse, 1, &two), tc = tensor_f32(col_lse, 1, &two);
    OK(flatmem_contrastive_forward(h, &tq, &tq, NULL, &ts, &tl, &tr, &tc, NULL, 0, NULL));
    CHECK(loss > 0.0f && loss < 1.0f); /* 2 pairs at s = 1, cos 1 vs 0: log(1 + e^-1) = 0.313 */
  }
  OK(flatmem_contrastive_destroy(h));
  free(o);
}

static void reversible(void) {
  flatmem_reversible_options *ro = caller_struct(SIZE(flatmem_reversible_options));
  flatmem_block_options *bo = caller_struct(SIZE(flatmem_block_options));
  flatmem_block_t *f = NULL, *g = NULL;
  flatmem_reversible_block block;
  flatmem_reversible_t *seg = NULL;
  OK(flatmem_reversible_options_init(ro, SIZE(flatmem_reversible_options)));
  CHECK_STRUCT(ro, flatmem_reversible_options);
  CHECK(ro->struct_size == SIZE(flatmem_reversible_options) && ro->mode == FLATMEM_REVERSIBLE_AUTO);
  OK(flatmem_block_options_init(bo, SIZE(flatmem_block_options)));
  CHECK_STRUCT(bo, flatmem_block_options);
  CHECK(bo->struct_size == SIZE(flatmem_block_options) && bo->math == 0);
  bo->kind = FLATMEM_BLOCK_MLP;
  bo->width = 4;
  CHECK_UNKNOWN_FIELD_REFUSED(bo, flatmem_block_options, flatmem_block_create(&f, bo));
  OK(flatmem_block_create(&f, bo));
  OK(flatmem_block_create(&g, bo));
  OK(flatmem_block_function(f, &block.f));
  OK(flatmem_block_function(g, &block.g));
  ro->num_threads = 1;
  CHECK_UNKNOWN_FIELD_REFUSED(ro, flatmem_reversible_options, flatmem_reversible_create(&seg, &block, 1, ro));
  OK(flatmem_reversible_create(&seg, &block, 1, ro));
  OK(flatmem_reversible_destroy(seg));
  OK(flatmem_block_destroy(f));
  OK(flatmem_block_destroy(g));
  free(ro);
  free(bo);
}

/* Cyclic DP over a group of one: schedule queries, a whole run through
 * next() and reduce(), then the statistics array and the summary. */
static void cyclic(flatmem_comm_t *comm) {
  enum { kept = 64 };
  flatmem_cyclic_options *o = caller_struct(SIZE(flatmem_cyclic_options));
  flatmem_cyclic_schedule *s = caller_struct(SIZE(flatmem_cyclic_schedule));
  flatmem_cyclic_action *a = caller_struct(SIZE(flatmem_cyclic_action));
  flatmem_cyclic_summary *summary = caller_struct(SIZE(flatmem_cyclic_summary));
  unsigned char *stats = caller_struct(kept * SIZE(flatmem_cyclic_time_step_stats));
  flatmem_cyclic_t *h = NULL;
  /* One gradient buffer per stage and step parity: a handed-over gradient
   * stays the chain's until its update is returned (DELAY1). */
  float gradient[2][2][4] = {{{1, 2, 3, 4}, {1, 2, 3, 4}}, {{1, 2, 3, 4}, {1, 2, 3, 4}}};
  int64_t n = 4, written = -1, length = 0, i, backwards = 0;
  DLTensor t;
  flatmem_status st;

  OK(flatmem_cyclic_options_init(o, SIZE(flatmem_cyclic_options)));
  CHECK_STRUCT(o, flatmem_cyclic_options);
  o->stages = 2;
  o->steps = 3;
  CHECK_UNKNOWN_FIELD_REFUSED(o, flatmem_cyclic_options, flatmem_cyclic_create(&h, comm, o));
  OK(flatmem_cyclic_create(&h, comm, o));
  OK(flatmem_cyclic_get_schedule(h, s, SIZE(flatmem_cyclic_schedule)));
  CHECK_STRUCT(s, flatmem_cyclic_schedule);
  CHECK(s->struct_size == SIZE(flatmem_cyclic_schedule) && s->world_size == 1 && s->stages == 2 &&
        s->steps == 3);
  /* The schedule goes back in as an input, appended bytes (zero) and all. */
  OK(flatmem_cyclic_schedule_length(s, &length));
  CHECK(length > 0);
  OK(flatmem_cyclic_schedule_action(s, 0, 0, a, SIZE(flatmem_cyclic_action)));
  CHECK_STRUCT(a, flatmem_cyclic_action);
  CHECK(a->time_step == 0 && a->kind == FLATMEM_CYCLIC_FORWARD && a->stage == 0);
  for (;;) {
    memset(a, GUARD_BYTE, SIZE(flatmem_cyclic_action));
    st = flatmem_cyclic_next(h, a, SIZE(flatmem_cyclic_action));
    if (st != FLATMEM_STATUS_SUCCESS) break;
    CHECK_STRUCT(a, flatmem_cyclic_action);
    if (a->kind == FLATMEM_CYCLIC_DONE) break;
    if (a->kind == FLATMEM_CYCLIC_BACKWARD) {
      t = tensor_f32(gradient[a->stage][a->step % 2], 1, &n);
      OK(flatmem_cyclic_reduce(h, a->stage, &t));
      ++backwards;
    }
  }
  CHECK(st == FLATMEM_STATUS_SUCCESS && a->kind == FLATMEM_CYCLIC_DONE);
  CHECK(backwards == 2 * 3);
  OK(flatmem_cyclic_stats(h, 0, kept, (flatmem_cyclic_time_step_stats *)stats,
                          SIZE(flatmem_cyclic_time_step_stats), &written));
  CHECK(written == length);
  for (i = 0; i < written; ++i) {
    const flatmem_cyclic_time_step_stats *e =
        (const flatmem_cyclic_time_step_stats *)(stats + i * SIZE(flatmem_cyclic_time_step_stats));
    CHECK(e->time_step == i);
    check_zero(e, sizeof *e, SIZE(flatmem_cyclic_time_step_stats), __LINE__);
  }
  check_guard(stats, kept * SIZE(flatmem_cyclic_time_step_stats), __LINE__);
  OK(flatmem_cyclic_summary_get(h, summary, SIZE(flatmem_cyclic_summary)));
  CHECK_STRUCT(summary, flatmem_cyclic_summary);
  CHECK(summary->time_steps == length && summary->peak_activation_bytes == 2);
  OK(flatmem_cyclic_destroy(h));
  free(o);
  free(s);
  free(a);
  free(summary);
  free(stats);
}

/* The stage-parallel schedule queries and a handle over a group of one. */
static void cyclic_stages(flatmem_comm_t *comm) {
  flatmem_cyclic_stages_options *o = caller_struct(SIZE(flatmem_cyclic_stages_options));
  flatmem_cyclic_stages_schedule *s = caller_struct(SIZE(flatmem_cyclic_stages_schedule));
  flatmem_cyclic_stages_action *a = caller_struct(SIZE(flatmem_cyclic_stages_action));
  flatmem_cyclic_stages_action *list = caller_struct(4 * SIZE(flatmem_cyclic_stages_action));
  flatmem_cyclic_stages_occupancy *occupancy = caller_struct(SIZE(flatmem_cyclic_stages_occupancy));
  flatmem_cyclic_stages_summary *summary = caller_struct(SIZE(flatmem_cyclic_stages_summary));
  unsigned char *stats = caller_struct(8 * SIZE(flatmem_cyclic_stages_time_step_stats));
  flatmem_cyclic_stages_t *h = NULL;
  int32_t count = -1;
  int64_t written = -1;

  OK(flatmem_cyclic_stages_options_init(o, SIZE(flatmem_cyclic_stages_options)));
  CHECK_STRUCT(o, flatmem_cyclic_stages_options);
  o->stages = 1;
  o->micro_batches = 2;
  o->steps = 2;
  CHECK_UNKNOWN_FIELD_REFUSED(o, flatmem_cyclic_stages_options, flatmem_cyclic_stages_create(&h, comm, o));
  OK(flatmem_cyclic_stages_create(&h, comm, o));
  OK(flatmem_cyclic_stages_get_schedule(h, s, SIZE(flatmem_cyclic_stages_schedule)));
  CHECK_STRUCT(s, flatmem_cyclic_stages_schedule);
  CHECK(s->struct_size == SIZE(flatmem_cyclic_stages_schedule) && s->stages == 1 && s->micro_batches == 2);
  OK(flatmem_cyclic_stages_schedule_actions(s, 0, 0, list, SIZE(flatmem_cyclic_stages_action), 4, &count));
  CHECK(count >= 1 && count <= 4);
  check_guard(list, 4 * SIZE(flatmem_cyclic_stages_action), __LINE__);
  if (count >= 1) {
    CHECK(list->time_step == 0 && list->kind == FLATMEM_CYCLIC_FORWARD);
    check_zero(list, sizeof *list, SIZE(flatmem_cyclic_stages_action), __LINE__);
  }
  OK(flatmem_cyclic_stages_schedule_occupancy(s, 0, occupancy, SIZE(flatmem_cyclic_stages_occupancy)));
  CHECK_STRUCT(occupancy, flatmem_cyclic_stages_occupancy);
  OK(flatmem_cyclic_stages_next(h, a, SIZE(flatmem_cyclic_stages_action)));
  CHECK_STRUCT(a, flatmem_cyclic_stages_action);
  CHECK(a->kind == FLATMEM_CYCLIC_FORWARD && a->time_step == 0);
  OK(flatmem_cyclic_stages_stats(h, 0, 8, (flatmem_cyclic_stages_time_step_stats *)stats,
                                 SIZE(flatmem_cyclic_stages_time_step_stats), &written));
  CHECK(written == 1);
  check_zero(stats, sizeof(flatmem_cyclic_stages_time_step_stats), SIZE(flatmem_cyclic_stages_time_step_stats),
             __LINE__);
  check_guard(stats, 8 * SIZE(flatmem_cyclic_stages_time_step_stats), __LINE__);
  OK(flatmem_cyclic_stages_summary_get(h, summary, SIZE(flatmem_cyclic_stages_summary)));
  CHECK_STRUCT(summary, flatmem_cyclic_stages_summary);
  OK(flatmem_cyclic_stages_destroy(h)); /* before DONE: poisons the group of one */
  free(o);
  free(s);
  free(a);
  free(list);
  free(occupancy);
  free(summary);
  free(stats);
}

int main(void) {
  flatmem_comm_options *co = caller_struct(SIZE(flatmem_comm_options));
  flatmem_comm_t *comm = NULL;
  /* The header this caller was compiled with is ABI 1; the library must be
   * ABI 1 too (a library of another ABI has another SONAME and would not
   * have loaded). */
  printf("abi_caller (%s): frozen flatmem.h %d, loaded libflatmem %s\n", CALLER, FLATMEM_VERSION,
         flatmem_version_string());
  CHECK(flatmem_version() >= FLATMEM_VERSION);
  contrastive();
  reversible();
  OK(flatmem_comm_options_init(co, SIZE(flatmem_comm_options)));
  CHECK_STRUCT(co, flatmem_comm_options);
  CHECK_UNKNOWN_FIELD_REFUSED(co, flatmem_comm_options, flatmem_comm_create_local(&comm, 1, co));
  OK(flatmem_comm_create_local(&comm, 1, co));
  cyclic(comm);
  OK(flatmem_comm_destroy(comm));
  comm = NULL;
  OK(flatmem_comm_create_local(&comm, 1, co));
  cyclic_stages(comm);
  OK(flatmem_comm_destroy(comm));
  free(co);
  if (failures) {
    fprintf(stderr, "abi_caller (%s): %d checks failed\n", CALLER, failures);
    return 1;
  }
  printf("abi_caller (%s): every check held\n", CALLER);
  return 0;
}
