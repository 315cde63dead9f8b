/*
 * flatmem/cyclic_stages.h -- stage-parallel cyclic training: L ranks, one per
 * model stage, serve N staggered micro-batches back to back.
 *
 * Included by <flatmem/flatmem.h> (include either; when <flatmem/cyclic.h> is
 * the first flatmem header a file includes, include this one too). Plain C99.
 * The conventions at the top of flatmem.h (statuses, last error, DLPack
 * checks, options structs) hold here too; the update rules and their names
 * come from <flatmem/cyclic.h> (flatmem_cyclic_rule).
 *
 * Where data parallelism times model parallelism needs N * L ranks (N
 * replicas of an L-stage pipeline, each rank busy 2 of every 2L time steps),
 * this handle runs the same training on L ranks: micro-batch m of a step
 * follows the cyclic schedule of data-parallel rank m of N (flatmem_cyclic_t
 * with N ranks), so the micro-batches reach stage j one after another and
 * rank j serves all of them. Each stage's parameters live once, on its rank;
 * its gradient is summed locally (no all-reduce); only the boundary tensors
 * (activations forward, their gradients backward) travel, point to point.
 *
 * ------------------------------------------------------------------------
 * The schedule (pure: flatmem_cyclic_stages_schedule_*)
 * ------------------------------------------------------------------------
 * L stages (rank j of the communicator runs stage j), N micro-batches per
 * training step, S steps, a rule. All times are global time steps tau >= 0.
 *
 *   offset(m)  = floor(m * 2L / N)     (under every rule, SYNC included)
 *   period P   = 2L                    DELAY1, NEWEST
 *              = 2L + offset(N - 1)    SYNC (the pipeline drains: every
 *                                      stage's last backward of step s comes
 *                                      before its first forward of step s+1)
 *   micro-batch m, step s, phase p (0 .. 2L-1) runs at
 *              tau = offset(m) + P s + p:
 *              p < L   FORWARD  of stage p            (F(j, m, s) = offset(m) + P s + j)
 *              p >= L  BACKWARD of stage 2L - 1 - p   (B(j, m, s) = offset(m) + P s + 2L-1-j)
 *
 * Stage j at time step tau runs every (micro-batch, kind) scheduled for it
 * there -- 0, 1 or more: exactly one per time step in steady state when
 * N = L, two when N = 2L -- in a fixed order: backwards first (they free
 * activations), then forwards, each by ascending micro-batch. Forwards of one
 * time step all belong to one step, so do backwards (offsets are < P).
 * The forward of stage j + 1 of (m, s) is one time step after that of stage
 * j, the backward of stage j - 1 one time step after that of stage j: each
 * boundary tensor is consumed in the time step after it is produced.
 *
 * Parameter versions. Version v of stage j is its parameters after the
 * averaged gradients of steps 0 .. v-1 were applied (v = 0: the initial
 * ones). The forward AND the backward of (m, s) at stage j use version
 *   version(j, m, s) = max(0, s - delay(m, j)),
 *   delay = 0 (SYNC), 1 (DELAY1), or for NEWEST the data-parallel
 *           flatmem_cyclic_schedule_delay(rank = m, stage = j) of the schedule
 *           { world_size = N, stages = L, rule = NEWEST }:
 *           0 when offset(N-1) - offset(m) <= 2j, else 1,
 * so stage-parallel training equals flatmem_cyclic_t training with N ranks
 * (rank m <-> micro-batch m, same data, same initial parameters) bit for bit
 * for DELAY1 and NEWEST, and for SYNC where that runtime's ring all-reduce
 * adds in the same order (N <= 2; for N >= 3 its ring adds the N gradients in
 * another order: equal to rounding, and bitwise equal to the sum in
 * micro-batch order that this handle forms).
 * The caller keeps K = versions_kept(j) versions of its stage (version v in
 * slot v % K). K is the least number that lets every action find its version:
 * 1 or 2 (SYNC: 1; DELAY1: 2 when offset(N-1) > 2j + 1 and S >= 3, else 1;
 * NEWEST: see flatmem_cyclic_stages_schedule_versions_kept). The first action
 * that uses version v + 1 carries update_step = v: before computing it, form
 * version v + 1 in slot (v + 1) % K from version v (slot v % K; the same slot
 * when K = 1: update in place) and the average of step v
 * (flatmem_cyclic_stages_average), with the caller's optimizer. After the
 * stage's last backward, IDLE actions (one per remaining update, at time step
 * B(j, N-1, S-1) + 1) form the versions up to S: version S, in slot S % K,
 * holds the trained parameters.
 *
 * Gradients are local. After each BACKWARD hand the micro-batch's stage
 * gradient to flatmem_cyclic_stages_accumulate: the handle adds it into the
 * step's accumulator in micro-batch order ((g_0 + g_1) + g_2 ..., the order of
 * the data-parallel reduce chain) and, after micro-batch N - 1, multiplies by
 * 1/N (the factor rounded to the element type). The accumulators are handle
 * memory: two gradient-sized buffers (steps s and s + 1 are the most in
 * flight at once), allocated at the first accumulate.
 *
 * Boundary tensors. After a FORWARD of stage j < L-1 (its output activation,
 * for stage j + 1) and after a BACKWARD of stage j > 0 (the gradient w.r.t.
 * the stage's input, for stage j - 1), call flatmem_cyclic_stages_send once:
 * the tensor is copied into handle staging and sent in the background; the
 * call returns at once (it waits only when all its staging buffers are still
 * in flight). Before computing a FORWARD of stage j > 0 or a BACKWARD of
 * stage j < L-1 call flatmem_cyclic_stages_receive (waits at most the
 * timeout). The action's sends / receives say which (0 or 1).
 * options.boundary_bytes[j] (L-1 entries) is the largest tensor crossing the
 * boundary between stages j and j+1 in either direction; every message
 * carries boundary_bytes[j] + 32 bytes (a header, then the tensor, padded).
 * Staging, allocated at create: R = min(ceil(N / 2L), 64) + 1 buffers per
 * neighbour and direction for sending and R for receiving; receives are
 * posted R messages ahead so transfers overlap the caller's compute.
 *
 * ------------------------------------------------------------------------
 * Driving a handle (rank j; K = versions_kept(j) parameter slots)
 * ------------------------------------------------------------------------
 *   flatmem_cyclic_stages_create(&h, comm, &options);        // collective
 *   for (;;) {
 *     flatmem_cyclic_stages_action a;
 *     flatmem_cyclic_stages_next(h, &a, sizeof a);
 *     if (a.kind == FLATMEM_CYCLIC_DONE) break;
 *     if (a.update_step >= 0) {                        // version v+1 from v
 *       flatmem_cyclic_stages_average(h, average);     // of step a.update_step
 *       slot[(v+1) % K] = optimizer(slot[v % K], average);   v = a.update_step
 *     }
 *     if (a.kind == FLATMEM_CYCLIC_FORWARD) {
 *       if (a.receives) flatmem_cyclic_stages_receive(h, input(a.micro_batch));
 *       forward(slot[a.version % K], a.micro_batch, a.step);  // keep activations
 *       if (a.sends) flatmem_cyclic_stages_send(h, output);
 *     }
 *     if (a.kind == FLATMEM_CYCLIC_BACKWARD) {
 *       if (a.receives) flatmem_cyclic_stages_receive(h, doutput);
 *       backward(slot[a.version % K], ...);  // frees the micro-batch's activations
 *       flatmem_cyclic_stages_accumulate(h, gradient);
 *       if (a.sends) flatmem_cyclic_stages_send(h, dinput);
 *     }
 *   }
 *   flatmem_cyclic_stages_destroy(h);
 * Out of order calls are INVALID_ARGUMENT and change nothing:
 * flatmem_cyclic_stages_next refuses to advance while the current action's
 * receive, send or accumulate is missing; each may be called once per action
 * that lists it; flatmem_cyclic_stages_average only in an action with
 * update_step >= 0.
 *
 * ------------------------------------------------------------------------
 * Transport, threads, failure
 * ------------------------------------------------------------------------
 * Host tensors (kDLCPU, options.memory = HOST, the default) over the
 * communicator's host transport (UCX, or the in-process group). The handle
 * starts no thread (transfers progress in the transport). Its messages use
 * the cyclic tag space with the handle's own id: user messages and
 * collectives may run beside it. One cyclic handle (flatmem_cyclic_t or this)
 * per communicator at a time.
 *
 * Device tensors (kDLCUDA, options.memory = CUDA) on the communicator's CUDA
 * device: every tensor of the handle (boundary tensors, gradients, averages)
 * is then device memory, and the *_stream variants of send / receive /
 * accumulate / average take the caller's cudaStream_t (the plain calls use
 * the legacy default stream). The communicator needs its device transport
 * (flatmem_comm_init_device); create makes a private NCCL communicator (its
 * own NCCL buffers and proxy thread) connected to the neighbours within the
 * timeout, a non-blocking transfer stream, and device staging: per
 * neighbour and direction 2 ceil(N / 2L) slots of 32 + boundary_bytes bytes
 * (the most messages one time step carries, twice: alternate time steps),
 * allocated with cudaMalloc at create; the two accumulators are cudaMalloc'ed
 * at the first accumulate. Because each boundary tensor is consumed in the
 * time step after it is produced, the transfers run in lockstep with the
 * clock: when flatmem_cyclic_stages_next enters time step tau it enqueues
 * ONE NCCL group on the transfer stream with every message this rank
 * produced in tau - 1 (sends) and every message it consumes in tau
 * (receives); the neighbours' groups of tau hold the matching halves, so the
 * groups pair up in the same order on every rank (next waits on the host only
 * while NCCL launches the group, within the timeout). Per call, on the
 * caller's stream:
 *   send        waits (stream-ordered) for the group that last sent the
 *               slot, writes the 32-byte header and copies the tensor into
 *               the slot; the tensor is the caller's again for any work
 *               enqueued after the call on the same stream;
 *   receive     waits ON THE HOST (<= timeout, polling NCCL and the host
 *               communicator) for the transfer stream to finish the group of
 *               tau -- which also waits for this rank's own sends of tau - 1,
 *               i.e. for the caller's stream to have reached them --, checks
 *               the header (sizes, as the host path), then copies the
 *               payload into `into` on the caller's stream;
 *   accumulate  copy / add kernel / scale kernel into the device
 *               accumulator, the host arithmetic (bitwise the same sums for
 *               finite values); ordered after the accumulator's previous
 *               accumulate / average whatever stream that was on (an event);
 *   average     a device copy into `out`, ordered the same way.
 * DONE waits (<= timeout) for the transfer stream to finish the last group.
 * A transfer stuck on a dead neighbour is seen by the next receive or DONE
 * (every stage receives in every step), which aborts the NCCL communicator
 * and poisons the host one as below; until then the caller's stream may wait
 * (a send waits for the previous group), so synchronise it only after the
 * handle's calls returned. Destroying the handle waits for the device
 * (cudaFree). Builds without NCCL return UNSUPPORTED for options.memory = CUDA.
 * Thread rule: one thread at a time per handle.
 * Every wait -- a receive, a staging buffer still in flight, the last sends at
 * DONE -- is bounded by options.timeout_ms. A failure (a dead or wedged
 * neighbour, a size mismatch between sender and receiver) poisons the handle
 * and its communicator, so the other stages fail at once (PEER_FAILURE) or
 * within their timeout, with a message naming the stage, micro-batch, step
 * and what was awaited ("cyclic stages, stage 2, micro-batch 3, step 7:
 * receive the activation from stage 1 (rank 1): ..."). Later calls return
 * FLATMEM_STATUS_COMM_POISONED.
 */
#ifndef FLATMEM_CYCLIC_STAGES_H

#include <flatmem/flatmem.h>
#include <flatmem/cyclic.h>

/* flatmem.h includes this header at its end. When <flatmem/cyclic.h> was the
 * first flatmem header included, this point is reached while cyclic.h is half
 * read (its types not yet declared): the body is then left out, and a caller
 * who wants it includes <flatmem/cyclic_stages.h> itself. FLATMEM_CYCLIC_OPTIONS_INIT
 * is defined at the end of cyclic.h. */
#if defined(FLATMEM_CYCLIC_OPTIONS_INIT) && !defined(FLATMEM_CYCLIC_STAGES_H)
#define FLATMEM_CYCLIC_STAGES_H

#ifdef __cplusplus
extern "C" {
#endif

/** The shape of a stage-parallel schedule. */
typedef struct flatmem_cyclic_stages_schedule {
  /** sizeof(flatmem_cyclic_stages_schedule) as the caller was compiled. */
  size_t struct_size;
  /** L: stages = ranks, 1 .. 65535. */
  int32_t stages;
  /** N: micro-batches per training step, 1 .. 65535. */
  int32_t micro_batches;
  /** S: training steps, 1 .. 2^40. */
  int64_t steps;
  flatmem_cyclic_rule rule;
  /** Reserved (ABI 1 padding): set 0; see "Reserved fields" in flatmem.h. */
  int32_t reserved0;
} flatmem_cyclic_stages_schedule;

#define FLATMEM_CYCLIC_STAGES_SCHEDULE_INIT \
  { sizeof(flatmem_cyclic_stages_schedule), 0, 0, 0, FLATMEM_CYCLIC_DELAY1, 0 }

/** One action of one stage rank. */
typedef struct flatmem_cyclic_stages_action {
  /** The global time step it belongs to (several actions may share one). */
  int64_t time_step;
  /** FORWARD, BACKWARD, IDLE (an update only, after the last step) or DONE. */
  flatmem_cyclic_action_kind kind;
  /** The stage (= this rank); -1 for DONE. */
  int32_t stage;
  /** FORWARD / BACKWARD: micro-batch 0 .. N-1 and step 0 .. S-1; else -1. */
  int32_t micro_batch;
  /** Reserved (ABI 1 padding): written 0. */
  int32_t reserved0;
  int64_t step;
  /** FORWARD / BACKWARD: the parameter version to use (slot version % K);
   *  else -1. */
  int64_t version;
  /** >= 0: before the action form version update_step + 1 from version
   *  update_step and the average of step update_step; -1: none. */
  int64_t update_step;
  /** 1: call flatmem_cyclic_stages_receive before computing (the activation
   *  from stage - 1 for a FORWARD, the output gradient from stage + 1 for a
   *  BACKWARD); 0: not. */
  int32_t receives;
  /** 1: call flatmem_cyclic_stages_send after computing (the output for
   *  stage + 1 / the input gradient for stage - 1). */
  int32_t sends;
  /** 1 (every BACKWARD): call flatmem_cyclic_stages_accumulate. */
  int32_t accumulates;
  /** Micro-batches whose activations this stage holds during the time step
   *  (forward done, backward not finished: F(j,m,s) <= tau <= B(j,m,s)). */
  int32_t activations_held;
  /** This action's place among the time step's actions, and their number
   *  (0 and 0 for DONE). */
  int32_t index_in_time_step;
  int32_t actions_in_time_step;
} flatmem_cyclic_stages_action;

/** offset(m) in time steps. */
FLATMEM_API flatmem_status flatmem_cyclic_stages_schedule_offset(
    const flatmem_cyclic_stages_schedule *schedule, int32_t micro_batch, int64_t *offset);

/** The period P: time steps per training step. */
FLATMEM_API flatmem_status flatmem_cyclic_stages_schedule_period(
    const flatmem_cyclic_stages_schedule *schedule, int64_t *period);

/** Time steps of the whole run: B(0, N-1, S-1) + 2 (stage 0's last backward,
 *  then its update-only time step); time steps 0 .. *time_steps - 1. */
FLATMEM_API flatmem_status flatmem_cyclic_stages_schedule_length(
    const flatmem_cyclic_stages_schedule *schedule, int64_t *time_steps);

/**
 * K = versions_kept(stage): parameter versions stage `stage` keeps (slot
 * v % K), the least that works: 2 when some version v is still used by an
 * action after the first use of v + 1, else 1. With F, B as above and P the
 * period, m0 = the first micro-batch with delay 0 at the stage (N if none):
 *   m0 = N (all delay 1):  2 iff S >= 3 and offset(N-1) > P - 2L + 1 + 2j;
 *   m0 = 0 (all delay 0):  1;
 *   0 < m0 < N:            2 iff S >= 2 and offset(m0) - offset(m0-1) < 2L - 1 - 2j.
 */
FLATMEM_API flatmem_status flatmem_cyclic_stages_schedule_versions_kept(
    const flatmem_cyclic_stages_schedule *schedule, int32_t stage, int32_t *versions_kept);

/**
 * The actions of `stage` at global time step time_step >= 0, in the order the
 * handle returns them: up to `capacity` into actions[0 ..], *count = how many
 * there are (call with capacity 0 to ask). element_size =
 * sizeof(flatmem_cyclic_stages_action) as the caller was compiled: element i
 * lies at (char *)actions + i * element_size. An IDLE time step has none; at
 * and after the schedule's length *count = 0 too. Pure and thread-safe.
 */
FLATMEM_API flatmem_status flatmem_cyclic_stages_schedule_actions(
    const flatmem_cyclic_stages_schedule *schedule, int32_t stage, int64_t time_step,
    flatmem_cyclic_stages_action *actions, size_t element_size, int32_t capacity, int32_t *count);

/** Steady-state occupancy of one stage rank (a run long enough that every
 *  period is a full one), from the schedule. */
typedef struct flatmem_cyclic_stages_occupancy {
  /** Fraction of a period's time steps with at least one action. */
  double busy_fraction;
  /** Actions per time step, largest. */
  int32_t peak_actions;
  /** Micro-batches whose activations the stage holds: largest and mean over
   *  a period (mean = N (2L - 2j) / P). */
  int32_t peak_activations_held;
  double mean_activations_held;
} flatmem_cyclic_stages_occupancy;

/** The steady-state occupancy of `stage` under the schedule.
 *  occupancy_size = sizeof(*occupancy). */
FLATMEM_API flatmem_status flatmem_cyclic_stages_schedule_occupancy(
    const flatmem_cyclic_stages_schedule *schedule, int32_t stage,
    flatmem_cyclic_stages_occupancy *occupancy, size_t occupancy_size);

/** The stage-parallel runtime of one stage rank. */
typedef struct flatmem_cyclic_stages_s flatmem_cyclic_stages_t;

typedef struct flatmem_cyclic_stages_options {
  /** sizeof(flatmem_cyclic_stages_options) as the caller was compiled. */
  size_t struct_size;
  /** L (required): must equal the communicator's size. */
  int32_t stages;
  /** N (required), 1 .. 65535. */
  int32_t micro_batches;
  /** S (required). */
  int64_t steps;
  flatmem_cyclic_rule rule;
  /** Reserved (ABI 1 padding): set 0; see "Reserved fields" in flatmem.h. */
  int32_t reserved0;
  /** L - 1 entries (required when L > 1; copied at create): [j] = the
   *  largest bytes of a tensor crossing the boundary between stages j and
   *  j + 1 (an activation or its gradient), 0 .. 2^40. */
  const int64_t *boundary_bytes;
  /** Accounting only: bytes of activations stage j keeps per micro-batch
   *  (L entries, >= 0, copied). NULL = 1, so activation bytes count
   *  micro-batches. */
  const int64_t *activation_bytes;
  /** Deadline of every wait in milliseconds (0 = the communicator's default). */
  int64_t timeout_ms;
  /** Time steps of per-time-step statistics kept (the most recent); 0 = 65536. */
  int64_t history;
  /** HOST (default: kDLCPU tensors) or CUDA (kDLCUDA tensors on the
   *  communicator's device, over NCCL: see "Transport" above; needs
   *  flatmem_comm_init_device before create). Every rank must pass the same. */
  flatmem_cyclic_memory memory;
  /** Reserved (ABI 1 padding): set 0; see "Reserved fields" in flatmem.h. */
  int32_t reserved1;
} flatmem_cyclic_stages_options;

#define FLATMEM_CYCLIC_STAGES_OPTIONS_INIT \
  { sizeof(flatmem_cyclic_stages_options), 0, 0, 0, FLATMEM_CYCLIC_DELAY1, 0, NULL, NULL, 0, 0, \
    FLATMEM_CYCLIC_MEMORY_HOST, 0 }

/** Fill the struct_size bytes at options with the defaults, struct_size =
 *  struct_size (pass sizeof(*options)). Thread-safe. */
FLATMEM_API flatmem_status flatmem_cyclic_stages_options_init(flatmem_cyclic_stages_options *options,
                                                              size_t struct_size);

/**
 * Create the runtime of this stage rank (collective over the communicator:
 * every rank must pass the same stages, micro_batches, steps, rule and
 * boundary_bytes -- checked, INVALID_ARGUMENT on every rank naming the first
 * rank and field that differ). Allocates the staging (see the top) and posts
 * the first receives. The communicator must outlive the handle and stays the
 * caller's. *out is set on success only.
 */
FLATMEM_API flatmem_status flatmem_cyclic_stages_create(flatmem_cyclic_stages_t **out,
                                                        flatmem_comm_t *comm,
                                                        const flatmem_cyclic_stages_options *options);

/**
 * Release the handle. After DONE (or a failure) this is local and quick.
 * Before DONE the neighbours cannot finish without this rank: the
 * communicator is poisoned first (they fail naming this stage). NULL is a
 * no-op.
 */
FLATMEM_API flatmem_status flatmem_cyclic_stages_destroy(flatmem_cyclic_stages_t *handle);

/** The handle's schedule, struct_size = schedule_size (pass
 *  sizeof(*schedule)). */
FLATMEM_API flatmem_status flatmem_cyclic_stages_get_schedule(const flatmem_cyclic_stages_t *handle,
                                                              flatmem_cyclic_stages_schedule *schedule,
                                                              size_t schedule_size);

/**
 * The next action of this stage (as flatmem_cyclic_stages_schedule_actions
 * lists them, time step after time step; time steps without actions are
 * skipped). INVALID_ARGUMENT without advancing when the current action's
 * receive, send or accumulate was not done. Before DONE it waits (<= timeout)
 * until this rank's sends have left; DONE again on every later call. On a
 * failure the handle is poisoned; *action is then not written.
 * action_size = sizeof(*action).
 */
FLATMEM_API flatmem_status flatmem_cyclic_stages_next(flatmem_cyclic_stages_t *handle,
                                                      flatmem_cyclic_stages_action *action,
                                                      size_t action_size);

/*
 * Tensors below: kDLCPU when options.memory = HOST, kDLCUDA on the
 * communicator's device when CUDA (the other kind is INVALID_ARGUMENT naming
 * options.memory). The *_stream variants take the caller's cudaStream_t for
 * device tensors (NULL = the legacy default stream; ignored on the host); the
 * plain calls are them with stream NULL.
 */

/**
 * Send the current action's boundary tensor (its sends == 1, once): any
 * dtype with whole bytes, compact, at most boundary_bytes of the boundary it
 * crosses. Copied: the tensor is the caller's again on return (device: for
 * work enqueued after the call on `stream`).
 */
FLATMEM_API flatmem_status flatmem_cyclic_stages_send(flatmem_cyclic_stages_t *handle,
                                                      const DLTensor *tensor);
/** flatmem_cyclic_stages_send on the caller's `stream` (device tensors). */
FLATMEM_API flatmem_status flatmem_cyclic_stages_send_stream(flatmem_cyclic_stages_t *handle,
                                                             const DLTensor *tensor, void *stream);

/**
 * Receive the current action's boundary tensor (its receives == 1, once)
 * into `into` (compact, exactly as many bytes as were sent: else
 * INVALID_ARGUMENT naming both sizes, and the handle and communicator are
 * poisoned, since sender and receiver disagree). Waits at most the timeout
 * (device: for the arrival, on the host; the copy into `into` is then
 * enqueued on `stream`). Nothing is written to `into` on error.
 */
FLATMEM_API flatmem_status flatmem_cyclic_stages_receive(flatmem_cyclic_stages_t *handle,
                                                         DLTensor *into);
/** flatmem_cyclic_stages_receive on the caller's `stream` (device tensors). */
FLATMEM_API flatmem_status flatmem_cyclic_stages_receive_stream(flatmem_cyclic_stages_t *handle,
                                                                DLTensor *into, void *stream);

/**
 * Add the current BACKWARD's stage gradient (once) into its step's
 * accumulator: float32 or float64, compact, at least one element, the same
 * dtype and element count every time (the first call fixes them). Device:
 * enqueued on `stream`.
 */
FLATMEM_API flatmem_status flatmem_cyclic_stages_accumulate(flatmem_cyclic_stages_t *handle,
                                                            const DLTensor *gradient);
/** flatmem_cyclic_stages_accumulate on the caller's `stream` (device tensors). */
FLATMEM_API flatmem_status flatmem_cyclic_stages_accumulate_stream(flatmem_cyclic_stages_t *handle,
                                                                   const DLTensor *gradient, void *stream);

/**
 * Copy the average of step update_step (the current action's) into `out`
 * (the accumulate dtype and element count, compact). Only while the current
 * action has update_step >= 0. Device: enqueued on `stream` (order it after
 * the accumulates: the same stream, or the caller's synchronisation).
 */
FLATMEM_API flatmem_status flatmem_cyclic_stages_average(const flatmem_cyclic_stages_t *handle,
                                                         DLTensor *out);
/** flatmem_cyclic_stages_average on the caller's `stream` (device tensors). */
FLATMEM_API flatmem_status flatmem_cyclic_stages_average_stream(const flatmem_cyclic_stages_t *handle,
                                                                DLTensor *out, void *stream);

/** What happened in one time step of this stage rank. */
typedef struct flatmem_cyclic_stages_time_step_stats {
  int64_t time_step;
  /** Actions run (0 for time steps without any: they are recorded too). */
  int32_t actions;
  /** Micro-batches whose activations the stage holds, and their bytes. */
  int32_t activations_held;
  int64_t activation_bytes;
  /** Boundary bytes posted for sending (headers and padding included). */
  int64_t bytes_sent;
  /** Wall-clock seconds from the next() that began the time step to the
   *  next() that began a later one (0 for the current one). */
  double seconds;
  /** Seconds of it spent waiting (receives, staging, the last sends). */
  double wait_seconds;
} flatmem_cyclic_stages_time_step_stats;

/** Totals since create. */
typedef struct flatmem_cyclic_stages_summary {
  /** Time steps begun (with or without actions). */
  int64_t time_steps;
  int64_t actions;
  int64_t bytes_sent;
  int64_t messages_sent;
  int64_t max_bytes_sent_per_time_step;
  int32_t peak_activations_held;
  /** Reserved (ABI 1 padding): written 0. */
  int32_t reserved0;
  int64_t peak_activation_bytes;
  /** Mean micro-batches held over the time steps begun. */
  double mean_activations_held;
  /** Time steps with >= 1 action / time steps begun (the whole run so far). */
  double busy_fraction;
  /** The schedule's steady-state busy fraction of this stage
   *  (flatmem_cyclic_stages_schedule_occupancy). */
  double steady_busy_fraction;
  double wait_seconds;
  double seconds;
} flatmem_cyclic_stages_summary;

/**
 * Copy the statistics of time steps first .. first + count - 1 that are still
 * kept into stats[0 .. *written - 1] (as flatmem_cyclic_stats; element i
 * at (char *)stats + i * element_size).
 */
FLATMEM_API flatmem_status flatmem_cyclic_stages_stats(const flatmem_cyclic_stages_t *handle,
                                                       int64_t first, int64_t count,
                                                       flatmem_cyclic_stages_time_step_stats *stats,
                                                       size_t element_size, int64_t *written);

/** The totals since create. summary_size = sizeof(*summary). */
FLATMEM_API flatmem_status flatmem_cyclic_stages_summary_get(const flatmem_cyclic_stages_t *handle,
                                                             flatmem_cyclic_stages_summary *summary,
                                                             size_t summary_size);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* cyclic.h read */
#endif /* FLATMEM_CYCLIC_STAGES_H */
