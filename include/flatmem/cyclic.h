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
 *     flatmem_cyclic_next(h, &a, sizeof a);                     // may wait (see there)
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
 * Host gradients (kDLCPU, options.memory = HOST, the default) travel over the
 * communicator's host transport (UCX, or the in-process group); two threads
 * of the handle run the reduce chain and the delivery chain while the caller
 * computes.
 *
 * Device gradients (kDLCUDA, options.memory = CUDA) travel over NCCL. The
 * communicator needs its device transport first (flatmem_comm_init_device);
 * flatmem_cyclic_create then makes two private NCCL communicators on that
 * device, one per chain (collective, within options.timeout_ms; each has its
 * own NCCL buffers and proxy thread), so the two
 * chain threads never share one, and each thread enqueues its chain on a
 * stream of its own (created non-blocking: it never waits for the legacy
 * default stream implicitly). Per gradient the chain thread:
 *   - makes its stream wait for an event recorded on the caller's stream by
 *     flatmem_cyclic_reduce_stream (no host wait in the caller's thread);
 *   - under FLATMEM_NONFINITE_ERROR, scans it on the device and reads the
 *     verdict back (one host wait of the chain thread);
 *   - runs its link: ncclRecv of the partial sum into a device scratch
 *     buffer of the handle (stream-ordered cudaMallocAsync at the first
 *     device gradient, grown to the largest: one gradient's bytes), an add kernel
 *     (g[i] = g[i] + partial[i], the host chain's arithmetic), ncclSend on;
 *     rank N-1 scales by the factor of the host chain; the delivery chain
 *     moves the average with ncclRecv / ncclSend; SYNC runs ncclAllReduce
 *     then the same scaling;
 *   - waits on the host for its stream to finish (polling, so that a peer's
 *     failure or an NCCL error ends it) before the buffer counts as reduced
 *     or delivered.
 * So when flatmem_cyclic_next returns an update, the average is complete in
 * device memory and any stream may read it. The DELAY1 / NEWEST chains form
 * the host chains' bits for finite values (same additions in the same order,
 * same scaling; NaN payloads may differ); SYNC's sum is NCCL's, whose order
 * differs from the host ring's, so it agrees with the host SYNC mode to
 * rounding only.
 * Caveat: the two chains' NCCL kernels may be in flight at once, on two
 * communicators. NCCL documents that as safe only while the GPU can run both
 * kernels concurrently (it normally can: each NCCL kernel takes a few SMs);
 * CUDA_DEVICE_MAX_CONNECTIONS=1, a small MIG slice or an MPS SM limit may
 * serialise them and deadlock until options.timeout_ms fails the handle.
 * The ZeRO relay on the device: see "ZeRO relay" below. Builds without NCCL
 * return UNSUPPORTED for options.memory = CUDA.
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
  /** Reserved (ABI 1 padding): set 0; see "Reserved fields" in flatmem.h. */
  int32_t reserved0;
} flatmem_cyclic_schedule;

#define FLATMEM_CYCLIC_SCHEDULE_INIT \
  { sizeof(flatmem_cyclic_schedule), 0, 0, 0, FLATMEM_CYCLIC_DELAY1, 0 }

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
  /** Reserved (ABI 1 padding): written 0. */
  int32_t reserved0;
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
 *  the schedule's length). action_size = sizeof(*action). Pure and
 *  thread-safe: no handle needed. */
FLATMEM_API flatmem_status flatmem_cyclic_schedule_action(const flatmem_cyclic_schedule *schedule,
                                                          int32_t rank, int64_t time_step,
                                                          flatmem_cyclic_action *action,
                                                          size_t action_size);

/** Where each rank keeps the stage parameters (see "ZeRO relay" below). */
typedef enum flatmem_cyclic_parameter_mode {
  /** Default. Every rank holds all L stages and updates them itself. */
  FLATMEM_CYCLIC_PARAMETERS_REPLICATED = 0,
  /** Rank k holds shard k of every stage; full stages travel rank to rank. */
  FLATMEM_CYCLIC_PARAMETERS_RELAYED = 1,
  FLATMEM_CYCLIC_PARAMETER_MODE_MAX = 0x7fffffff
} flatmem_cyclic_parameter_mode;

/** Where the gradients of a cyclic handle live (see "Transport" above). */
typedef enum flatmem_cyclic_memory {
  /** Default. kDLCPU gradients over the host transport. */
  FLATMEM_CYCLIC_MEMORY_HOST = 0,
  /** kDLCUDA gradients on the communicator's CUDA device, over NCCL. */
  FLATMEM_CYCLIC_MEMORY_CUDA = 1,
  FLATMEM_CYCLIC_MEMORY_MAX = 0x7fffffff
} flatmem_cyclic_memory;

/** A cyclic data-parallel runtime over a communicator. */
typedef struct flatmem_cyclic_s flatmem_cyclic_t;

typedef struct flatmem_cyclic_options {
  /** sizeof(flatmem_cyclic_options) as the caller was compiled. */
  size_t struct_size;
  /** L, as in flatmem_cyclic_schedule (required). */
  int32_t stages;
  /** Reserved (ABI 1 padding): set 0; see "Reserved fields" in flatmem.h. */
  int32_t reserved0;
  /** Training steps (required). */
  int64_t steps;
  flatmem_cyclic_rule rule;
  /** Reserved (ABI 1 padding): set 0; see "Reserved fields" in flatmem.h. */
  int32_t reserved1;
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
  /** Reserved (ABI 1 padding): set 0; see "Reserved fields" in flatmem.h. */
  int32_t reserved2;
  /** Time steps of per-time-step statistics kept (the most recent ones);
   *  0 = 65536. */
  int64_t history;
  /** REPLICATED (default) or RELAYED (the ZeRO relay mode, DELAY1 only: see
   *  "ZeRO relay" below). Every rank must pass the same. */
  flatmem_cyclic_parameter_mode parameters;
  /** Reserved (ABI 1 padding): set 0; see "Reserved fields" in flatmem.h. */
  int32_t reserved3;
  /** RELAYED: n_j, the elements of stage j (L entries, 1 .. 2^40, copied at
   *  create; the same on every rank). Required when relayed, ignored when
   *  replicated. */
  const int64_t *parameter_count;
  /** HOST (default: kDLCPU gradients) or CUDA (kDLCUDA gradients, and with
   *  RELAYED shards and full stages, on the communicator's device, over NCCL;
   *  needs flatmem_comm_init_device before create). Every rank must pass the
   *  same. */
  flatmem_cyclic_memory memory;
  /** Reserved (ABI 1 padding): set 0; see "Reserved fields" in flatmem.h. */
  int32_t reserved4;
} flatmem_cyclic_options;

#define FLATMEM_CYCLIC_OPTIONS_INIT                                                        \
  { sizeof(flatmem_cyclic_options), 0, 0, 0, FLATMEM_CYCLIC_DELAY1, 0, NULL, 0,                     \
    FLATMEM_NONFINITE_ERROR, 0, 0, FLATMEM_CYCLIC_PARAMETERS_REPLICATED, 0, NULL,                  \
    FLATMEM_CYCLIC_MEMORY_HOST, 0 }

/** Fill the struct_size bytes at options with the defaults, struct_size =
 *  struct_size (pass sizeof(*options)). Thread-safe. */
FLATMEM_API flatmem_status flatmem_cyclic_options_init(flatmem_cyclic_options *options,
                                                       size_t struct_size);

/**
 * Create the runtime of this rank (collective over the communicator: every
 * rank must pass the same stages, steps, rule, parameters and memory --
 * checked, INVALID_ARGUMENT on every rank naming the first rank that differs;
 * with memory = CUDA every rank's communicator must have its device
 * transport, else INVALID_ARGUMENT on every rank naming the first rank
 * without one). The communicator must outlive the handle and stays the
 * caller's. Starts two threads (memory = CUDA: and two NCCL communicators,
 * two streams). *out is set on success only.
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

/** The handle's schedule (world size, stages, steps, rule), struct_size =
 *  schedule_size (pass sizeof(*schedule)). */
FLATMEM_API flatmem_status flatmem_cyclic_get_schedule(const flatmem_cyclic_t *handle,
                                                       flatmem_cyclic_schedule *schedule,
                                                       size_t schedule_size);

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
 * action_size = sizeof(*action).
 */
FLATMEM_API flatmem_status flatmem_cyclic_next(flatmem_cyclic_t *handle,
                                               flatmem_cyclic_action *action, size_t action_size);

/**
 * Hand over the gradient of `stage` computed in the current time step (which
 * must be that stage's BACKWARD, once). gradient: float32 or float64,
 * compact, at least one element, the same dtype and size on every rank
 * (a mismatch poisons the handles, naming both sizes); kDLCPU when
 * options.memory = HOST, kDLCUDA on the communicator's device when CUDA (the
 * other kind is INVALID_ARGUMENT naming options.memory). The buffer belongs
 * to the handle until flatmem_cyclic_next returns its update; do not read or
 * write it meanwhile. Returns at once; the reduction runs in the background.
 * On a NaN/Inf under FLATMEM_NONFINITE_ERROR a host buffer is untouched and
 * this call fails with NON_FINITE; a device buffer is scanned by the chain
 * thread once the caller's stream got there, so the NON_FINITE (naming stage,
 * step and the first bad element) comes from a later call -- the
 * flatmem_cyclic_next that waits for this gradient's update at the latest,
 * or any flatmem_cyclic_next / _reduce after the scan finished -- and the
 * buffer is untouched too.
 * A device gradient is read after the work enqueued so far on the legacy
 * default stream (this is flatmem_cyclic_reduce_stream with stream NULL).
 */
FLATMEM_API flatmem_status flatmem_cyclic_reduce(flatmem_cyclic_t *handle, int32_t stage,
                                                 DLTensor *gradient);

/**
 * flatmem_cyclic_reduce for a gradient computed on `stream` (a cudaStream_t
 * of the communicator's device; NULL = the legacy default stream): an event
 * recorded on it now is what the chain waits for before it reads the buffer.
 * No host wait. Ignored (any value) for host gradients.
 */
FLATMEM_API flatmem_status flatmem_cyclic_reduce_stream(flatmem_cyclic_t *handle, int32_t stage,
                                                        DLTensor *gradient, void *stream);

/** What happened in one time step of this rank. */
typedef struct flatmem_cyclic_time_step_stats {
  int64_t time_step;
  flatmem_cyclic_action_kind kind;
  int32_t stage;
  int64_t step;
  /** Stage activations held, and their bytes (options.activation_bytes). */
  int32_t activations_held;
  /** Reserved (ABI 1 padding): written 0. */
  int32_t reserved0;
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
 * time_step). element_size = sizeof(flatmem_cyclic_time_step_stats) as the
 * caller was compiled: element i lies at (char *)stats + i * element_size.
 */
FLATMEM_API flatmem_status flatmem_cyclic_stats(const flatmem_cyclic_t *handle, int64_t first,
                                                int64_t count,
                                                flatmem_cyclic_time_step_stats *stats,
                                                size_t element_size, int64_t *written);

/** The totals since create. summary_size = sizeof(*summary). */
FLATMEM_API flatmem_status flatmem_cyclic_summary_get(const flatmem_cyclic_t *handle,
                                                      flatmem_cyclic_summary *summary,
                                                      size_t summary_size);

/*
 * ------------------------------------------------------------------------
 * ZeRO relay (options.parameters = FLATMEM_CYCLIC_PARAMETERS_RELAYED)
 * ------------------------------------------------------------------------
 * Each of the N ranks owns 1/N of every stage's parameters instead of a
 * replica; before each FORWARD and each BACKWARD of stage j the full stage
 * reaches the rank by a relay along the stagger order, and the averaged
 * gradient returns to the owners in shards. Training is bitwise the
 * replicated DELAY1 mode's: the same versions, the same averages.
 *
 * Shards: c_j = ceil(n_j / N); rank k owns elements
 *   [min(k c_j, n_j), min((k + 1) c_j, n_j))        (flatmem_cyclic_shard_range)
 * of stage j (W and b flattened as the caller lays them out). A stage with
 * fewer than N elements leaves the last ranks' shards EMPTY (0 elements);
 * with n_j not a multiple of N the last non-empty shard is shorter.
 *
 * Rules: DELAY1 only. SYNC has no stagger: every rank would need stage j at
 * the same time step and the relay would run the ranks one after another
 * (INVALID_ARGUMENT). NEWEST lets ranks use different versions of a stage in
 * one step, which one relayed copy cannot serve (UNSUPPORTED).
 *
 * Versions: version v of stage j = the initial parameters after the averages
 * of steps 0 .. v-1 were applied by the caller's optimizer. Rank r's FORWARD
 * and BACKWARD of step s use version u(s) = max(0, s - 1) (DELAY1).
 *
 * Updates: every rank updates its own shard of stage j from version v to
 * v + 1 (v = 0 .. S-1) at the global time step
 *   T_upd(j, v) = 2L (v + 1) + 2L - 1 - j,
 * the time step of rank 0's BACKWARD of stage j in step v + 1, the last use of
 * version v (that gather was made one time step earlier, see below); the
 * FORWARD of j in step v + 2, the first use of v + 1, follows. The action of
 * that time step carries update_stage = j, update_step = v on EVERY rank (the
 * forward slots of the replicated mode carry none). On return from
 * flatmem_cyclic_next the gradient buffer handed over for (j, v) holds the
 * average of step v in THIS RANK'S SHARD RANGE (the rest of the buffer is
 * unspecified); apply it to the registered shard in place. One update per
 * time step at most; the last (v = S-1) leaves version S, the replicated
 * mode's final parameters, in the shards.
 *
 * Relays: for each stage j and step s two relays run in stagger order
 * 0 -> 1 -> ... -> N-1, one before the FORWARD and one before the BACKWARD.
 * Rank 0 gathers the stage: its own shard is copied inside
 * flatmem_cyclic_next of the time step, the others arrive from their owners,
 * which send a copy of version u(s) inside their flatmem_cyclic_next of the
 * time step before the gather when they already hold u(s) there (else of the
 * gather's own time step: only stage 0's forward). Rank r > 0 receives the
 * full stage from rank r - 1. Each rank but N - 1 sends it on to r + 1 as
 * soon as flatmem_cyclic_parameters copied it out. Receives are posted one
 * time step ahead into handle staging: a full stage of the largest stage's
 * bytes each, K = max(1, D) + 1 buffers where D = max over ranks of
 * offset(r + 1) - offset(r) = ceil(2L / N) (in use / arriving, plus the
 * D - 1 relays that wait at the sender until the next rank posts its
 * receive): 3 for N = L, 2 for N >= 2L. Parameter memory per rank:
 * sum_j c_j elements of shards plus at most K full stages, against
 * sum_j n_j replicated (3L/N + 1 against L stage-units for equal stages
 * when N divides 2L: equal at N = L = 4, 0.625 of it at N = 2L = 8), and up
 * to 3 shard copies on their way to rank 0 (an owner ahead of rank 0 waits
 * for it to take them).
 *
 * Gradients: the reduce chain is the replicated mode's (partial sums
 * 0 -> 1 -> ... -> N-1, rank N-1 scales); then rank N-1 sends shard k of the
 * average to owner k (no ring delivery), bitwise the replicated average.
 * Gradients must have n_j elements (INVALID_ARGUMENT otherwise). The gradient
 * of step v is released by the update of step v at T_upd(j, v), before this
 * rank's BACKWARD of j in step v + 1: one buffer per stage is enough.
 *
 * Driving a relayed handle (the replicated loop plus three calls):
 *   for each stage j: flatmem_cyclic_set_shard(h, j, my_shard[j]);
 *   for (;;) {
 *     flatmem_cyclic_next(h, &a, sizeof a);
 *     if (a.kind == FLATMEM_CYCLIC_DONE) break;
 *     if (a.update_stage >= 0)   // own shard range of the gradient buffer
 *       apply(my_shard[a.update_stage], gradient_buffer(a.update_stage, a.update_step));
 *     if (a.kind == FORWARD or BACKWARD) {
 *       flatmem_cyclic_parameters(h, full_stage);   // waits for the relay
 *       ... forward / backward with full_stage, reduce as before ...
 *     }
 *   }
 * flatmem_cyclic_next refuses (INVALID_ARGUMENT, not advancing) when a
 * FORWARD / BACKWARD passed without flatmem_cyclic_parameters: the relay
 * cannot go on without it. When it returns DONE it first waits (<= timeout)
 * until the next rank took this rank's last relays.
 *
 * Failures: as the replicated mode. A relay that does not arrive within
 * options.timeout_ms fails flatmem_cyclic_parameters with TIMEOUT naming
 * "cyclic parameter relay, stage j, step s (FORWARD), from rank r"; the waits
 * of flatmem_cyclic_next (a staging buffer to come free: "... rank r+1 to
 * take the relay"; an owner's shard copies to be taken by rank 0) have the
 * same deadline and name what they wait for; a dead peer gives PEER_FAILURE
 * at once; each poisons the handle and the communicator.
 * Destroying a relayed handle after its first time step and before DONE
 * poisons the communicator, whatever is in flight at that moment: the peers
 * need this rank's shards until the end (they fail at once naming it).
 *
 * On the device (options.memory = CUDA): shards, gradients and `full` are
 * kDLCUDA on the communicator's device, and N <= 2L (so that every rank's
 * offset differs from the previous rank's: with N > 2L ranks in lockstep
 * would have to pass a stage on within one time step; UNSUPPORTED at
 * create). flatmem_cyclic_set_shard_stream registers, with each shard, the
 * stream the caller updates it on: the handle's copies of the shard (for
 * rank 0's gathers) are enqueued on that stream inside flatmem_cyclic_next,
 * so they fall between the caller's updates exactly where the host mode
 * takes its copies. The transfers run in lockstep with the clock, as the
 * stage-parallel handle's do: flatmem_cyclic_next of time step tau enqueues
 * ONE NCCL group (a private NCCL communicator, a transfer stream of the
 * handle) with every relay transfer of tau: rank 0 receives the shards of
 * its gather of tau, the owners send them (from the copies), rank r > 0
 * receives the full stage it uses in tau from r - 1, and rank r sends on the
 * stage rank r + 1 uses in tau (held since its own use, offset(r+1) -
 * offset(r) time steps earlier). flatmem_cyclic_parameters_stream waits on
 * the host (<= timeout) for that group, then copies the stage into `full` on
 * the caller's stream. That wait is for the whole group of tau: this rank's
 * sends too (to rank r + 1, its shard to rank 0), so neighbours run in
 * lockstep, and the message of a TIMEOUT names every peer of the group.
 * Each group waits (on the device) for the copies the handle enqueued on
 * the callers' streams since the previous one, so the host runs at most a
 * time step ahead of its own stream; before copying a shard,
 * flatmem_cyclic_next waits (on the host, <= timeout) for the previous
 * group, so a caller's stream never waits on a peer. Update the shards on
 * the stream registered with them, and order the update with the next
 * backward that writes the same gradient buffer (one stream, or an event). Device staging:
 * K full stages (as above) and 3 shard copies, cudaMalloc'ed at the first
 * flatmem_cyclic_next; the gradient scatter is the device chains' (one NCCL
 * group). Bitwise the host relay for finite values. Run on one GPU (a world of
 * one rank); multi-rank device relays are untested.
 */

/**
 * RELAYED: register this rank's shard of `stage` (0 .. L-1): kDLCPU
 * (options.memory = HOST) or kDLCUDA on the communicator's device (CUDA), float32
 * or float64 (the same dtype for every stage, and the dtype of the gradients
 * and of flatmem_cyclic_parameters' `full`), compact, exactly
 * end - begin elements of flatmem_cyclic_shard_range (0 for an empty shard:
 * data may then be NULL). The buffer holds version 0 of the shard at the
 * first flatmem_cyclic_next and stays the caller's: the runtime reads it only
 * inside flatmem_cyclic_next (it sends copies), and the caller writes it only
 * at the update actions of the stage. Every stage must be registered before
 * the first flatmem_cyclic_next; registering again (e.g. a moved buffer) is
 * allowed between actions. Errors: INVALID_ARGUMENT naming `shard` (size:
 * both sizes; dtype; the other memory kind) or `stage`, or the handle when
 * it is replicated; nothing is registered then. Thread rule:
 * the handle's (one thread at a time).
 */
FLATMEM_API flatmem_status flatmem_cyclic_set_shard(flatmem_cyclic_t *handle, int32_t stage,
                                                    DLTensor *shard);
/** flatmem_cyclic_set_shard with the cudaStream_t the caller updates a
 *  device shard on (NULL = the legacy default stream; ignored on the host). */
FLATMEM_API flatmem_status flatmem_cyclic_set_shard_stream(flatmem_cyclic_t *handle, int32_t stage,
                                                           DLTensor *shard, void *stream);

/** RELAYED: the element range [*begin, *end) of `stage` that rank `rank`
 *  owns (formula above; *begin == *end for an empty shard). Thread-safe. */
FLATMEM_API flatmem_status flatmem_cyclic_shard_range(const flatmem_cyclic_t *handle, int32_t stage,
                                                      int32_t rank, int64_t *begin, int64_t *end);

/**
 * RELAYED: during a FORWARD or BACKWARD action, once: wait (<= timeout) for
 * the relay of the action's stage and copy the full stage parameters,
 * version max(0, step - 1), into `full`: the shards' memory kind, the registered dtype,
 * compact, n_j elements; then pass them on to the next rank (in the
 * background). Errors: INVALID_ARGUMENT naming `full` (dtype, size: both
 * sizes), or the call itself when the current action is not a FORWARD /
 * BACKWARD, was already served, or the handle is replicated; a `full` of the
 * other memory kind than options.memory; TIMEOUT / PEER_FAILURE (handle and communicator poisoned)
 * as above. `full` is written only on success. Thread rule: the handle's.
 */
FLATMEM_API flatmem_status flatmem_cyclic_parameters(flatmem_cyclic_t *handle, DLTensor *full);
/** flatmem_cyclic_parameters for a device `full`, the copy enqueued on
 *  `stream` (NULL = the legacy default stream; ignored on the host). */
FLATMEM_API flatmem_status flatmem_cyclic_parameters_stream(flatmem_cyclic_t *handle, DLTensor *full,
                                                            void *stream);

/** RELAYED, per time step (flatmem_cyclic_relay_stats). */
typedef struct flatmem_cyclic_relay_time_step {
  int64_t time_step;
  /** Parameter bytes this rank held: its shards plus the staging buffers
   *  holding a stage (arriving, in use, or waiting to be taken by rank r+1),
   *  the most at any call during the time step (measured: a send waits for
   *  the next rank's receive, so this depends on timing). */
  int64_t parameter_bytes;
  /** The same by the protocol (no timing): the shards plus the stages of
   *  the relays whose receive is posted (one time step before use) and that
   *  the next rank has not yet posted its receive for. */
  int64_t parameter_bytes_scheduled;
  /** Parameter bytes posted for sending in the time step: full stages
   *  relayed on and shards sent to rank 0 (deterministic: the caller's thread
   *  posts them). The gradient traffic is in flatmem_cyclic_stats. */
  int64_t relay_bytes_sent;
} flatmem_cyclic_relay_time_step;

/**
 * RELAYED: as flatmem_cyclic_stats, for the relay. element_size =
 * sizeof(flatmem_cyclic_relay_time_step) as the caller was compiled: element
 * i lies at (char *)stats + i * element_size.
 */
FLATMEM_API flatmem_status flatmem_cyclic_relay_stats(const flatmem_cyclic_t *handle, int64_t first,
                                                      int64_t count,
                                                      flatmem_cyclic_relay_time_step *stats,
                                                      size_t element_size, int64_t *written);

/** RELAYED: sizes and totals since create. */
typedef struct flatmem_cyclic_relay_summary {
  /** This rank's shards, all stages (bytes). */
  int64_t shard_bytes;
  /** One replica of all stages (bytes): what REPLICATED holds per rank. */
  int64_t replicated_bytes;
  /** K and K times the largest stage's bytes (allocated at the first
   *  flatmem_cyclic_set_shard). */
  int64_t staging_buffers;
  int64_t staging_bytes;
  /** Largest parameter_bytes / parameter_bytes_scheduled of a time step. */
  int64_t peak_parameter_bytes;
  int64_t peak_parameter_bytes_scheduled;
  int64_t relay_bytes_sent;
  int64_t relay_messages_sent;
} flatmem_cyclic_relay_summary;

/** RELAYED: the summary. summary_size = sizeof(*summary). */
FLATMEM_API flatmem_status flatmem_cyclic_relay_summary_get(const flatmem_cyclic_t *handle,
                                                            flatmem_cyclic_relay_summary *summary,
                                                            size_t summary_size);

#ifdef __cplusplus
} /* extern "C" */
#endif

/* The stage-parallel sibling (a no-op when flatmem.h already included it). */
#include <flatmem/cyclic_stages.h>

#endif /* FLATMEM_CYCLIC_H */
