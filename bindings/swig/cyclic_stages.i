/* cyclic_stages.i -- stage-parallel cyclic training (<flatmem/cyclic_stages.h>),
 * %include'd at the end of comm.i (it needs Communicator and the cyclic.h
 * names). Language-neutral: structs with %extend methods; the Python sugar
 * is bindings/python/src/flatmem/cyclic_stages.py.
 *
 * What the target language sees:
 *   CyclicStagesSchedule   flatmem_cyclic_stages_schedule: CyclicStagesSchedule(stages,
 *                          micro_batches, steps, rule) checked at once; offset(m), period(),
 *                          length(), versions_kept(stage), action_count(stage, t),
 *                          action(stage, t, index), occupancy(stage) -- the pure
 *                          flatmem_cyclic_stages_schedule_* queries.
 *   CyclicStagesAction, CyclicStagesOccupancy, CyclicStagesTimeStepStats,
 *   CyclicStagesSummary    the C structs, read-only (-1 = none, as in C).
 *   CyclicStages           a flatmem_cyclic_stages_t over a Communicator:
 *                          CyclicStages(comm, stages, micro_batches, steps, rule,
 *                          boundary_bytes, activation_bytes, timeout_ms, history, memory);
 *                          next(), send(t), receive(t), accumulate(t), average(t), their
 *                          *_stream(t, stream) twins (a cudaStream_t as an integer; Java:
 *                          the overloads send(t, stream), ...), schedule(),
 *                          load_stats() / stat(i), summary(), close().
 * Lifetime: as Cyclic (comm.i): the handle is a user of its Communicator
 * (close() of the communicator is refused until the CyclicStages is closed).
 * send / accumulate copy their tensor and receive / average write theirs
 * before returning, so, unlike Cyclic.reduce, nothing is kept past a call
 * (memory = CYCLIC_MEMORY_CUDA: the copies are enqueued on the call's stream,
 * ordered like the caller's own work on it, so nothing is kept either).
 * Python releases the GIL in every call (next / receive / send may wait).
 */

%{
typedef struct flatmem_swig_cyclic_stages {
  flatmem_cyclic_stages_t *handle; /* NULL once closed */
  flatmem_swig_comm *comm;         /* a user reference, dropped by close */
  flatmem_cyclic_stages_time_step_stats *stats;
  int64_t stats_count;
} flatmem_swig_cyclic_stages;

static flatmem_cyclic_stages_t *flatmem_swig_cyclic_stages_open(const flatmem_swig_cyclic_stages *s,
                                                                const char *what) {
  if (!s->handle)
    flatmem_swig_fail(FLATMEM_STATUS_INVALID_ARGUMENT, "%s: the CyclicStages handle is closed", what);
  return s->handle;
}

static void flatmem_swig_cyclic_stages_release(flatmem_swig_cyclic_stages *s) {
  if (s->handle) flatmem_swig_check(flatmem_cyclic_stages_destroy(s->handle));
  s->handle = NULL;
  flatmem_swig_comm_unuse(s->comm);
  s->comm = NULL;
}
%}

/* The raw functions: wrapped as methods below. */
%ignore flatmem_cyclic_stages_schedule_offset;
%ignore flatmem_cyclic_stages_schedule_period;
%ignore flatmem_cyclic_stages_schedule_length;
%ignore flatmem_cyclic_stages_schedule_versions_kept;
%ignore flatmem_cyclic_stages_schedule_actions;
%ignore flatmem_cyclic_stages_schedule_occupancy;
%ignore flatmem_cyclic_stages_options_init;
%ignore flatmem_cyclic_stages_create;
%ignore flatmem_cyclic_stages_destroy;
%ignore flatmem_cyclic_stages_get_schedule;
%ignore flatmem_cyclic_stages_next;
%ignore flatmem_cyclic_stages_send;
%ignore flatmem_cyclic_stages_receive;
%ignore flatmem_cyclic_stages_accumulate;
%ignore flatmem_cyclic_stages_average;
%ignore flatmem_cyclic_stages_send_stream;
%ignore flatmem_cyclic_stages_receive_stream;
%ignore flatmem_cyclic_stages_accumulate_stream;
%ignore flatmem_cyclic_stages_average_stream;
%ignore flatmem_cyclic_stages_stats;
%ignore flatmem_cyclic_stages_summary_get;
%ignore flatmem_cyclic_stages_options;
%ignore flatmem_cyclic_stages_s;
%ignore FLATMEM_CYCLIC_STAGES_SCHEDULE_INIT;
%ignore FLATMEM_CYCLIC_STAGES_OPTIONS_INIT;

%rename(CyclicStagesSchedule) flatmem_cyclic_stages_schedule;
%rename(CyclicStagesAction) flatmem_cyclic_stages_action;
%rename(CyclicStagesOccupancy) flatmem_cyclic_stages_occupancy;
%rename(CyclicStagesTimeStepStats) flatmem_cyclic_stages_time_step_stats;
%rename(CyclicStagesSummary) flatmem_cyclic_stages_summary;
%immutable flatmem_cyclic_stages_schedule::struct_size;
/* Results: read-only, every field. */
%immutable flatmem_cyclic_stages_action::time_step;
%immutable flatmem_cyclic_stages_action::kind;
%immutable flatmem_cyclic_stages_action::stage;
%immutable flatmem_cyclic_stages_action::micro_batch;
%immutable flatmem_cyclic_stages_action::step;
%immutable flatmem_cyclic_stages_action::version;
%immutable flatmem_cyclic_stages_action::update_step;
%immutable flatmem_cyclic_stages_action::receives;
%immutable flatmem_cyclic_stages_action::sends;
%immutable flatmem_cyclic_stages_action::accumulates;
%immutable flatmem_cyclic_stages_action::activations_held;
%immutable flatmem_cyclic_stages_action::index_in_time_step;
%immutable flatmem_cyclic_stages_action::actions_in_time_step;
%immutable flatmem_cyclic_stages_occupancy::busy_fraction;
%immutable flatmem_cyclic_stages_occupancy::peak_actions;
%immutable flatmem_cyclic_stages_occupancy::peak_activations_held;
%immutable flatmem_cyclic_stages_occupancy::mean_activations_held;
%immutable flatmem_cyclic_stages_time_step_stats::time_step;
%immutable flatmem_cyclic_stages_time_step_stats::actions;
%immutable flatmem_cyclic_stages_time_step_stats::activations_held;
%immutable flatmem_cyclic_stages_time_step_stats::activation_bytes;
%immutable flatmem_cyclic_stages_time_step_stats::bytes_sent;
%immutable flatmem_cyclic_stages_time_step_stats::seconds;
%immutable flatmem_cyclic_stages_time_step_stats::wait_seconds;
%immutable flatmem_cyclic_stages_summary::time_steps;
%immutable flatmem_cyclic_stages_summary::actions;
%immutable flatmem_cyclic_stages_summary::bytes_sent;
%immutable flatmem_cyclic_stages_summary::messages_sent;
%immutable flatmem_cyclic_stages_summary::max_bytes_sent_per_time_step;
%immutable flatmem_cyclic_stages_summary::peak_activations_held;
%immutable flatmem_cyclic_stages_summary::peak_activation_bytes;
%immutable flatmem_cyclic_stages_summary::mean_activations_held;
%immutable flatmem_cyclic_stages_summary::busy_fraction;
%immutable flatmem_cyclic_stages_summary::steady_busy_fraction;
%immutable flatmem_cyclic_stages_summary::wait_seconds;
%immutable flatmem_cyclic_stages_summary::seconds;
#ifdef SWIGJAVA
/* Before the struct's declaration (a class typemap applies to what follows). */
%typemap(javainterfaces) struct flatmem_cyclic_stages_schedule "AutoCloseable"
%typemap(javacode) struct flatmem_cyclic_stages_schedule %{
  @Override public void close() { delete(); }
%}
#endif
%include <flatmem/cyclic_stages.h>

/* ------------------------------------------------------------------------ */
/* CyclicStagesSchedule: the pure queries                                    */
/* ------------------------------------------------------------------------ */
/* SWIG names an %extend method's C function <struct>_<method>: offset() would
 * be flatmem_cyclic_stages_schedule_offset, the library's own function. The
 * methods are written as get_* and renamed (as CyclicSchedule's in flatmem.i). */
%rename(offset) flatmem_cyclic_stages_schedule::get_offset;
%rename(period) flatmem_cyclic_stages_schedule::get_period;
%rename(length) flatmem_cyclic_stages_schedule::get_length;
%rename(versions_kept) flatmem_cyclic_stages_schedule::get_versions_kept;
%rename(action_count) flatmem_cyclic_stages_schedule::get_action_count;
%rename(action) flatmem_cyclic_stages_schedule::get_action;
%rename(occupancy) flatmem_cyclic_stages_schedule::get_occupancy;
%extend flatmem_cyclic_stages_schedule {
  /* L stages, N micro-batches per step, S steps, a CyclicRule; the library
   * checks it at once (INVALID_ARGUMENT naming the field). */
  flatmem_cyclic_stages_schedule(int32_t stages, int32_t micro_batches, int64_t steps,
                                 int32_t rule = FLATMEM_CYCLIC_DELAY1) {
    const flatmem_cyclic_stages_schedule init = FLATMEM_CYCLIC_STAGES_SCHEDULE_INIT;
    int64_t length = 0;
    flatmem_cyclic_stages_schedule *s = (flatmem_cyclic_stages_schedule *)malloc(sizeof *s);
    if (!s) {
      flatmem_swig_fail(FLATMEM_STATUS_OUT_OF_MEMORY, "CyclicStagesSchedule: out of memory");
      return NULL;
    }
    *s = init;
    s->stages = stages;
    s->micro_batches = micro_batches;
    s->steps = steps;
    s->rule = (flatmem_cyclic_rule)rule;
    if (!flatmem_swig_check(flatmem_cyclic_stages_schedule_length(s, &length))) {
      free(s);
      return NULL;
    }
    return s;
  }
  ~flatmem_cyclic_stages_schedule() { free($self); }

  /* offset(m) = floor(m 2L / N) time steps. */
  int64_t get_offset(int32_t micro_batch) const {
    int64_t offset = 0;
    flatmem_swig_check(flatmem_cyclic_stages_schedule_offset($self, micro_batch, &offset));
    return offset;
  }
  /* P: time steps per training step (2L; SYNC 2L + offset(N-1)). */
  int64_t get_period() const {
    int64_t period = 0;
    flatmem_swig_check(flatmem_cyclic_stages_schedule_period($self, &period));
    return period;
  }
  /* Time steps of the whole run. */
  int64_t get_length() const {
    int64_t time_steps = 0;
    flatmem_swig_check(flatmem_cyclic_stages_schedule_length($self, &time_steps));
    return time_steps;
  }
  /* K: parameter versions `stage` keeps (slot v % K). */
  int32_t get_versions_kept(int32_t stage) const {
    int32_t kept = 0;
    flatmem_swig_check(flatmem_cyclic_stages_schedule_versions_kept($self, stage, &kept));
    return kept;
  }
  /* How many actions `stage` runs at `time_step` (0 when none or past the end). */
  int32_t get_action_count(int32_t stage, int64_t time_step) const {
    int32_t count = 0;
    flatmem_swig_check(flatmem_cyclic_stages_schedule_actions($self, stage, time_step, NULL,
                                                              sizeof(flatmem_cyclic_stages_action), 0, &count));
    return count;
  }
  /* The index-th of them (0 .. action_count - 1), in the handle's order. */
  flatmem_cyclic_stages_action get_action(int32_t stage, int64_t time_step, int32_t index) const {
    flatmem_cyclic_stages_action a, *all;
    int32_t count = 0;
    memset(&a, 0, sizeof a);
    if (!flatmem_swig_check(flatmem_cyclic_stages_schedule_actions($self, stage, time_step, NULL, sizeof a, 0, &count)))
      return a;
    if (index < 0 || index >= count) {
      flatmem_swig_fail(FLATMEM_STATUS_INVALID_ARGUMENT,
                        "CyclicStagesSchedule.action: index %d; stage %d has %d action(s) at time step %lld",
                        (int)index, (int)stage, (int)count, (long long)time_step);
      return a;
    }
    all = (flatmem_cyclic_stages_action *)flatmem_swig_results(count, sizeof *all, "CyclicStagesSchedule.action");
    if (!all) return a;
    if (flatmem_swig_check(
            flatmem_cyclic_stages_schedule_actions($self, stage, time_step, all, sizeof *all, count, &count)))
      a = all[index];
    free(all);
    return a;
  }
  /* Steady-state occupancy of `stage`. */
  flatmem_cyclic_stages_occupancy get_occupancy(int32_t stage) const {
    flatmem_cyclic_stages_occupancy o;
    memset(&o, 0, sizeof o);
    flatmem_swig_check(flatmem_cyclic_stages_schedule_occupancy($self, stage, &o, sizeof o));
    return o;
  }
}

/* ------------------------------------------------------------------------ */
/* CyclicStages: the runtime (flatmem_cyclic_stages_t)                       */
/* ------------------------------------------------------------------------ */
%rename(CyclicStages) flatmem_swig_cyclic_stages;
#ifdef SWIGJAVA
/* Java: the *_stream calls are overloads of the plain ones (as Cyclic.reduce's). */
%rename(send) flatmem_swig_cyclic_stages::send_stream;
%rename(receive) flatmem_swig_cyclic_stages::receive_stream;
%rename(accumulate) flatmem_swig_cyclic_stages::accumulate_stream;
%rename(average) flatmem_swig_cyclic_stages::average_stream;
#endif

#ifdef SWIGJAVA
%typemap(javainterfaces) struct flatmem_swig_cyclic_stages "AutoCloseable"
%typemap(javacode) struct flatmem_swig_cyclic_stages %{
  /** The runtime (collective) with a CyclicRule and a CyclicMemory: HOST (CPU
   *  Tensors) or CUDA (kDLCUDA Tensors on the communicator's device, over NCCL:
   *  every rank calls comm.init_device first; a flatmem built without NCCL
   *  throws STATUS_UNSUPPORTED). boundary_bytes: a (stages - 1,) int64 Tensor
   *  (null only when stages = 1); timeout_ms 0 = the communicator's. */
  public CyclicStages(Communicator comm, int stages, int micro_batches, long steps, CyclicRule rule,
                      Tensor boundary_bytes, long timeout_ms, CyclicMemory memory) {
    this(comm, stages, micro_batches, steps, rule == null ? -1 : rule.swigValue(), boundary_bytes, null, timeout_ms,
         0, memory == null ? -1 : memory.swigValue());
  }
%}
%typemap(javaclassmodifiers) struct flatmem_swig_cyclic_stages "/**
 * The stage-parallel cyclic runtime (cyclic_stages.h) of this stage rank over
 * a Communicator (collective create; rank j runs stage j). Loop: a = next();
 * stop at CYCLIC_DONE; when a.getUpdate_step() >= 0 form the next parameter
 * version from average(out); FORWARD: receive() if a.getReceives(), compute,
 * send() if a.getSends(); BACKWARD: receive() if it receives, compute,
 * accumulate(gradient), send() if it sends. Tensors are copied (send,
 * accumulate) or written (receive, average) before the call returns. With
 * memory = CYCLIC_MEMORY_CUDA (after comm.init_device on every rank) every
 * Tensor is kDLCUDA on the communicator's device and the overloads with a
 * cudaStream_t (its address; 0 = the legacy default stream) enqueue the
 * copies on it; a Tensor of the other kind throws FlatmemArgumentException
 * naming options.memory. One
 * thread drives it; waits are bounded by the timeout; failures throw
 * FlatmemException naming the stage, micro-batch, step and peer.
 */
public class"
#endif

struct flatmem_swig_cyclic_stages {};
%extend flatmem_swig_cyclic_stages {
  /* flatmem_cyclic_stages_create (collective). boundary_bytes: a (stages - 1,)
   * int64 Tensor (NULL only when stages = 1); activation_bytes: NULL or a
   * (stages,) int64 Tensor (accounting only); both copied. rule: a CyclicRule;
   * timeout_ms 0 = the communicator's; history 0 = 65536; memory: a
   * CyclicMemory (HOST: kDLCPU tensors; CUDA: kDLCUDA ones over NCCL, after
   * Communicator.init_device). */
  flatmem_swig_cyclic_stages(flatmem_swig_comm *comm, int32_t stages, int32_t micro_batches, int64_t steps,
                             int32_t rule = FLATMEM_CYCLIC_DELAY1,
                             const flatmem_swig_tensor *boundary_bytes = NULL,
                             const flatmem_swig_tensor *activation_bytes = NULL, int64_t timeout_ms = 0,
                             int64_t history = 0, int32_t memory = FLATMEM_CYCLIC_MEMORY_HOST) {
    flatmem_cyclic_stages_options o = FLATMEM_CYCLIC_STAGES_OPTIONS_INIT;
    flatmem_comm_t *h = flatmem_swig_comm_open(comm, "CyclicStages");
    flatmem_swig_cyclic_stages *s;
    if (!h) return NULL;
    if (!flatmem_swig_int64_entries(boundary_bytes, stages > 0 ? stages - 1 : 0, "CyclicStages",
                                    "boundary_bytes", "one entry per boundary (stages - 1)", &o.boundary_bytes) ||
        !flatmem_swig_int64_entries(activation_bytes, stages, "CyclicStages", "activation_bytes",
                                    "one entry per stage", &o.activation_bytes))
      return NULL;
    o.stages = stages;
    o.micro_batches = micro_batches;
    o.steps = steps;
    o.rule = (flatmem_cyclic_rule)rule;
    o.timeout_ms = timeout_ms;
    o.history = history;
    o.memory = (flatmem_cyclic_memory)memory;
    s = (flatmem_swig_cyclic_stages *)calloc(1, sizeof *s);
    if (!s) {
      flatmem_swig_fail(FLATMEM_STATUS_OUT_OF_MEMORY, "CyclicStages: out of memory");
      return NULL;
    }
    if (!flatmem_swig_check(flatmem_cyclic_stages_create(&s->handle, h, &o))) {
      free(s);
      return NULL;
    }
    flatmem_swig_comm_use(comm);
    s->comm = comm;
    return s;
  }
  ~flatmem_swig_cyclic_stages() {
    flatmem_swig_cyclic_stages_release($self);
    free($self->stats);
    free($self);
  }
  /* flatmem_cyclic_stages_destroy now (before DONE it poisons the
   * communicator: the neighbours fail naming this stage); releases the
   * communicator. No-op when closed. */
  void close() { flatmem_swig_cyclic_stages_release($self); }
  bool is_open() const { return $self->handle != NULL; }

  flatmem_cyclic_stages_schedule schedule() {
    flatmem_cyclic_stages_schedule s = FLATMEM_CYCLIC_STAGES_SCHEDULE_INIT;
    flatmem_cyclic_stages_t *h = flatmem_swig_cyclic_stages_open($self, "CyclicStages.schedule");
    if (h) flatmem_swig_check(flatmem_cyclic_stages_get_schedule(h, &s, sizeof s));
    return s;
  }
  /* flatmem_cyclic_stages_next: may wait (before DONE, for the last sends). */
  flatmem_cyclic_stages_action next() {
    flatmem_cyclic_stages_action a;
    flatmem_cyclic_stages_t *h = flatmem_swig_cyclic_stages_open($self, "CyclicStages.next");
    memset(&a, 0, sizeof a);
    if (h) flatmem_swig_check(flatmem_cyclic_stages_next(h, &a, sizeof a));
    return a;
  }
  /* The current action's boundary tensor out (copied; may wait for staging). */
  void send(const flatmem_swig_tensor *tensor) {
    flatmem_cyclic_stages_t *h = flatmem_swig_cyclic_stages_open($self, "CyclicStages.send");
    if (h) flatmem_swig_check(flatmem_cyclic_stages_send(h, flatmem_swig_dl(tensor)));
  }
  /* The current action's boundary tensor in (waits at most the timeout). */
  void receive(flatmem_swig_tensor *into) {
    flatmem_cyclic_stages_t *h = flatmem_swig_cyclic_stages_open($self, "CyclicStages.receive");
    if (h) flatmem_swig_check(flatmem_cyclic_stages_receive(h, flatmem_swig_dl_out(into)));
  }
  /* The current BACKWARD's stage gradient (added into the step's accumulator). */
  void accumulate(const flatmem_swig_tensor *gradient) {
    flatmem_cyclic_stages_t *h = flatmem_swig_cyclic_stages_open($self, "CyclicStages.accumulate");
    if (h) flatmem_swig_check(flatmem_cyclic_stages_accumulate(h, flatmem_swig_dl(gradient)));
  }
  /* The average of the current action's update_step, copied into out. */
  void average(flatmem_swig_tensor *out) {
    flatmem_cyclic_stages_t *h = flatmem_swig_cyclic_stages_open($self, "CyclicStages.average");
    if (h) flatmem_swig_check(flatmem_cyclic_stages_average(h, flatmem_swig_dl_out(out)));
  }
  /* The flatmem_cyclic_stages_*_stream twins: kDLCUDA tensors are copied on
   * `stream` (a cudaStream_t as an integer, 0 = the legacy default stream;
   * ignored for kDLCPU ones). */
  void send_stream(const flatmem_swig_tensor *tensor, int64_t stream) {
    flatmem_cyclic_stages_t *h = flatmem_swig_cyclic_stages_open($self, "CyclicStages.send_stream");
    if (h) flatmem_swig_check(flatmem_cyclic_stages_send_stream(h, flatmem_swig_dl(tensor), (void *)(intptr_t)stream));
  }
  void receive_stream(flatmem_swig_tensor *into, int64_t stream) {
    flatmem_cyclic_stages_t *h = flatmem_swig_cyclic_stages_open($self, "CyclicStages.receive_stream");
    if (h)
      flatmem_swig_check(
          flatmem_cyclic_stages_receive_stream(h, flatmem_swig_dl_out(into), (void *)(intptr_t)stream));
  }
  void accumulate_stream(const flatmem_swig_tensor *gradient, int64_t stream) {
    flatmem_cyclic_stages_t *h = flatmem_swig_cyclic_stages_open($self, "CyclicStages.accumulate_stream");
    if (h)
      flatmem_swig_check(
          flatmem_cyclic_stages_accumulate_stream(h, flatmem_swig_dl(gradient), (void *)(intptr_t)stream));
  }
  void average_stream(flatmem_swig_tensor *out, int64_t stream) {
    flatmem_cyclic_stages_t *h = flatmem_swig_cyclic_stages_open($self, "CyclicStages.average_stream");
    if (h)
      flatmem_swig_check(
          flatmem_cyclic_stages_average_stream(h, flatmem_swig_dl_out(out), (void *)(intptr_t)stream));
  }
  /* flatmem_cyclic_stages_stats into the handle: returns how many were
   * copied; read them with stat(0 .. n-1). */
  int64_t load_stats(int64_t first, int64_t count) {
    int64_t written = 0;
    flatmem_cyclic_stages_time_step_stats *buffer;
    flatmem_cyclic_stages_t *h = flatmem_swig_cyclic_stages_open($self, "CyclicStages.load_stats");
    if (!h) return 0;
    buffer = (flatmem_cyclic_stages_time_step_stats *)flatmem_swig_results(count, sizeof *buffer,
                                                                          "CyclicStages.load_stats");
    if (!buffer) return 0;
    if (!flatmem_swig_check(flatmem_cyclic_stages_stats(h, first, count, buffer, sizeof *buffer, &written))) {
      free(buffer);
      return 0;
    }
    free($self->stats);
    $self->stats = buffer;
    $self->stats_count = written;
    return written;
  }
  flatmem_cyclic_stages_time_step_stats stat(int64_t index) const {
    flatmem_cyclic_stages_time_step_stats s;
    memset(&s, 0, sizeof s);
    if (index < 0 || index >= $self->stats_count)
      flatmem_swig_fail(FLATMEM_STATUS_INVALID_ARGUMENT, "CyclicStages.stat: index %lld out of range [0, %lld)",
                        (long long)index, (long long)$self->stats_count);
    else
      s = $self->stats[index];
    return s;
  }
  flatmem_cyclic_stages_summary summary() {
    flatmem_cyclic_stages_summary s;
    flatmem_cyclic_stages_t *h = flatmem_swig_cyclic_stages_open($self, "CyclicStages.summary");
    memset(&s, 0, sizeof s);
    if (h) flatmem_swig_check(flatmem_cyclic_stages_summary_get(h, &s, sizeof s));
    return s;
  }
}
