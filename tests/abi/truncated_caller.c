/*
 * Every older caller at once: each struct the library reads or writes, cut
 * short at every size a caller could have compiled it with (the library's
 * rules: flatmem.h, "Conventions").
 *
 * Structs the library WRITES (init functions, schedules, actions, occupancy,
 * statistics, summaries) are passed with every size from 0 to sizeof + 8,
 * one byte at a time, in a heap block followed by guard bytes. Below the
 * struct's minimum the call must fail with INVALID_ARGUMENT and leave every
 * byte as it was; from the minimum on it must succeed, write the same bytes
 * as a full-size call up to the size (a prefix; the init functions' own
 * struct_size aside), zeros past the library's sizeof, and not one byte past
 * the size (the guard).
 *
 * Structs the library READS (options, schedules) are passed cut at every
 * field boundary (every 4 bytes: no public struct has padding and every field
 * is 4 or 8 bytes) in a heap block of exactly that size, so that a read past
 * it is caught by ASan in the sanitizer suite, and followed by nothing the
 * library may use: the call must succeed when the required fields fit and
 * fail with INVALID_ARGUMENT naming the first one that does not otherwise.
 * Exit status 0 when every check held; each failed check prints a line.
 */
#include <flatmem/cyclic.h>
#include <flatmem/cyclic_stages.h>
#include <flatmem/flatmem.h>
#include <flatmem/reversible.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GUARD 32
#define FILL 0xA5

static int failures = 0, calls = 0;

static void fail_line(int line, const char *what, size_t size, const char *detail) {
  ++failures;
  fprintf(stderr, "truncated_caller: line %d: %s with size %zu: %s (last error: %s)\n", line, what, size,
          detail, flatmem_last_error());
}

static unsigned char *block(size_t size) {
  unsigned char *p = (unsigned char *)malloc(size ? size : 1);
  if (p == NULL) {
    fprintf(stderr, "truncated_caller: out of memory\n");
    exit(2);
  }
  return p;
}

/* The writer under test: write the struct into out with the given size. */
typedef flatmem_status (*writer)(void *out, size_t size, void *context);

/* One writer at every size 0 .. known + 8. `minimum`: the least size it
 * accepts; `deterministic`: a repeated call writes the same bytes (not so
 * for timings); `sized`: the struct begins with struct_size = the size. */
static void check_writer(const char *what, writer write, void *context, size_t known, size_t minimum,
                         int deterministic, int sized, int line) {
  unsigned char *full = block(known + 8 + GUARD), *out = block(known + 8 + GUARD);
  size_t size, i;
  memset(full, FILL, known + 8 + GUARD);
  if (write(full, known, context) != FLATMEM_STATUS_SUCCESS) fail_line(line, what, known, "the full-size call failed");
  for (size = 0; size <= known + 8; ++size) {
    flatmem_status status;
    ++calls;
    memset(out, FILL, size + GUARD);
    status = write(out, size, context);
    if (size < minimum) {
      if (status != FLATMEM_STATUS_INVALID_ARGUMENT) fail_line(line, what, size, "accepted below the minimum");
      for (i = 0; i < size + GUARD; ++i)
        if (out[i] != FILL) {
          fail_line(line, what, size, "refused, but wrote the caller's memory");
          break;
        }
      continue;
    }
    if (status != FLATMEM_STATUS_SUCCESS) {
      fail_line(line, what, size, "refused a size it must accept");
      continue;
    }
    for (i = size; i < size + GUARD; ++i)
      if (out[i] != FILL) {
        fail_line(line, what, size, "wrote past the caller's size");
        break;
      }
    for (i = known; i < size; ++i)
      if (out[i] != 0) {
        fail_line(line, what, size, "a byte past the library's sizeof is not 0");
        break;
      }
    if (sized && size >= sizeof(size_t)) {
      size_t struct_size;
      memcpy(&struct_size, out, sizeof struct_size);
      if (struct_size != size) fail_line(line, what, size, "struct_size is not the caller's size");
    }
    if (deterministic)
      for (i = sized ? sizeof(size_t) : 0; i < size && i < known; ++i)
        if (out[i] != full[i]) {
          fail_line(line, what, size, "the bytes differ from a full-size call's");
          break;
        }
  }
  free(full);
  free(out);
}

/* ---- the writers -------------------------------------------------------- */

static flatmem_status contrastive_init(void *o, size_t s, void *c) {
  (void)c;
  return flatmem_contrastive_options_init((flatmem_contrastive_options *)o, s);
}
static flatmem_status reversible_init(void *o, size_t s, void *c) {
  (void)c;
  return flatmem_reversible_options_init((flatmem_reversible_options *)o, s);
}
static flatmem_status block_init(void *o, size_t s, void *c) {
  (void)c;
  return flatmem_block_options_init((flatmem_block_options *)o, s);
}
static flatmem_status comm_init(void *o, size_t s, void *c) {
  (void)c;
  return flatmem_comm_options_init((flatmem_comm_options *)o, s);
}
static flatmem_status cyclic_init(void *o, size_t s, void *c) {
  (void)c;
  return flatmem_cyclic_options_init((flatmem_cyclic_options *)o, s);
}
static flatmem_status stages_init(void *o, size_t s, void *c) {
  (void)c;
  return flatmem_cyclic_stages_options_init((flatmem_cyclic_stages_options *)o, s);
}
static flatmem_status cyclic_get_schedule(void *o, size_t s, void *c) {
  return flatmem_cyclic_get_schedule((const flatmem_cyclic_t *)c, (flatmem_cyclic_schedule *)o, s);
}
static flatmem_status cyclic_action(void *o, size_t s, void *c) {
  return flatmem_cyclic_schedule_action((const flatmem_cyclic_schedule *)c, 1, 2, (flatmem_cyclic_action *)o, s);
}
static flatmem_status cyclic_stats(void *o, size_t s, void *c) {
  int64_t written = 0;
  return flatmem_cyclic_stats((const flatmem_cyclic_t *)c, 0, 1, (flatmem_cyclic_time_step_stats *)o, s, &written);
}
static flatmem_status cyclic_summary(void *o, size_t s, void *c) {
  return flatmem_cyclic_summary_get((const flatmem_cyclic_t *)c, (flatmem_cyclic_summary *)o, s);
}
static flatmem_status stages_get_schedule(void *o, size_t s, void *c) {
  return flatmem_cyclic_stages_get_schedule((const flatmem_cyclic_stages_t *)c, (flatmem_cyclic_stages_schedule *)o,
                                            s);
}
static flatmem_status stages_action(void *o, size_t s, void *c) {
  int32_t count = 0;
  return flatmem_cyclic_stages_schedule_actions((const flatmem_cyclic_stages_schedule *)c, 0, 0,
                                                (flatmem_cyclic_stages_action *)o, s, 1, &count);
}
static flatmem_status stages_occupancy(void *o, size_t s, void *c) {
  return flatmem_cyclic_stages_schedule_occupancy((const flatmem_cyclic_stages_schedule *)c, 0,
                                                  (flatmem_cyclic_stages_occupancy *)o, s);
}
static flatmem_status stages_stats(void *o, size_t s, void *c) {
  int64_t written = 0;
  return flatmem_cyclic_stages_stats((const flatmem_cyclic_stages_t *)c, 0, 1,
                                     (flatmem_cyclic_stages_time_step_stats *)o, s, &written);
}
static flatmem_status stages_summary(void *o, size_t s, void *c) {
  return flatmem_cyclic_stages_summary_get((const flatmem_cyclic_stages_t *)c, (flatmem_cyclic_stages_summary *)o, s);
}

#define CHECK_WRITER(fn, context, type, minimum, deterministic, sized) \
  check_writer(#fn, fn, context, sizeof(type), minimum, deterministic, sized, __LINE__)

/* ---- readers: options and schedules cut at each field boundary ----------- */

/* Does field `member` of `type` lie inside a caller's struct of `size` bytes? */
#define FITS(type, member, size) (offsetof(type, member) + sizeof(((type *)0)->member) <= (size))

/* Sets an integer field (4 or 8 bytes) of a struct whose block may end
 * right after it: through memcpy, since the block is smaller than the type. */
#define SET(p, type, member, value) \
  set_field((p), offsetof(type, member), sizeof(((type *)0)->member), (int64_t)(value))
static void set_field(void *p, size_t offset, size_t size, int64_t value) {
  int32_t narrow = (int32_t)value;
  if (size == sizeof narrow)
    memcpy((char *)p + offset, &narrow, size);
  else
    memcpy((char *)p + offset, &value, size);
}

static void expect(int line, const char *what, size_t size, flatmem_status got, int must_succeed,
                   const char *missing) {
  ++calls;
  if (must_succeed && got != FLATMEM_STATUS_SUCCESS) fail_line(line, what, size, "refused a struct that has what it needs");
  if (!must_succeed && (got != FLATMEM_STATUS_INVALID_ARGUMENT || strstr(flatmem_last_error(), missing) == NULL))
    fail_line(line, what, size, "accepted, or refused without naming the missing field");
}

static void read_options(flatmem_comm_t *comm) {
  size_t s;
  for (s = sizeof(size_t); s <= sizeof(flatmem_contrastive_options); s += 4) {
    flatmem_contrastive_options *o = (flatmem_contrastive_options *)block(s);
    flatmem_contrastive_t *h = NULL;
    flatmem_contrastive_options_init(o, s);
    if (FITS(flatmem_contrastive_options, num_threads, s)) SET(o, flatmem_contrastive_options, num_threads, 1);
    expect(__LINE__, "flatmem_contrastive_create", s, flatmem_contrastive_create(&h, o), 1, "");
    flatmem_contrastive_destroy(h);
    free(o);
  }
  for (s = sizeof(size_t); s <= sizeof(flatmem_reversible_options); s += 4) {
    flatmem_reversible_options *o = (flatmem_reversible_options *)block(s);
    flatmem_block_options *bo = (flatmem_block_options *)block(s <= sizeof *bo ? s : sizeof *bo);
    flatmem_block_t *f = NULL;
    flatmem_reversible_block pair;
    flatmem_reversible_t *seg = NULL;
    const size_t bs = s <= sizeof *bo ? s : sizeof *bo;
    int block_ok;
    flatmem_reversible_options_init(o, s);
    flatmem_block_options_init(bo, bs);
    if (FITS(flatmem_block_options, kind, bs)) SET(bo, flatmem_block_options, kind, FLATMEM_BLOCK_MLP);
    if (FITS(flatmem_block_options, width, bs)) SET(bo, flatmem_block_options, width, 4);
    block_ok = FITS(flatmem_block_options, width, bs);
    expect(__LINE__, "flatmem_block_create", bs, flatmem_block_create(&f, bo), block_ok,
           FITS(flatmem_block_options, kind, bs) ? "width" : "kind");
    if (f != NULL) {
      flatmem_block_function(f, &pair.f);
      flatmem_block_function(f, &pair.g);
      if (FITS(flatmem_reversible_options, num_threads, s)) SET(o, flatmem_reversible_options, num_threads, 1);
      expect(__LINE__, "flatmem_reversible_create", s, flatmem_reversible_create(&seg, &pair, 1, o), 1, "");
      flatmem_reversible_destroy(seg);
    }
    flatmem_block_destroy(f);
    free(o);
    free(bo);
  }
  for (s = sizeof(size_t); s <= sizeof(flatmem_cyclic_options); s += 4) {
    flatmem_cyclic_options *o = (flatmem_cyclic_options *)block(s);
    flatmem_cyclic_t *h = NULL;
    const int stages = FITS(flatmem_cyclic_options, stages, s), steps = FITS(flatmem_cyclic_options, steps, s);
    flatmem_cyclic_options_init(o, s);
    if (stages) SET(o, flatmem_cyclic_options, stages, 2);
    if (steps) SET(o, flatmem_cyclic_options, steps, 3);
    expect(__LINE__, "flatmem_cyclic_create", s, flatmem_cyclic_create(&h, comm, o), stages && steps,
           stages ? "steps" : "stages");
    flatmem_cyclic_destroy(h);
    free(o);
  }
  for (s = sizeof(size_t); s <= sizeof(flatmem_cyclic_schedule); s += 4) {
    flatmem_cyclic_schedule *o = (flatmem_cyclic_schedule *)block(s);
    int64_t length = 0;
    const int world = FITS(flatmem_cyclic_schedule, world_size, s), stages = FITS(flatmem_cyclic_schedule, stages, s),
              steps = FITS(flatmem_cyclic_schedule, steps, s);
    memset(o, 0, s);
    SET(o, flatmem_cyclic_schedule, struct_size, s);
    if (world) SET(o, flatmem_cyclic_schedule, world_size, 2);
    if (stages) SET(o, flatmem_cyclic_schedule, stages, 2);
    if (steps) SET(o, flatmem_cyclic_schedule, steps, 3);
    expect(__LINE__, "flatmem_cyclic_schedule_length", s, flatmem_cyclic_schedule_length(o, &length),
           world && stages && steps, !world ? "world_size" : !stages ? "stages" : "steps");
    free(o);
  }
}

/* Reserved fields (ABI 1's padding, named): ignored from a caller of this
 * size, whose compiler may have left them indeterminate; refused, naming
 * the field, from a larger caller (built against a newer header). */
static void reserved_fields(flatmem_comm_t *comm) {
  const size_t larger = sizeof(flatmem_cyclic_options) + 8;
  flatmem_cyclic_options *o = (flatmem_cyclic_options *)block(larger);
  flatmem_contrastive_options *c = (flatmem_contrastive_options *)block(sizeof *c + 8);
  flatmem_cyclic_t *h = NULL;
  flatmem_contrastive_t *ch = NULL;
  flatmem_status status;
  flatmem_cyclic_options_init(o, sizeof *o);
  o->stages = 2;
  o->steps = 3;
  o->reserved2 = 7;
  expect(__LINE__, "flatmem_cyclic_create (reserved2 = 7, this size)", sizeof *o,
         flatmem_cyclic_create(&h, comm, o), 1, "");
  flatmem_cyclic_destroy(h);
  h = NULL;
  memset((char *)o + sizeof *o, 0, 8);
  o->struct_size = larger;
  status = flatmem_cyclic_create(&h, comm, o);
  ++calls;
  if (status != FLATMEM_STATUS_UNSUPPORTED || strstr(flatmem_last_error(), "reserved2") == NULL || h != NULL)
    fail_line(__LINE__, "flatmem_cyclic_create (reserved2 = 7, a larger caller)", larger, "not refused naming reserved2");
  flatmem_contrastive_options_init(c, sizeof *c + 8);
  c->reserved0 = -1;
  status = flatmem_contrastive_create(&ch, c);
  ++calls;
  if (status != FLATMEM_STATUS_UNSUPPORTED || strstr(flatmem_last_error(), "reserved0") == NULL || ch != NULL)
    fail_line(__LINE__, "flatmem_contrastive_create (reserved0 = -1, a larger caller)", sizeof *c + 8,
              "not refused naming reserved0");
  c->struct_size = sizeof *c;
  expect(__LINE__, "flatmem_contrastive_create (reserved0 = -1, this size)", sizeof *c,
         flatmem_contrastive_create(&ch, c), 1, "");
  flatmem_contrastive_destroy(ch);
  free(o);
  free(c);
}

/* ---- the handles the writers ask ---------------------------------------- */

static void run(void) {
  flatmem_comm_t *comm = NULL, *comm2 = NULL;
  flatmem_cyclic_options co = FLATMEM_CYCLIC_OPTIONS_INIT;
  flatmem_cyclic_stages_options so = FLATMEM_CYCLIC_STAGES_OPTIONS_INIT;
  flatmem_cyclic_schedule schedule = FLATMEM_CYCLIC_SCHEDULE_INIT;
  flatmem_cyclic_stages_schedule stages_schedule = FLATMEM_CYCLIC_STAGES_SCHEDULE_INIT;
  flatmem_cyclic_t *cyclic = NULL;
  flatmem_cyclic_stages_t *stages = NULL;
  flatmem_cyclic_action action;

  CHECK_WRITER(contrastive_init, NULL, flatmem_contrastive_options, sizeof(size_t), 1, 1);
  CHECK_WRITER(reversible_init, NULL, flatmem_reversible_options, sizeof(size_t), 1, 1);
  CHECK_WRITER(block_init, NULL, flatmem_block_options, sizeof(size_t), 1, 1);
  CHECK_WRITER(comm_init, NULL, flatmem_comm_options, sizeof(size_t), 1, 1);
  CHECK_WRITER(cyclic_init, NULL, flatmem_cyclic_options, sizeof(size_t), 1, 1);
  CHECK_WRITER(stages_init, NULL, flatmem_cyclic_stages_options, sizeof(size_t), 1, 1);

  schedule.world_size = 3;
  schedule.stages = 2;
  schedule.steps = 4;
  CHECK_WRITER(cyclic_action, &schedule, flatmem_cyclic_action, 1, 1, 0);
  stages_schedule.stages = 2;
  stages_schedule.micro_batches = 3;
  stages_schedule.steps = 2;
  CHECK_WRITER(stages_action, &stages_schedule, flatmem_cyclic_stages_action, 1, 1, 0);
  CHECK_WRITER(stages_occupancy, &stages_schedule, flatmem_cyclic_stages_occupancy, 1, 1, 0);

  if (flatmem_comm_create_local(&comm, 1, NULL) != FLATMEM_STATUS_SUCCESS) {
    fail_line(__LINE__, "flatmem_comm_create_local", 1, "failed");
    return;
  }
  read_options(comm);
  reserved_fields(comm);
  co.stages = 2;
  co.steps = 3;
  if (flatmem_cyclic_create(&cyclic, comm, &co) == FLATMEM_STATUS_SUCCESS &&
      flatmem_cyclic_next(cyclic, &action, sizeof action) == FLATMEM_STATUS_SUCCESS) {
    CHECK_WRITER(cyclic_get_schedule, cyclic, flatmem_cyclic_schedule, sizeof(size_t), 1, 1);
    CHECK_WRITER(cyclic_stats, cyclic, flatmem_cyclic_time_step_stats, 1, 0, 0);
    CHECK_WRITER(cyclic_summary, cyclic, flatmem_cyclic_summary, 1, 0, 0);
  } else {
    fail_line(__LINE__, "a cyclic handle", sizeof co, "could not be made");
  }
  flatmem_cyclic_destroy(cyclic);
  if (flatmem_comm_create_local(&comm2, 1, NULL) != FLATMEM_STATUS_SUCCESS) {
    fail_line(__LINE__, "flatmem_comm_create_local", 1, "failed");
    flatmem_comm_destroy(comm);
    return;
  }
  so.stages = 1;
  so.micro_batches = 2;
  so.steps = 2;
  if (flatmem_cyclic_stages_create(&stages, comm2, &so) == FLATMEM_STATUS_SUCCESS) {
    flatmem_cyclic_stages_action a;
    flatmem_cyclic_stages_next(stages, &a, sizeof a);
    CHECK_WRITER(stages_get_schedule, stages, flatmem_cyclic_stages_schedule, sizeof(size_t), 1, 1);
    CHECK_WRITER(stages_stats, stages, flatmem_cyclic_stages_time_step_stats, 1, 0, 0);
    CHECK_WRITER(stages_summary, stages, flatmem_cyclic_stages_summary, 1, 0, 0);
  } else {
    fail_line(__LINE__, "a stage-parallel handle", sizeof so, "could not be made");
  }
  flatmem_cyclic_stages_destroy(stages);
  flatmem_comm_destroy(comm);
  flatmem_comm_destroy(comm2);
}

int main(void) {
  run();
  if (failures) {
    fprintf(stderr, "truncated_caller: %d of %d checks failed\n", failures, calls);
    return 1;
  }
  printf("truncated_caller: %d calls with structs cut short; every byte where it belongs\n", calls);
  return 0;
}
