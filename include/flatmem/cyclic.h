/*
 * flatmem/cyclic.h -- cyclic data parallelism: N ranks staggered by 1/N of a
 * training step, per-stage gradient reductions as point-to-point chains.
 *
 * Included by <flatmem/flatmem.h> (either header may be included). Plain C99.
 * The conventions at the top of flatmem.h (statuses, last error, DLPack
 * checks, options structs) hold here too.
 *
 * ------------------------------------------------------------------------
 * The schedule
 * ------------------------------------------------------------------------
 * The caller cuts its model into L stages (0 .. L-1, input to output). One
 * training step of one rank is 2L time steps: forward of stages 0 .. L-1,
 * then backward of stages L-1 .. 0. Each rank trains on its own micro-batch
 * per step (step s of rank r: the caller's choice of data).
 *
 *   offset(r)   = floor(r * 2L / N)   (0 for every rank under FLATMEM_CYCLIC_SYNC)
 *   local time  t = tau - offset(r)   for global time step tau = 0, 1, ...
 *   step        s = floor(t / 2L),  phase p = t mod 2L
 *   action      t < 0 or s >= steps: idle;  p < L: forward of stage p;
 *               p >= L: backward of stage 2L - 1 - p.
 *
 * When 2L/N is whole, ranks are exactly 2L/N time steps apart; when N is
 * also even (N = 2L, N = L, ...), the stage activations held by all ranks
 * together are constant once all have started.
 * When it is not, offsets are rounded down to whole time steps (ranks are
 * 0 or 1 time step closer than 1/N of a step); when N > 2L several ranks
 * share an offset and run in lockstep groups. Both keep every rank's
 * schedule a plain shifted copy of rank 0's; only the flatness of the sum
 * degrades (see flatmem_cyclic_schedule_action's activations_held).
 *
 * Activations: during the forward of stage j a rank holds the activations of
 * stages 0 .. j (j + 1 stage-units); during the backward of stage j it still
 * holds stages 0 .. j and frees stage j at the end. A rank's own peak is L
 * units (at the end of its forward), its mean over a step (L + 1) / 2; the
 * sum over N synchronous ranks peaks at N * L, the sum over N = 2L cyclic ranks
 * is constant at N (L + 1) / 2, (L + 1) / 2L of that peak (0.625 at L = 4).
 *
 * ------------------------------------------------------------------------
 * Gradients and update rules
 * ------------------------------------------------------------------------
 * After its backward of stage j in step s, a rank hands the stage's gradient
 * over (flatmem_cyclic_reduce). The sum over ranks is formed by a chain of
 * point-to-point messages in stagger order -- rank 0 sends its gradient to
 * rank 1, rank r receives the partial sum from r - 1, adds its own and
 * passes it on to r + 1 -- then rank N - 1 scales the total to the average
 * (sum / N, the factor rounded to the element type) and it is delivered:
 *   DELAY1  around the ring in stagger order, N-1 -> 0 -> 1 -> ... -> N-2,
 *           each hop released when the sender's clock is one time step
 *           before the receiver needs the average (at the latest when the
 *           sender needs it itself), so deliveries spread over the step like
 *           the partial sums (in steady state half the ranks pass averages on
 *           while the other half send partial sums);
 *   NEWEST  at once, down the chain N-1 -> N-2 -> ... -> 0 (the late ranks,
 *           which may apply it in the next step, first).
 * Each rank sends each stage's gradient at most twice per step (the volume of
 * a ring all-reduce), at its own time: no collective re-synchronises the
 * ranks. Every rank receives bitwise the same average: ((g_0 + g_1) + g_2) +
 * ... in that order, then times 1/N.
 *
 * The averaged gradient of step s is applied to stage j right before a
 * forward of stage j ("update"; the optimizer is the caller's), delay(r, j)
 * steps late:
 *   FLATMEM_CYCLIC_SYNC    plain data parallelism, the baseline: no stagger,
 *                          one ring all-reduce of all stages when the step's
 *                          backward ends; delay 0 (applied before step s+1).
 *   FLATMEM_CYCLIC_DELAY1  every stage applies the previous step's average:
 *                          the gradient of step s is applied before step
 *                          s + 2; delay 1 for every rank and stage, so every
 *                          rank holds the same parameters.
 *   FLATMEM_CYCLIC_NEWEST  a stage uses this step's average when the schedule
 *                          lets it arrive before the rank needs the stage,
 *                          else the previous step's: delay(r, j) = 0 when
 *                          offset(N-1) - offset(r) <= 2j, else 1. Decided by
 *                          the schedule, not by timing, so runs are
 *                          reproducible; when the chain is slower than the
 *                          schedule the rank waits. Ranks may then differ by
 *                          one step's gradient in some stages.
 * Every step's average is applied exactly once, in order, never more than one
 * step late. After the last step the schedule goes on (idle time steps that
 * carry updates) until every gradient is applied.
 *
 * ------------------------------------------------------------------------
 * Driving a handle
 * ------------------------------------------------------------------------
 *   flatmem_cyclic_create(&h, comm, &options);       // collective
 *   for (;;) {
 *     flatmem_cyclic_action a;
 *     flatmem_cyclic_next(h, &a);                       // may wait (see there)
 *     if (a.kind == FLATMEM_CYCLIC_DONE) break;
 *     if (a.update_stage >= 0)                           // the average is ready
 *       apply(a.update_stage, gradient_buffer(a.update_stage, a.update_step));
 *     if (a.kind == FLATMEM_CYCLIC_FORWARD)  forward(a.stage, batch(a.step));
 *     if (a.kind == FLATMEM_CYCLIC_BACKWARD) {
 *       backward(a.stage, into gradient_buffer(a.stage, a.step));
 *       flatmem_cyclic_reduce(h, a.stage, gradient_buffer(a.stage, a.step));
 *     }
 *   }
 *   flatmem_cyclic_destroy(h);
 * A gradient buffer belongs to the handle from flatmem_cyclic_reduce until the
 * flatmem_cyclic_next that returns its update (it then holds the average).
 * Under DELAY1 / NEWEST the gradient of step s is still in flight while the
 * backward of step s + 1 runs: give each stage two buffers and alternate on
 * the step's parity (buffer[s % 2]).
 *
 * Pacing: a rank with offset > 0 starts its first forward only after the
 * previous rank reached the same global time step (a token from rank r - 1),
 * so the stagger is real in wall-clock time too; afterwards ranks are kept in
 * step by the gradients they wait for.
 *
 * ------------------------------------------------------------------------
 * Transport, threads, failure
 * ------------------------------------------------------------------------
 * Host gradients (kDLCPU) travel over the communicator's host transport (UCX,
 * or the in-process group); two threads of the handle run the reduce chain
 * and the delivery chain while the caller computes. Device gradients
 * (kDLCUDA) are not supported yet (UNSUPPORTED): stage them through host
 * memory.
 * The handle's messages use their own tag space: user messages and the
 * communicator's collectives may run beside it on the same communicator.
 * One cyclic handle per communicator at a time.
 *
 * Thread rule: one thread at a time per handle; it is the same thread's job
 * to call flatmem_cyclic_next for every time step in order.
 *
 * Every wait -- the start token, a gradient the rank needs -- is bounded by
 * options.timeout_ms. A failure (a dead or wedged peer, a size mismatch, a
 * non-finite gradient) poisons the handle and its communicator: the other
 * ranks fail at once (PEER_FAILURE) or within their timeout, with a message
 * naming the stage, the step and the peer ("cyclic reduce chain, stage 2,
 * step 7: receive partial sum from rank 1: ..."). Later calls return
 * FLATMEM_STATUS_COMM_POISONED.
 */
#ifndef FLATMEM_CYCLIC_H
#define FLATMEM_CYCLIC_H

#include <flatmem/flatmem.h>

#ifdef __cplusplus
extern "C" {
#endif

/** How the averaged gradients are applied (see the top of this header). */
typedef enum flatmem_cyclic_rule {
  /** Default. Staggered ranks, each stage applies last step's average. */
  FLATMEM_CYCLIC_DELAY1 = 0,
  /** Staggered ranks, this step's average where the schedule allows. */
  FLATMEM_CYCLIC_NEWEST = 1,
  /** No stagger, all-reduce at the end of the step: plain data parallelism. */
  FLATMEM_CYCLIC_SYNC = 2,
  FLATMEM_CYCLIC_RULE_MAX = 0x7fffffff
} flatmem_cyclic_rule;

/** The shape of a schedule: what flatmem_cyclic_schedule_* compute from. */
typedef struct flatmem_cyclic_schedule {
  /** sizeof(flatmem_cyclic_schedule) as the caller was compiled. */
  size_t struct_size;
  /** N: ranks, 1 .. 1048576. */
  int32_t world_size;
  /** L: stages, 1 .. 65535. */
  int32_t stages;
  /** Training steps each rank runs, 1 .. 2^40. */
  int64_t steps;
  flatmem_cyclic_rule rule;
} flatmem_cyclic_schedule;

#define FLATMEM_CYCLIC_SCHEDULE_INIT \
  { sizeof(flatmem_cyclic_schedule), 0, 0, 0, FLATMEM_CYCLIC_DELAY1 }

typedef enum flatmem_cyclic_action_kind {
  /** Warm-up (before the rank's offset), drain, or update-only time steps. */
  FLATMEM_CYCLIC_IDLE = 0,
  FLATMEM_CYCLIC_FORWARD = 1,
  FLATMEM_CYCLIC_BACKWARD = 2,
  /** Past the end of the schedule: nothing left to do (flatmem_cyclic_next). */
  FLATMEM_CYCLIC_DONE = 3,
  FLATMEM_CYCLIC_ACTION_KIND_MAX = 0x7fffffff
} flatmem_cyclic_action_kind;

/** What one rank does in one time step. */
typedef struct flatmem_cyclic_action {
  /** Global time step tau (0-based; all ranks count the same). */
  int64_t time_step;
  flatmem_cyclic_action_kind kind;
  /** FORWARD / BACKWARD: the stage, 0 .. L-1; otherwise -1. */
  int32_t stage;
  /** FORWARD / BACKWARD: the training step (this rank's micro-batch), 0-based;
   *  otherwise -1. */
  int64_t step;
  /** >= 0: before the action, apply the averaged gradient of update_step to
   *  stage update_stage (then the stage equals `stage` for a FORWARD; IDLE
   *  time steps after the last step carry the remaining updates). -1: none. */
  int32_t update_stage;
  int64_t update_step;
  /** Stage activations this rank holds during the time step (0 .. L). */
  int32_t activations_held;
  /** Local phase 0 .. 2L-1 within the step; -1 when idle. */
  int32_t phase;
} flatmem_cyclic_action;

/** offset(rank) in time steps (see the top of this header). */
FLATMEM_API flatmem_status flatmem_cyclic_schedule_offset(const flatmem_cyclic_schedule *schedule,
                                                          int32_t rank, int64_t *offset);

/** delay(rank, stage): the average of step s is applied before the forward of
 *  the stage in step s + 1 + delay (0 or 1). */
FLATMEM_API flatmem_status flatmem_cyclic_schedule_delay(const flatmem_cyclic_schedule *schedule,
                                                         int32_t rank, int32_t stage,
                                                         int32_t *delay);

/** Time steps until every rank is done (its last update included): the
 *  global time steps 0 .. *time_steps - 1 are the whole run. */
FLATMEM_API flatmem_status flatmem_cyclic_schedule_length(const flatmem_cyclic_schedule *schedule,
                                                          int64_t *time_steps);

/** The action of `rank` at global time step time_step >= 0 (DONE at and after
 *  the schedule's length). Pure and thread-safe: no handle needed. */
FLATMEM_API flatmem_status flatmem_cyclic_schedule_action(const flatmem_cyclic_schedule *schedule,
                                                          int32_t rank, int64_t time_step,
                                                          flatmem_cyclic_action *action);

/** A cyclic data-parallel runtime over a communicator. */
typedef struct flatmem_cyclic_s flatmem_cyclic_t;

typedef struct flatmem_cyclic_options {
  /** sizeof(flatmem_cyclic_options) as the caller was compiled. */
  size_t struct_size;
  /** L, as in flatmem_cyclic_schedule (required). */
  int32_t stages;
  /** Training steps (required). */
  int64_t steps;
  flatmem_cyclic_rule rule;
  /** Accounting only: bytes of activations stage j keeps for its backward
   *  (L entries, >= 0, copied at create). NULL = 1 byte per stage, so that
   *  activation_bytes counts stage-units. */
  const int64_t *activation_bytes;
  /** Deadline of every wait in milliseconds (0 = the communicator's
   *  default timeout). */
  int64_t timeout_ms;
  /** FLATMEM_NONFINITE_ERROR (default): flatmem_cyclic_reduce scans the
   *  gradient; a NaN or Inf gives FLATMEM_STATUS_NON_FINITE naming the stage,
   *  step and element, and poisons the communicator (the chain cannot go on
   *  without this rank: the others fail naming it). PROPAGATE: no scan. */
  flatmem_nonfinite_policy nonfinite;
  /** Time steps of per-time-step statistics kept (the most recent ones);
   *  0 = 65536. */
  int64_t history;
} flatmem_cyclic_options;

#define FLATMEM_CYCLIC_OPTIONS_INIT \
  { sizeof(flatmem_cyclic_options), 0, 0, FLATMEM_CYCLIC_DELAY1, NULL, 0, FLATMEM_NONFINITE_ERROR, 0 }

/** Fill *options with defaults and struct_size. Thread-safe. */
FLATMEM_API flatmem_status flatmem_cyclic_options_init(flatmem_cyclic_options *options);

/**
 * Create the runtime of this rank (collective over the communicator: every
 * rank must pass the same stages, steps and rule -- checked, INVALID_ARGUMENT
 * on every rank naming the first rank that differs). The communicator must
 * outlive the handle and stays the caller's. Starts two threads. *out is set
 * on success only.
 */
FLATMEM_API flatmem_status flatmem_cyclic_create(flatmem_cyclic_t **out, flatmem_comm_t *comm,
                                                 const flatmem_cyclic_options *options);

/**
 * Release the handle. When every handed-over gradient has been applied (the
 * schedule ran to DONE, or nothing is in flight) this is local and quick.
 * Otherwise the reductions in flight cannot finish without this rank: the
 * communicator is poisoned (the peers fail naming this rank) before the
 * threads stop. NULL is a no-op.
 */
FLATMEM_API flatmem_status flatmem_cyclic_destroy(flatmem_cyclic_t *handle);

/** The handle's schedule (world size, stages, steps, rule). */
FLATMEM_API flatmem_status flatmem_cyclic_get_schedule(const flatmem_cyclic_t *handle,
                                                       flatmem_cyclic_schedule *schedule);

/**
 * Advance to the next time step and say what to do in it (*action, as
 * flatmem_cyclic_schedule_action for this rank). Waits, at most
 * options.timeout_ms each, for:
 *  - the start token of rank - 1, at the rank's first forward;
 *  - the averaged gradient of the action's update, so that on return the
 *    buffer handed over for (update_stage, update_step) holds it.
 * Returns INVALID_ARGUMENT without advancing when the previous action was a
 * BACKWARD whose gradient was not handed over. After the last time step it
 * returns DONE (again on every later call). On a failure the handle is
 * poisoned (see the top of this header); *action is then not written.
 */
FLATMEM_API flatmem_status flatmem_cyclic_next(flatmem_cyclic_t *handle,
                                               flatmem_cyclic_action *action);

/**
 * Hand over the gradient of `stage` computed in the current time step (which
 * must be that stage's BACKWARD, once). gradient: kDLCPU, float32 or float64,
 * compact, at least one element, the same dtype and size on every rank
 * (a mismatch poisons the handles, naming both sizes). The buffer belongs to
 * the handle until flatmem_cyclic_next returns its update; do not read or
 * write it meanwhile. Returns at once; the reduction runs in the background.
 * On a NaN/Inf under FLATMEM_NONFINITE_ERROR the buffer is untouched.
 */
FLATMEM_API flatmem_status flatmem_cyclic_reduce(flatmem_cyclic_t *handle, int32_t stage,
                                                 DLTensor *gradient);

/** What happened in one time step of this rank. */
typedef struct flatmem_cyclic_time_step_stats {
  int64_t time_step;
  flatmem_cyclic_action_kind kind;
  int32_t stage;
  int64_t step;
  /** Stage activations held, and their bytes (options.activation_bytes). */
  int32_t activations_held;
  int64_t activation_bytes;
  /** Gradient bytes this rank posted for sending during the time step
   *  (chains and all-reduces; measured, so it depends on timing). */
  int64_t bytes_sent;
  /** Wall-clock seconds from the flatmem_cyclic_next that began the time
   *  step to the one that began the next (0 for the current one). */
  double seconds;
  /** Seconds of it flatmem_cyclic_next spent waiting (token, gradients). */
  double wait_seconds;
  /** The same bytes as bytes_sent, counted in the time step the protocol
   *  assigns each message to rather than when a thread posted it: a partial
   *  sum to the backward that produced it, a DELAY1 average to the time step
   *  its hop is released in, a NEWEST average to rank N-1's backward that
   *  completed the sum, SYNC's all-reduce to the step's last backward. The
   *  traffic pattern without the timing jitter of a busy machine (sends
   *  attributed to time steps not kept in the history are not counted). */
  int64_t bytes_scheduled;
} flatmem_cyclic_time_step_stats;

/** Totals since create. */
typedef struct flatmem_cyclic_summary {
  int64_t time_steps;
  int64_t bytes_sent;
  int64_t messages_sent;
  /** Largest bytes_sent of one time step. */
  int64_t max_bytes_sent_per_time_step;
  int64_t peak_activation_bytes;
  double wait_seconds;
  double seconds;
} flatmem_cyclic_summary;

/**
 * Copy the statistics of time steps first .. first + count - 1 that are still
 * kept (the last options.history ones begun so far) into stats[0 .. *written-1].
 * Ask for first = 0 and a large count to get all that are kept; *written says
 * how many were copied (the first copied one is stats[0]; check its
 * time_step).
 */
FLATMEM_API flatmem_status flatmem_cyclic_stats(const flatmem_cyclic_t *handle, int64_t first,
                                                int64_t count,
                                                flatmem_cyclic_time_step_stats *stats,
                                                int64_t *written);

FLATMEM_API flatmem_status flatmem_cyclic_summary_get(const flatmem_cyclic_t *handle,
                                                      flatmem_cyclic_summary *summary);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FLATMEM_CYCLIC_H */
