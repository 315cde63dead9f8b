/* comm.i -- communicators (<flatmem/comm.h>), the ring loss's communicator
 * and the cyclic runtime (<flatmem/cyclic.h>), %include'd by flatmem.i after
 * Contrastive. Language-neutral: structs with %extend methods; Python sugar
 * lives in bindings/python/src/flatmem/comm.py and cyclic.py.
 *
 * What the target language sees:
 *   UniqueId             flatmem_comm_unique_id: UniqueId(address) = rank 0's
 *                        flatmem_comm_unique_id_create; hex() / UniqueId.from_hex(text)
 *                        (256 hex digits) to hand it to the other ranks.
 *   Communicator         a flatmem_comm_t: Communicator(rank, world_size, id,
 *                        timeout_ms, connect_timeout_ms), Communicator.from_env(...),
 *                        rank(), world_size(), check_health(), isend / irecv -> CommRequest,
 *                        all_reduce, ring_shift, barrier, init_device (the NCCL device
 *                        transport, for Cyclic's memory = CYCLIC_MEMORY_CUDA), close(),
 *                        abort(), is_open(), users().
 *   CommLocalGroup       flatmem_comm_create_local: take(rank) -> Communicator.
 *   CommRequest          wait(timeout_ms), test().
 *   Cyclic               a flatmem_cyclic_t over a Communicator: next(), reduce(),
 *                        reduce_stream() (a kDLCUDA gradient read after a cudaStream_t's work),
 *                        schedule(), load_stats() / stat(i), summary(), close(); the ZeRO
 *                        relay (parameters = CYCLIC_PARAMETERS_RELAYED): set_shard(),
 *                        shard_begin() / shard_end(), parameters(), their device twins
 *                        set_shard_stream() / parameters_stream() (Java: the overloads
 *                        set_shard(stage, shard, stream) / parameters(full, stream)),
 *                        load_relay_stats() / relay_stat(i), relay_summary().
 *   CyclicTimeStepStats, CyclicSummary   read-only results.
 *   CyclicStages, CyclicStagesSchedule, ...   the stage-parallel runtime
 *                        (<flatmem/cyclic_stages.h>), in cyclic_stages.i (included at the end).
 * Times are in milliseconds; 0 = the communicator's default (options.timeout_ms).
 *
 * Lifetime (the same for every language). A Communicator is a small
 * reference-counted record around the C handle: the proxy, each CommRequest
 * and each Contrastive / Cyclic created on it hold a reference, so the record
 * is freed by the last of them (never a dangling pointer, whatever order a
 * garbage collector finalises them in).
 *  - close() / abort() release the C handle at once, but REFUSE
 *    (INVALID_ARGUMENT "Communicator.close: still used by 2 handle(s) ...")
 *    while a Contrastive or Cyclic created on it is alive: close those first.
 *    Outstanding requests do not block them (the C library cancels them; a
 *    later wait() raises INVALID_ARGUMENT "... closed").
 *  - A proxy that is finalised without close() releases the handle when its
 *    last user goes (deferred; never under a user's feet).
 *  - Every call on a closed communicator raises INVALID_ARGUMENT naming it.
 * Thread rule: the C one (one thread at a time per communicator, its
 * Contrastive handles being its users); the Python package holds a lock.
 * Python releases the GIL in every call here (threads="1"): waits, all-reduce,
 * barrier, ring forward/backward and Cyclic.next block without it.
 */

%{
#include <pthread.h>

typedef struct flatmem_swig_comm {
  flatmem_comm_t *handle; /* NULL once closed or aborted */
  int32_t rank, world_size;
  int users;              /* live Contrastive / Cyclic / CyclicStages handles on it */
  int refs;               /* proxy + requests + users; freed at 0 */
} flatmem_swig_comm;

static flatmem_swig_comm *flatmem_swig_comm_new(flatmem_comm_t *handle) {
  flatmem_swig_comm *c = (flatmem_swig_comm *)calloc(1, sizeof *c);
  if (!c) {
    flatmem_comm_destroy(handle);
    flatmem_swig_fail(FLATMEM_STATUS_OUT_OF_MEMORY, "Communicator: out of memory");
    return NULL;
  }
  c->handle = handle;
  c->refs = 1;
  flatmem_comm_rank(handle, &c->rank);
  flatmem_comm_world_size(handle, &c->world_size);
  return c;
}

static void flatmem_swig_comm_ref(flatmem_swig_comm *c) { __atomic_add_fetch(&c->refs, 1, __ATOMIC_ACQ_REL); }

/* Drops a reference; the last one destroys a handle still open (orderly). */
static void flatmem_swig_comm_unref(flatmem_swig_comm *c) {
  if (c && __atomic_sub_fetch(&c->refs, 1, __ATOMIC_ACQ_REL) == 0) {
    flatmem_comm_destroy(c->handle);
    free(c);
  }
}

/* The open C handle, or NULL with INVALID_ARGUMENT naming `what`. */
static flatmem_comm_t *flatmem_swig_comm_open(const flatmem_swig_comm *c, const char *what) {
  if (!c) {
    flatmem_swig_fail(FLATMEM_STATUS_INVALID_ARGUMENT, "%s: comm is NULL", what);
    return NULL;
  }
  if (!c->handle)
    flatmem_swig_fail(FLATMEM_STATUS_INVALID_ARGUMENT,
                      "%s: the communicator (rank %d of %d) is closed", what, (int)c->rank,
                      (int)c->world_size);
  return c->handle;
}

/* A user (Contrastive, Cyclic) starts / stops using c. */
static void flatmem_swig_comm_use(flatmem_swig_comm *c) {
  flatmem_swig_comm_ref(c);
  __atomic_add_fetch(&c->users, 1, __ATOMIC_ACQ_REL);
}
static void flatmem_swig_comm_unuse(flatmem_swig_comm *c) {
  if (!c) return;
  __atomic_sub_fetch(&c->users, 1, __ATOMIC_ACQ_REL);
  flatmem_swig_comm_unref(c);
}

/* close() / abort(): refused while users are alive. */
static int flatmem_swig_comm_releasable(flatmem_swig_comm *c, const char *what) {
  const int users = __atomic_load_n(&c->users, __ATOMIC_ACQUIRE);
  if (users == 0) return 1;
  flatmem_swig_fail(FLATMEM_STATUS_INVALID_ARGUMENT,
                    "%s: still used by %d handle(s) (Contrastive or Cyclic created with this "
                    "communicator); close them first",
                    what, users);
  return 0;
}

static flatmem_comm_options flatmem_swig_comm_options(int64_t timeout_ms, int64_t connect_timeout_ms) {
  flatmem_comm_options o = FLATMEM_COMM_OPTIONS_INIT;
  o.timeout_ms = timeout_ms;
  o.connect_timeout_ms = connect_timeout_ms;
  return o;
}

/* The communicator of each Contrastive handle made with one (the handle is
 * the library's own struct: its destructor finds its communicator here). */
typedef struct flatmem_swig_comm_user {
  const void *handle;
  flatmem_swig_comm *comm;
  struct flatmem_swig_comm_user *next;
} flatmem_swig_comm_user;
static flatmem_swig_comm_user *flatmem_swig_comm_user_list = NULL;
static pthread_mutex_t flatmem_swig_comm_user_lock = PTHREAD_MUTEX_INITIALIZER;

static int flatmem_swig_comm_user_add(const void *handle, flatmem_swig_comm *comm) {
  flatmem_swig_comm_user *u = (flatmem_swig_comm_user *)malloc(sizeof *u);
  if (!u) {
    flatmem_swig_fail(FLATMEM_STATUS_OUT_OF_MEMORY, "Contrastive: out of memory");
    return 0;
  }
  flatmem_swig_comm_use(comm);
  u->handle = handle;
  u->comm = comm;
  pthread_mutex_lock(&flatmem_swig_comm_user_lock);
  u->next = flatmem_swig_comm_user_list;
  flatmem_swig_comm_user_list = u;
  pthread_mutex_unlock(&flatmem_swig_comm_user_lock);
  return 1;
}

/* Forgets handle (after it was destroyed) and releases its communicator. */
static void flatmem_swig_comm_user_remove(const void *handle) {
  flatmem_swig_comm_user **p, *found = NULL;
  pthread_mutex_lock(&flatmem_swig_comm_user_lock);
  for (p = &flatmem_swig_comm_user_list; *p; p = &(*p)->next)
    if ((*p)->handle == handle) {
      found = *p;
      *p = found->next;
      break;
    }
  pthread_mutex_unlock(&flatmem_swig_comm_user_lock);
  if (found) {
    flatmem_swig_comm_unuse(found->comm);
    free(found);
  }
}

typedef struct flatmem_swig_request {
  flatmem_swig_comm *comm;          /* a reference */
  flatmem_comm_request_t *request;  /* NULL once waited */
  int32_t peer;
  int32_t receive;
} flatmem_swig_request;

static flatmem_swig_request *flatmem_swig_post(flatmem_swig_comm *c, const flatmem_swig_tensor *buffer,
                                               int32_t peer, uint32_t tag, int receive) {
  const char *what = receive ? "Communicator.irecv" : "Communicator.isend";
  flatmem_comm_t *h = flatmem_swig_comm_open(c, what);
  flatmem_comm_request_t *request = NULL;
  flatmem_swig_request *r;
  flatmem_status status;
  if (!h) return NULL;
  if (!buffer) {
    flatmem_swig_fail(FLATMEM_STATUS_INVALID_ARGUMENT, "%s: buffer is NULL", what);
    return NULL;
  }
  r = (flatmem_swig_request *)calloc(1, sizeof *r);
  if (!r) {
    flatmem_swig_fail(FLATMEM_STATUS_OUT_OF_MEMORY, "%s: out of memory", what);
    return NULL;
  }
  status = receive ? flatmem_comm_irecv(h, (DLTensor *)&buffer->dl, peer, tag, &request, NULL)
                   : flatmem_comm_isend(h, &buffer->dl, peer, tag, &request, NULL);
  if (!flatmem_swig_check(status)) {
    free(r);
    return NULL;
  }
  flatmem_swig_comm_ref(c);
  r->comm = c;
  r->request = request;
  r->peer = peer;
  r->receive = receive;
  return r;
}

typedef struct flatmem_swig_comm_group {
  int32_t world_size;
  flatmem_comm_t **comms; /* NULL once taken */
} flatmem_swig_comm_group;

/* Zeroed room for `count` results of `size` bytes (0 .. 2^24 of them), or
 * NULL with INVALID_ARGUMENT / OUT_OF_MEMORY naming `what`. */
static void *flatmem_swig_results(int64_t count, size_t size, const char *what) {
  void *p;
  if (count < 0 || count > (int64_t)1 << 24) {
    flatmem_swig_fail(FLATMEM_STATUS_INVALID_ARGUMENT, "%s: count %lld; expected 0 to 2^24", what,
                      (long long)count);
    return NULL;
  }
  p = calloc((size_t)(count > 0 ? count : 1), size);
  if (!p) flatmem_swig_fail(FLATMEM_STATUS_OUT_OF_MEMORY, "%s: out of memory", what);
  return p;
}

typedef struct flatmem_swig_cyclic {
  flatmem_cyclic_t *handle; /* NULL once closed */
  flatmem_swig_comm *comm;  /* a user reference, dropped by close */
  flatmem_cyclic_time_step_stats *stats;
  int64_t stats_count;
  flatmem_cyclic_relay_time_step *relay_stats; /* RELAYED: load_relay_stats */
  int64_t relay_stats_count;
} flatmem_swig_cyclic;

/* An options array given as a Tensor: NULL stays NULL; else a compact
 * (count,) int64 CPU tensor, whose data goes to *entries. 0 with
 * INVALID_ARGUMENT "<what>: <field>: expected ..." otherwise. */
static int flatmem_swig_int64_entries(const flatmem_swig_tensor *tensor, int32_t count, const char *what,
                                      const char *field, const char *meaning, const int64_t **entries) {
  const DLTensor *t = tensor ? &tensor->dl : NULL;
  *entries = NULL;
  if (!t) return 1;
  if (t->dtype.code != kDLInt || t->dtype.bits != 64 || t->dtype.lanes != 1 || t->ndim != 1 ||
      t->shape[0] != count || t->strides || t->device.device_type != kDLCPU || !t->data) {
    flatmem_swig_fail(FLATMEM_STATUS_INVALID_ARGUMENT, "%s: %s: expected a compact (%d,) int64 CPU tensor, %s",
                      what, field, (int)count, meaning);
    return 0;
  }
  *entries = (const int64_t *)((const char *)t->data + t->byte_offset);
  return 1;
}

static flatmem_cyclic_t *flatmem_swig_cyclic_open(const flatmem_swig_cyclic *s, const char *what) {
  if (!s->handle) flatmem_swig_fail(FLATMEM_STATUS_INVALID_ARGUMENT, "%s: the Cyclic handle is closed", what);
  return s->handle;
}

static void flatmem_swig_cyclic_release(flatmem_swig_cyclic *s) {
  if (s->handle) flatmem_swig_check(flatmem_cyclic_destroy(s->handle));
  s->handle = NULL;
  flatmem_swig_comm_unuse(s->comm);
  s->comm = NULL;
}
%}

#ifdef SWIGJAVA
/* Java. Object.wait(long) is final: CommRequest.wait is waitFor.
 * Communicator, CommLocalGroup, Cyclic, CommRequest and UniqueId are
 * AutoCloseable. Communicator.close() / Cyclic.close() are the C-level
 * close above (a Communicator still used by a Contrastive or Cyclic refuses
 * with FlatmemArgumentException); CommLocalGroup / CommRequest / UniqueId
 * close() = delete(). The default arguments become overloads. The Tensors
 * handed to isend / irecv / Cyclic.reduce are kept reachable from Java while
 * the library may still touch them (the raw methods are private *_raw):
 * a request's buffer until its waitFor returns (and by the Communicator
 * until then, so a dropped request cannot free it), a gradient until next()
 * returns its update or the Cyclic is closed. Statuses: FlatmemException
 * (TIMEOUT, PEER_FAILURE, COMM_POISONED: status()), FlatmemArgumentException. */
%rename(isend_raw) flatmem_swig_comm::isend;
%rename(irecv_raw) flatmem_swig_comm::irecv;
%javamethodmodifiers flatmem_swig_comm::isend "private";
%javamethodmodifiers flatmem_swig_comm::irecv "private";
%rename(close_raw) flatmem_swig_comm::close;
%rename(abort_raw) flatmem_swig_comm::abort;
%javamethodmodifiers flatmem_swig_comm::close "private";
%javamethodmodifiers flatmem_swig_comm::abort "private";
%rename(waitFor_raw) flatmem_swig_request::wait;
%javamethodmodifiers flatmem_swig_request::wait "private";
%rename(reduce_raw) flatmem_swig_cyclic::reduce;
%javamethodmodifiers flatmem_swig_cyclic::reduce "private";
%rename(reduce_stream_raw) flatmem_swig_cyclic::reduce_stream;
%javamethodmodifiers flatmem_swig_cyclic::reduce_stream "private";
%rename(next_raw) flatmem_swig_cyclic::next;
%javamethodmodifiers flatmem_swig_cyclic::next "private";
%rename(close_raw) flatmem_swig_cyclic::close;
%javamethodmodifiers flatmem_swig_cyclic::close "private";
%rename(set_shard_raw) flatmem_swig_cyclic::set_shard;
%javamethodmodifiers flatmem_swig_cyclic::set_shard "private";
%rename(set_shard_stream_raw) flatmem_swig_cyclic::set_shard_stream;
%javamethodmodifiers flatmem_swig_cyclic::set_shard_stream "private";
/* parameters(full, stream): an overload of parameters(full), as CyclicStages' *_stream twins. */
%rename(parameters) flatmem_swig_cyclic::parameters_stream;

%typemap(javaclassmodifiers) struct flatmem_comm_unique_id "/**
 * What rank 0 makes (new UniqueId(\"host:port\"), port 0 = any free port) and
 * every rank passes to new Communicator(rank, world_size, id): hex() gives
 * 256 hex digits for a command line or file, UniqueId.from_hex(text) reads
 * them back. Rank 0 must create its Communicator in the process that made it.
 */
public class"
%typemap(javaclassmodifiers) struct flatmem_swig_comm "/**
 * A flatmem_comm_t: this process's rank of world_size ranks (UCX, or a
 * CommLocalGroup in one process). Messages are compact CPU Tensors (their
 * bytes); every wait is bounded by a timeout in milliseconds (0 = the
 * communicator's default, FLATMEM_COMM_TIMEOUT_MS or 60000). A timeout or a
 * dead peer throws FlatmemException (status() STATUS_TIMEOUT or
 * STATUS_PEER_FAILURE, the message naming the operation, step and peer rank)
 * and poisons the communicator: later calls throw STATUS_COMM_POISONED; release
 * it with abort(). Thread rule: one thread at a time (its Contrastive and Cyclic
 * handles are its users); distinct communicators are independent.
 */
public class"
%typemap(javaclassmodifiers) struct flatmem_swig_request "/**
 * An outstanding isend / irecv: finish it with waitFor() (once), which keeps
 * its buffer reachable until then.
 */
public class"
%typemap(javaclassmodifiers) struct flatmem_swig_comm_group "/**
 * world_size communicators of one group inside this process (messages are
 * memory copies, no UCX): take(rank) each once and use each from its own
 * thread (a collective waits for every rank's thread).
 */
public class"
%typemap(javaclassmodifiers) struct flatmem_swig_cyclic "/**
 * The cyclic data-parallel runtime (cyclic.h) of this rank over a
 * Communicator (collective create; one per communicator at a time). Loop:
 * a = next(); stop at CYCLIC_DONE; when a.getUpdate_stage() >= 0 apply the
 * average now in the Tensor reduced for (update_stage, update_step); run the
 * FORWARD / BACKWARD of a.getStage(); after a BACKWARD, reduce(stage, gradient)
 * (two gradient Tensors per stage, alternating on the step's parity). One
 * thread drives it; waits are bounded by the timeout; failures throw
 * FlatmemException naming the stage, step and peer.
 */
public class"
%typemap(javainterfaces) struct flatmem_comm_unique_id "AutoCloseable"
%typemap(javacode) struct flatmem_comm_unique_id %{
  @Override public void close() { delete(); }

  /** Rank 0's id, listening on $FLATMEM_COMM_ADDRESS or any free port of this machine's first address. */
  public UniqueId() { this((String) null); }
%}

%typemap(javainterfaces) struct flatmem_swig_comm "AutoCloseable"
%typemap(javacode) struct flatmem_swig_comm %{
  /** Requests posted and not yet waited for: they keep their buffers reachable. */
  private final java.util.Set<CommRequest> pending =
      java.util.Collections.newSetFromMap(new java.util.IdentityHashMap<CommRequest, Boolean>());

  /** Rank `rank` of `world_size` joining with rank 0's id (collective), the
   *  default timeouts (FLATMEM_COMM_TIMEOUT_MS or 60 s per wait, 120 s to join). */
  public Communicator(int rank, int world_size, UniqueId id) { this(rank, world_size, id, 0, 0); }

  /** ... with every wait bounded by timeout_ms (milliseconds; 0 = default). */
  public Communicator(int rank, int world_size, UniqueId id, long timeout_ms) {
    this(rank, world_size, id, timeout_ms, 0);
  }

  /** From FLATMEM_COORDINATOR=host:port and FLATMEM_RANK / FLATMEM_WORLD_SIZE
   *  (or a launcher's variables, see comm.h); default timeouts. */
  public static Communicator from_env() { return from_env(0, 0); }

  /** ... with every wait bounded by timeout_ms (milliseconds; 0 = default). */
  public static Communicator from_env(long timeout_ms) { return from_env(timeout_ms, 0); }

  /** Sends buffer (a compact CPU Tensor; its bytes are the message) to peer
   *  with this tag. Returns at once; the buffer must stay unchanged until the
   *  request's waitFor returns (it is kept reachable until then). */
  public CommRequest isend(Tensor buffer, int peer, long tag) { return posted(isend_raw(buffer, peer, tag), buffer); }
  public CommRequest isend(Tensor buffer, int peer) { return isend(buffer, peer, 0); }

  /** Receives from peer with this tag into buffer (exactly the sent size;
   *  else waitFor throws FlatmemArgumentException naming both sizes). */
  public CommRequest irecv(Tensor buffer, int peer, long tag) { return posted(irecv_raw(buffer, peer, tag), buffer); }
  public CommRequest irecv(Tensor buffer, int peer) { return irecv(buffer, peer, 0); }

  private synchronized CommRequest posted(CommRequest request, Tensor buffer) {
    request.owner = this;
    request.buffer = buffer;
    pending.add(request);
    return request;
  }

  synchronized void finished(CommRequest request) { pending.remove(request); }

  /** recv = the sum over ranks of send (fp32, fp64, int32, int64; the same
   *  bits on every rank); recv may be send. At most the default timeout per step. */
  public void all_reduce(Tensor send, Tensor recv) { all_reduce(send, recv, 0); }

  /** The sum over ranks of values (the same bits on every rank), a new array. */
  public float[] all_reduce(float[] values) {
    try (Tensor t = Tensor.of(values)) {
      all_reduce(t, t, 0);
      return t.toFloatArray();
    }
  }

  /** The sum over ranks of values (the same bits on every rank), a new array. */
  public double[] all_reduce(double[] values) {
    try (Tensor t = Tensor.of(values)) {
      all_reduce(t, t, 0);
      return t.toDoubleArray();
    }
  }

  /** send to rank + 1, recv from rank - 1 (same byte size). */
  public void ring_shift(Tensor send, Tensor recv) { ring_shift(send, recv, 0); }

  /** Every rank reaches the barrier before any leaves (default timeout). */
  public void barrier() { barrier(0); }

  /** flatmem_comm_destroy (orderly: the peers see this rank leave, not fail).
   *  Throws FlatmemArgumentException while a Contrastive or Cyclic made with
   *  it is open (close those first). Outstanding requests are cancelled. A
   *  no-op when already closed. */
  @Override public synchronized void close() {
    close_raw();
    pending.clear();
  }

  /** flatmem_comm_abort: the peers fail with PEER_FAILURE naming this rank.
   *  Refused like close() while a Contrastive or Cyclic uses it. */
  public synchronized void abort() {
    abort_raw();
    pending.clear();
  }
%}

%typemap(javainterfaces) struct flatmem_swig_request "AutoCloseable"
%typemap(javacode) struct flatmem_swig_request %{
  Communicator owner;
  Tensor buffer;

  /** Waits until the message arrived or left, at most the communicator's
   *  default timeout; throws FlatmemException (TIMEOUT, PEER_FAILURE,
   *  COMM_POISONED) or FlatmemArgumentException (size mismatch, waited twice,
   *  communicator closed). The request is finished either way. */
  public void waitFor() { waitFor(0); }

  /** ... at most timeout_ms milliseconds (0 = the communicator's default). */
  public void waitFor(long timeout_ms) {
    try {
      waitFor_raw(timeout_ms);
    } finally {
      if (owner != null) owner.finished(this);
      buffer = null;
    }
  }

  @Override public void close() { delete(); }
%}

%typemap(javainterfaces) struct flatmem_swig_comm_group "AutoCloseable"
%typemap(javacode) struct flatmem_swig_comm_group %{
  /** world_size ranks in this process with the default timeout. */
  public CommLocalGroup(int world_size) { this(world_size, 0); }

  /** Destroys the communicators not taken. */
  @Override public void close() { delete(); }
%}

%typemap(javainterfaces) struct flatmem_swig_cyclic "AutoCloseable"
%typemap(javacode) struct flatmem_swig_cyclic %{
  /** The gradients handed over and not yet returned as an update, by (stage, step). */
  private final java.util.Map<String, Tensor> inFlight = new java.util.HashMap<String, Tensor>();
  private CyclicAction current;

  /** The runtime (collective) of `stages` stages and `steps` training steps
   *  under CYCLIC_DELAY1, waits bounded by the communicator's timeout. */
  public Cyclic(Communicator comm, int stages, long steps) {
    this(comm, stages, steps, CyclicRule.CYCLIC_DELAY1);
  }

  /** ... under `rule`. */
  public Cyclic(Communicator comm, int stages, long steps, CyclicRule rule) {
    this(comm, stages, steps, rule, 0);
  }

  /** ... every wait bounded by timeout_ms (milliseconds; 0 = the communicator's). */
  public Cyclic(Communicator comm, int stages, long steps, CyclicRule rule, long timeout_ms) {
    this(comm, stages, steps, rule, timeout_ms, CyclicMemory.CYCLIC_MEMORY_HOST);
  }

  /** ... with gradients in `memory`: CYCLIC_MEMORY_HOST (CPU Tensors, the
   *  default) or CYCLIC_MEMORY_CUDA (kDLCUDA Tensors on the communicator's
   *  device, over NCCL: every rank calls comm.init_device first; a flatmem
   *  built without NCCL throws STATUS_UNSUPPORTED). */
  public Cyclic(Communicator comm, int stages, long steps, CyclicRule rule, long timeout_ms, CyclicMemory memory) {
    this(comm, stages, steps, rule == null ? -1 : rule.swigValue(), null, timeout_ms,
         NonfinitePolicy.NONFINITE_ERROR.swigValue(), 0, 0 /* CYCLIC_PARAMETERS_REPLICATED */, null,
         memory == null ? -1 : memory.swigValue());
  }

  /** Advances to the next time step (may wait: start token, the update's
   *  average). When getUpdate_stage() >= 0 the Tensor reduced for
   *  (update_stage, update_step) now holds the average over ranks. */
  public CyclicAction next() {
    CyclicAction a = next_raw();
    if (a.getUpdate_stage() >= 0) inFlight.remove(a.getUpdate_stage() + "/" + a.getUpdate_step());
    current = a;
    return a;
  }

  /** Hands over the gradient of `stage` computed in this BACKWARD (compact
   *  CPU float32/float64, the same size on every rank). It belongs to the
   *  runtime (kept reachable; do not touch it) until next() returns its update. */
  public void reduce(int stage, Tensor gradient) {
    reduce_raw(stage, gradient);
    held(stage, gradient);
  }

  /** reduce for a gradient computed on `stream` (flatmem_cyclic_reduce_stream):
   *  with CYCLIC_MEMORY_CUDA the runtime reads the kDLCUDA Tensor after the
   *  work enqueued on that cudaStream_t (its address; 0 = the legacy default
   *  stream) so far, without a host wait; ignored for CPU gradients. A Tensor
   *  of the other kind than the handle's memory throws
   *  FlatmemArgumentException naming options.memory. */
  public void reduce(int stage, Tensor gradient, long stream) {
    reduce_stream_raw(stage, gradient, stream);
    held(stage, gradient);
  }

  private void held(int stage, Tensor gradient) {
    inFlight.put(stage + "/" + (current == null ? -1 : current.getStep()), gradient);
  }

  /** The statistics of every time step still kept (flatmem_cyclic_stats). */
  public CyclicTimeStepStats[] stats() {
    long n = load_stats(0, 1L << 24);
    CyclicTimeStepStats[] out = new CyclicTimeStepStats[(int) n];
    for (int i = 0; i < n; ++i) out[i] = stat(i);
    return out;
  }

  /** The shards registered by set_shard, by stage (the library reads them in next()). */
  private final java.util.Map<Integer, Tensor> shards = new java.util.HashMap<Integer, Tensor>();

  /** RELAYED: registers this rank's shard of `stage` (kept reachable until
   *  registered again or closed: the runtime reads it inside next()). */
  public void set_shard(int stage, Tensor shard) {
    set_shard_raw(stage, shard);
    shards.put(stage, shard);
  }

  /** set_shard with the cudaStream_t (its address; 0 = the legacy default
   *  stream) a kDLCUDA shard is updated on under CYCLIC_MEMORY_CUDA: the
   *  runtime's copies of it are enqueued there inside next() (flatmem_cyclic_set_shard_stream;
   *  ignored for CPU shards). Kept reachable as set_shard's. A shard of the
   *  other kind than the handle's memory throws FlatmemArgumentException
   *  naming options.memory. parameters(full, stream) is the device twin of
   *  parameters(full) (flatmem_cyclic_parameters_stream). */
  public void set_shard(int stage, Tensor shard, long stream) {
    set_shard_stream_raw(stage, shard, stream);
    shards.put(stage, shard);
  }

  /** flatmem_cyclic_destroy now (poisons the communicator when reductions are
   *  in flight) and releases the communicator. No-op when closed. */
  @Override public void close() {
    close_raw();
    inFlight.clear();
    shards.clear();
  }
%}
#endif

/* ------------------------------------------------------------------------ */
/* UniqueId                                                                  */
/* ------------------------------------------------------------------------ */
%rename(UniqueId) flatmem_comm_unique_id;
%newobject flatmem_comm_unique_id::from_hex;
%newobject flatmem_comm_unique_id::hex;
struct flatmem_comm_unique_id {};
%extend flatmem_comm_unique_id {
  /* Rank 0: flatmem_comm_unique_id_create(address): opens the bootstrap
   * listener ("host:port", ":0", "" = $FLATMEM_COMM_ADDRESS or any free port
   * on this machine's first address). */
  flatmem_comm_unique_id(const char *address = NULL) {
    flatmem_comm_unique_id *id = (flatmem_comm_unique_id *)calloc(1, sizeof *id);
    if (!id) {
      flatmem_swig_fail(FLATMEM_STATUS_OUT_OF_MEMORY, "UniqueId: out of memory");
      return NULL;
    }
    if (!flatmem_swig_check(flatmem_comm_unique_id_create(address, id))) {
      free(id);
      return NULL;
    }
    return id;
  }
  ~flatmem_comm_unique_id() { free($self); }

  /* The 128 bytes as 256 lower-case hex digits. */
  char *hex() const {
    static const char digits[] = "0123456789abcdef";
    char *text = (char *)malloc(2 * FLATMEM_COMM_UNIQUE_ID_BYTES + 1);
    int i;
    if (!text) {
      flatmem_swig_fail(FLATMEM_STATUS_OUT_OF_MEMORY, "UniqueId.hex: out of memory");
      return NULL;
    }
    for (i = 0; i < FLATMEM_COMM_UNIQUE_ID_BYTES; ++i) {
      text[2 * i] = digits[$self->internal[i] >> 4];
      text[2 * i + 1] = digits[$self->internal[i] & 15];
    }
    text[2 * FLATMEM_COMM_UNIQUE_ID_BYTES] = '\0';
    return text;
  }

  /* The id hex() printed (256 hex digits, either case). */
  static flatmem_comm_unique_id *from_hex(const char *text) {
    flatmem_comm_unique_id *id;
    int i;
    if (!text || strlen(text) != 2 * FLATMEM_COMM_UNIQUE_ID_BYTES) {
      flatmem_swig_fail(FLATMEM_STATUS_INVALID_ARGUMENT,
                        "UniqueId.from_hex: text: %d characters; expected %d hex digits",
                        text ? (int)strlen(text) : -1, 2 * FLATMEM_COMM_UNIQUE_ID_BYTES);
      return NULL;
    }
    id = (flatmem_comm_unique_id *)calloc(1, sizeof *id);
    if (!id) {
      flatmem_swig_fail(FLATMEM_STATUS_OUT_OF_MEMORY, "UniqueId: out of memory");
      return NULL;
    }
    for (i = 0; i < 2 * FLATMEM_COMM_UNIQUE_ID_BYTES; ++i) {
      const char ch = text[i];
      const int v = ch >= '0' && ch <= '9' ? ch - '0'
                    : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10
                    : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10 : -1;
      if (v < 0) {
        free(id);
        flatmem_swig_fail(FLATMEM_STATUS_INVALID_ARGUMENT,
                          "UniqueId.from_hex: text: character %d ('%c') is not a hex digit", i, ch);
        return NULL;
      }
      id->internal[i / 2] = (unsigned char)(id->internal[i / 2] << 4 | v);
    }
    return id;
  }
}

/* ------------------------------------------------------------------------ */
/* Communicator, CommRequest, CommLocalGroup                                 */
/* ------------------------------------------------------------------------ */
%rename(Communicator) flatmem_swig_comm;
%rename(CommRequest) flatmem_swig_request;
%rename(CommLocalGroup) flatmem_swig_comm_group;
%newobject flatmem_swig_comm::from_env;
%newobject flatmem_swig_comm::isend;
%newobject flatmem_swig_comm::irecv;
%newobject flatmem_swig_comm_group::take;

struct flatmem_swig_comm {};
%extend flatmem_swig_comm {
  /* flatmem_comm_create (collective): this rank of world_size, with rank 0's id. */
  flatmem_swig_comm(int32_t rank, int32_t world_size, const flatmem_comm_unique_id *id,
                    int64_t timeout_ms = 0, int64_t connect_timeout_ms = 0) {
    const flatmem_comm_options o = flatmem_swig_comm_options(timeout_ms, connect_timeout_ms);
    flatmem_comm_t *h = NULL;
    if (!id) {
      flatmem_swig_fail(FLATMEM_STATUS_INVALID_ARGUMENT, "Communicator: id is NULL");
      return NULL;
    }
    if (!flatmem_swig_check(flatmem_comm_create(&h, rank, world_size, id, &o))) return NULL;
    return flatmem_swig_comm_new(h);
  }
  /* flatmem_comm_create_from_env: FLATMEM_COORDINATOR and FLATMEM_RANK /
   * _WORLD_SIZE or a launcher's variables (mpirun, srun, torchrun). */
  static flatmem_swig_comm *from_env(int64_t timeout_ms = 0, int64_t connect_timeout_ms = 0) {
    const flatmem_comm_options o = flatmem_swig_comm_options(timeout_ms, connect_timeout_ms);
    flatmem_comm_t *h = NULL;
    if (!flatmem_swig_check(flatmem_comm_create_from_env(&h, &o))) return NULL;
    return flatmem_swig_comm_new(h);
  }
  ~flatmem_swig_comm() { flatmem_swig_comm_unref($self); }

  int32_t rank() const { return $self->rank; }
  int32_t world_size() const { return $self->world_size; }
  bool is_open() const { return $self->handle != NULL; }
  /* Live Contrastive / Cyclic handles created on it. */
  int32_t users() const { return __atomic_load_n(&$self->users, __ATOMIC_ACQUIRE); }

  /* flatmem_comm_health: raises the status that poisoned the handle. */
  void check_health() {
    flatmem_comm_t *h = flatmem_swig_comm_open($self, "Communicator.check_health");
    if (h) flatmem_swig_check(flatmem_comm_health(h));
  }

  /* Non-blocking messages: buffer (kDLCPU, compact) must stay alive and, for
   * a send, unchanged until the request's wait() returns. */
  flatmem_swig_request *isend(const flatmem_swig_tensor *buffer, int32_t peer, uint32_t tag = 0) {
    return flatmem_swig_post($self, buffer, peer, tag, 0);
  }
  flatmem_swig_request *irecv(flatmem_swig_tensor *buffer, int32_t peer, uint32_t tag = 0) {
    return flatmem_swig_post($self, buffer, peer, tag, 1);
  }

  /* recv = sum over ranks of send (bitwise the same on every rank); recv may be send. */
  void all_reduce(const flatmem_swig_tensor *send, flatmem_swig_tensor *recv, int64_t timeout_ms = 0) {
    flatmem_comm_t *h = flatmem_swig_comm_open($self, "Communicator.all_reduce");
    if (h) flatmem_swig_check(flatmem_comm_all_reduce(h, flatmem_swig_dl(send), flatmem_swig_dl_out(recv), timeout_ms, NULL));
  }
  /* send to rank + 1, recv from rank - 1 (mod world_size). */
  void ring_shift(const flatmem_swig_tensor *send, flatmem_swig_tensor *recv, int64_t timeout_ms = 0) {
    flatmem_comm_t *h = flatmem_swig_comm_open($self, "Communicator.ring_shift");
    if (h) flatmem_swig_check(flatmem_comm_ring_shift(h, flatmem_swig_dl(send), flatmem_swig_dl_out(recv), timeout_ms, NULL));
  }
  void barrier(int64_t timeout_ms = 0) {
    flatmem_comm_t *h = flatmem_swig_comm_open($self, "Communicator.barrier");
    if (h) flatmem_swig_check(flatmem_comm_barrier(h, timeout_ms));
  }
  /* flatmem_comm_init_device (collective): the NCCL device transport on CUDA
   * device cuda_device, which Cyclic's memory = CYCLIC_MEMORY_CUDA needs.
   * UNSUPPORTED without NCCL or a usable CUDA driver (the handle stays healthy). */
  void init_device(int32_t cuda_device, int64_t timeout_ms) {
    flatmem_comm_t *h = flatmem_swig_comm_open($self, "Communicator.init_device");
    if (h) flatmem_swig_check(flatmem_comm_init_device(h, cuda_device, timeout_ms));
  }

  /* flatmem_comm_destroy (orderly); refused while a Contrastive/Cyclic uses it.
   * A no-op when already closed. */
  void close() {
    flatmem_comm_t *h = $self->handle;
    if (!h || !flatmem_swig_comm_releasable($self, "Communicator.close")) return;
    $self->handle = NULL;
    flatmem_swig_check(flatmem_comm_destroy(h));
  }
  /* flatmem_comm_abort: the peers fail naming this rank. Refused while a
   * Contrastive/Cyclic uses it. A no-op when already closed. */
  void abort() {
    flatmem_comm_t *h = $self->handle;
    if (!h || !flatmem_swig_comm_releasable($self, "Communicator.abort")) return;
    $self->handle = NULL;
    flatmem_swig_check(flatmem_comm_abort(h));
  }
}

struct flatmem_swig_request {};
%extend flatmem_swig_request {
  ~flatmem_swig_request() {
    /* an unwaited request stays the library's until its communicator is
     * closed (which cancels it) */
    flatmem_swig_comm_unref($self->comm);
    free($self);
  }
  int32_t peer() const { return $self->peer; }
  bool is_receive() const { return $self->receive != 0; }
  /* Whether wait() has returned. */
  bool is_done() const { return $self->request == NULL; }
  /* flatmem_comm_wait: at most timeout_ms (0 = the communicator's default). */
  void wait(int64_t timeout_ms = 0) {
    flatmem_comm_request_t *r = $self->request;
    flatmem_comm_t *h = flatmem_swig_comm_open($self->comm, "CommRequest.wait");
    if (!h) return;
    if (!r) {
      flatmem_swig_fail(FLATMEM_STATUS_INVALID_ARGUMENT, "CommRequest.wait: the request was already waited for");
      return;
    }
    $self->request = NULL;
    flatmem_swig_check(flatmem_comm_wait(h, r, timeout_ms));
  }
  /* flatmem_comm_test: true when complete (finish it with wait()). */
  bool test() {
    int32_t done = 0;
    flatmem_comm_t *h = flatmem_swig_comm_open($self->comm, "CommRequest.test");
    if (!h) return false;
    if (!$self->request) return true;
    flatmem_swig_check(flatmem_comm_test(h, $self->request, &done));
    return done != 0;
  }
}

struct flatmem_swig_comm_group {};
%extend flatmem_swig_comm_group {
  /* flatmem_comm_create_local: world_size ranks inside this process; each
   * is then used by its own thread. */
  flatmem_swig_comm_group(int32_t world_size, int64_t timeout_ms = 0) {
    const flatmem_comm_options o = flatmem_swig_comm_options(timeout_ms, 0);
    flatmem_swig_comm_group *g;
    if (world_size < 1 || world_size > 4096) {
      flatmem_swig_fail(FLATMEM_STATUS_INVALID_ARGUMENT, "CommLocalGroup: world_size %d; expected 1 to 4096",
                        (int)world_size);
      return NULL;
    }
    g = (flatmem_swig_comm_group *)calloc(1, sizeof *g);
    if (g) g->comms = (flatmem_comm_t **)calloc((size_t)world_size, sizeof *g->comms);
    if (!g || !g->comms) {
      if (g) free(g->comms);
      free(g);
      flatmem_swig_fail(FLATMEM_STATUS_OUT_OF_MEMORY, "CommLocalGroup: out of memory");
      return NULL;
    }
    if (!flatmem_swig_check(flatmem_comm_create_local(g->comms, world_size, &o))) {
      free(g->comms);
      free(g);
      return NULL;
    }
    g->world_size = world_size;
    return g;
  }
  ~flatmem_swig_comm_group() {
    int32_t r;
    for (r = 0; r < $self->world_size; ++r) flatmem_comm_destroy($self->comms[r]);
    free($self->comms);
    free($self);
  }
  int32_t world_size() const { return $self->world_size; }
  /* Rank r's Communicator (each rank once). */
  flatmem_swig_comm *take(int32_t rank) {
    flatmem_comm_t *h;
    if (rank < 0 || rank >= $self->world_size || !$self->comms[rank]) {
      flatmem_swig_fail(FLATMEM_STATUS_INVALID_ARGUMENT,
                        "CommLocalGroup.take: rank %d is out of range [0, %d) or already taken",
                        (int)rank, (int)$self->world_size);
      return NULL;
    }
    h = $self->comms[rank];
    $self->comms[rank] = NULL;
    return flatmem_swig_comm_new(h);
  }
}

/* ------------------------------------------------------------------------ */
/* Cyclic: the runtime (flatmem_cyclic_t)                                    */
/* ------------------------------------------------------------------------ */
%rename(Cyclic) flatmem_swig_cyclic;

struct flatmem_swig_cyclic {};
%extend flatmem_swig_cyclic {
  /* flatmem_cyclic_create (collective). activation_bytes: NULL or a (stages,)
   * int64 Tensor (accounting only, copied). rule: a CyclicRule; nonfinite: a
   * NonfinitePolicy; timeout_ms 0 = the communicator's; history 0 = 65536;
   * parameters: CYCLIC_PARAMETERS_*; memory: a CyclicMemory (HOST: kDLCPU
   * gradients; CUDA: kDLCUDA ones over NCCL, after Communicator.init_device). */
  flatmem_swig_cyclic(flatmem_swig_comm *comm, int32_t stages, int64_t steps,
                      int32_t rule = FLATMEM_CYCLIC_DELAY1,
                      const flatmem_swig_tensor *activation_bytes = NULL, int64_t timeout_ms = 0,
                      int32_t nonfinite = FLATMEM_NONFINITE_ERROR, int64_t history = 0,
                      int32_t parameters = FLATMEM_CYCLIC_PARAMETERS_REPLICATED,
                      const flatmem_swig_tensor *parameter_count = NULL,
                      int32_t memory = FLATMEM_CYCLIC_MEMORY_HOST) {
    flatmem_cyclic_options o = FLATMEM_CYCLIC_OPTIONS_INIT;
    flatmem_comm_t *h = flatmem_swig_comm_open(comm, "Cyclic");
    flatmem_swig_cyclic *s;
    if (!h) return NULL;
    if (!flatmem_swig_int64_entries(activation_bytes, stages, "Cyclic", "activation_bytes",
                                    "one entry per stage", &o.activation_bytes) ||
        !flatmem_swig_int64_entries(parameter_count, stages, "Cyclic", "parameter_count",
                                    "the elements of each stage", &o.parameter_count))
      return NULL;
    o.parameters = (flatmem_cyclic_parameter_mode)parameters;
    o.stages = stages;
    o.steps = steps;
    o.rule = (flatmem_cyclic_rule)rule;
    o.timeout_ms = timeout_ms;
    o.nonfinite = (flatmem_nonfinite_policy)nonfinite;
    o.history = history;
    o.memory = (flatmem_cyclic_memory)memory;
    s = (flatmem_swig_cyclic *)calloc(1, sizeof *s);
    if (!s) {
      flatmem_swig_fail(FLATMEM_STATUS_OUT_OF_MEMORY, "Cyclic: out of memory");
      return NULL;
    }
    if (!flatmem_swig_check(flatmem_cyclic_create(&s->handle, h, &o))) {
      free(s);
      return NULL;
    }
    flatmem_swig_comm_use(comm);
    s->comm = comm;
    return s;
  }
  ~flatmem_swig_cyclic() {
    flatmem_swig_cyclic_release($self);
    free($self->stats);
    free($self->relay_stats);
    free($self);
  }
  /* flatmem_cyclic_destroy now (see cyclic.h: poisons the communicator when
   * reductions are in flight); releases the communicator. No-op when closed. */
  void close() { flatmem_swig_cyclic_release($self); }
  bool is_open() const { return $self->handle != NULL; }

  flatmem_cyclic_schedule schedule() {
    flatmem_cyclic_schedule s = FLATMEM_CYCLIC_SCHEDULE_INIT;
    flatmem_cyclic_t *h = flatmem_swig_cyclic_open($self, "Cyclic.schedule");
    if (h) flatmem_swig_check(flatmem_cyclic_get_schedule(h, &s, sizeof s));
    return s;
  }
  /* flatmem_cyclic_next: may wait (start token, the update's average). */
  flatmem_cyclic_action next() {
    flatmem_cyclic_action a;
    flatmem_cyclic_t *h = flatmem_swig_cyclic_open($self, "Cyclic.next");
    memset(&a, 0, sizeof a);
    if (h) flatmem_swig_check(flatmem_cyclic_next(h, &a, sizeof a));
    return a;
  }
  /* flatmem_cyclic_reduce: the buffer belongs to the handle until next()
   * returns its update (keep it alive and untouched meanwhile). */
  void reduce(int32_t stage, flatmem_swig_tensor *gradient) {
    flatmem_cyclic_t *h = flatmem_swig_cyclic_open($self, "Cyclic.reduce");
    if (h) flatmem_swig_check(flatmem_cyclic_reduce(h, stage, flatmem_swig_dl_out(gradient)));
  }
  /* flatmem_cyclic_reduce_stream: as reduce; a kDLCUDA gradient is read after
   * the work enqueued so far on `stream` (a cudaStream_t as an integer, 0 =
   * the legacy default stream; ignored for kDLCPU gradients). */
  void reduce_stream(int32_t stage, flatmem_swig_tensor *gradient, int64_t stream) {
    flatmem_cyclic_t *h = flatmem_swig_cyclic_open($self, "Cyclic.reduce_stream");
    if (h) flatmem_swig_check(flatmem_cyclic_reduce_stream(h, stage, flatmem_swig_dl_out(gradient),
                                                           (void *)(intptr_t)stream));
  }
  /* flatmem_cyclic_stats into the handle: returns how many were copied; read
   * them with stat(0 .. n-1). */
  int64_t load_stats(int64_t first, int64_t count) {
    int64_t written = 0;
    flatmem_cyclic_time_step_stats *buffer;
    flatmem_cyclic_t *h = flatmem_swig_cyclic_open($self, "Cyclic.load_stats");
    if (!h) return 0;
    buffer = (flatmem_cyclic_time_step_stats *)flatmem_swig_results(count, sizeof *buffer, "Cyclic.load_stats");
    if (!buffer) return 0;
    if (!flatmem_swig_check(flatmem_cyclic_stats(h, first, count, buffer, sizeof *buffer, &written))) {
      free(buffer);
      return 0;
    }
    free($self->stats);
    $self->stats = buffer;
    $self->stats_count = written;
    return written;
  }
  flatmem_cyclic_time_step_stats stat(int64_t index) const {
    flatmem_cyclic_time_step_stats s;
    memset(&s, 0, sizeof s);
    if (index < 0 || index >= $self->stats_count)
      flatmem_swig_fail(FLATMEM_STATUS_INVALID_ARGUMENT, "Cyclic.stat: index %lld out of range [0, %lld)",
                        (long long)index, (long long)$self->stats_count);
    else
      s = $self->stats[index];
    return s;
  }
  flatmem_cyclic_summary summary() {
    flatmem_cyclic_summary s;
    flatmem_cyclic_t *h = flatmem_swig_cyclic_open($self, "Cyclic.summary");
    memset(&s, 0, sizeof s);
    if (h) flatmem_swig_check(flatmem_cyclic_summary_get(h, &s, sizeof s));
    return s;
  }

  /* ZeRO relay (options.parameters = CYCLIC_PARAMETERS_RELAYED), cyclic.h. */
  /* flatmem_cyclic_set_shard: the library reads the shard's memory inside
   * later next() calls: the caller keeps it alive (the Python / Java layers
   * hold a reference until it is registered again or the handle is closed). */
  void set_shard(int32_t stage, flatmem_swig_tensor *shard) {
    flatmem_cyclic_t *h = flatmem_swig_cyclic_open($self, "Cyclic.set_shard");
    if (h) flatmem_swig_check(flatmem_cyclic_set_shard(h, stage, flatmem_swig_dl_out(shard)));
  }
  /* flatmem_cyclic_set_shard_stream: as set_shard, with the stream a kDLCUDA
   * shard is updated on (a cudaStream_t as an integer, 0 = the legacy default
   * stream): the handle's copies of the shard are enqueued on it inside
   * next(). Ignored for kDLCPU shards. */
  void set_shard_stream(int32_t stage, flatmem_swig_tensor *shard, int64_t stream) {
    flatmem_cyclic_t *h = flatmem_swig_cyclic_open($self, "Cyclic.set_shard_stream");
    if (h)
      flatmem_swig_check(
          flatmem_cyclic_set_shard_stream(h, stage, flatmem_swig_dl_out(shard), (void *)(intptr_t)stream));
  }
  /* flatmem_cyclic_shard_range: the first element of `rank`'s shard of `stage`, and one past its last. */
  int64_t shard_begin(int32_t stage, int32_t rank) {
    int64_t begin = 0, end = 0;
    flatmem_cyclic_t *h = flatmem_swig_cyclic_open($self, "Cyclic.shard_range");
    if (h) flatmem_swig_check(flatmem_cyclic_shard_range(h, stage, rank, &begin, &end));
    return begin;
  }
  int64_t shard_end(int32_t stage, int32_t rank) {
    int64_t begin = 0, end = 0;
    flatmem_cyclic_t *h = flatmem_swig_cyclic_open($self, "Cyclic.shard_range");
    if (h) flatmem_swig_check(flatmem_cyclic_shard_range(h, stage, rank, &begin, &end));
    return end;
  }
  /* flatmem_cyclic_parameters: waits for the relay, copies the full stage into `full`. */
  void parameters(flatmem_swig_tensor *full) {
    flatmem_cyclic_t *h = flatmem_swig_cyclic_open($self, "Cyclic.parameters");
    if (h) flatmem_swig_check(flatmem_cyclic_parameters(h, flatmem_swig_dl_out(full)));
  }
  /* flatmem_cyclic_parameters_stream: as parameters (the host wait for the
   * relay included); a kDLCUDA `full` is written by a copy enqueued on
   * `stream` (0 = the legacy default stream; ignored for kDLCPU). */
  void parameters_stream(flatmem_swig_tensor *full, int64_t stream) {
    flatmem_cyclic_t *h = flatmem_swig_cyclic_open($self, "Cyclic.parameters_stream");
    if (h)
      flatmem_swig_check(flatmem_cyclic_parameters_stream(h, flatmem_swig_dl_out(full), (void *)(intptr_t)stream));
  }
  /* flatmem_cyclic_relay_stats into the handle (read with relay_stat(i)). */
  int64_t load_relay_stats(int64_t first, int64_t count) {
    int64_t written = 0;
    flatmem_cyclic_relay_time_step *buffer;
    flatmem_cyclic_t *h = flatmem_swig_cyclic_open($self, "Cyclic.load_relay_stats");
    if (!h) return 0;
    buffer = (flatmem_cyclic_relay_time_step *)flatmem_swig_results(count, sizeof *buffer, "Cyclic.load_relay_stats");
    if (!buffer) return 0;
    if (!flatmem_swig_check(flatmem_cyclic_relay_stats(h, first, count, buffer, sizeof *buffer, &written))) {
      free(buffer);
      return 0;
    }
    free($self->relay_stats);
    $self->relay_stats = buffer;
    $self->relay_stats_count = written;
    return written;
  }
  flatmem_cyclic_relay_time_step relay_stat(int64_t index) const {
    flatmem_cyclic_relay_time_step s;
    memset(&s, 0, sizeof s);
    if (index < 0 || index >= $self->relay_stats_count)
      flatmem_swig_fail(FLATMEM_STATUS_INVALID_ARGUMENT, "Cyclic.relay_stat: index %lld out of range [0, %lld)",
                        (long long)index, (long long)$self->relay_stats_count);
    else
      s = $self->relay_stats[index];
    return s;
  }
  flatmem_cyclic_relay_summary relay_summary() {
    flatmem_cyclic_relay_summary s;
    flatmem_cyclic_t *h = flatmem_swig_cyclic_open($self, "Cyclic.relay_summary");
    memset(&s, 0, sizeof s);
    if (h) flatmem_swig_check(flatmem_cyclic_relay_summary_get(h, &s, sizeof s));
    return s;
  }
}

/* Stage-parallel cyclic training: CyclicStages and its schedule. */
%include "cyclic_stages.i"
