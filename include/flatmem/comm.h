/*
 * flatmem/comm.h -- communicators: UCX bootstrap and host transport, NCCL
 * device transport.
 *
 * Included by <flatmem/flatmem.h> (either header may be included). Plain C99.
 * The conventions at the top of flatmem.h (statuses, last error, DLPack
 * checks, options structs) hold here too.
 *
 * ------------------------------------------------------------------------
 * What a communicator is
 * ------------------------------------------------------------------------
 * A flatmem_comm_t joins world_size processes ("ranks" 0 .. world_size-1).
 * Every rank creates its own handle; creation is collective (it returns when
 * every rank has joined, or fails for all of them).
 *
 *  - Bootstrap over UCX: rank 0 listens (a UCX listener on a TCP address),
 *    the others connect to it, send their UCX worker address, and receive
 *    everyone's; then every pair of ranks is connected directly (UCX picks
 *    shared memory between ranks on one host when UCX_TLS allows it, TCP or
 *    RDMA otherwise).
 *  - Host transport over UCX's tag API: messages between host buffers
 *    (kDLCPU tensors). A progress thread owned by the handle moves data while
 *    the caller computes; it sleeps on UCX's wake-up descriptor when idle.
 *  - Device transport over NCCL (kDLCUDA tensors), when the library was built
 *    with NCCL and flatmem_comm_init_device was called: the NCCL unique id
 *    travels over the UCX bootstrap.
 *
 * Two ways to create one:
 *  1. Explicit (like ncclGetUniqueId): rank 0 calls flatmem_comm_unique_id_create,
 *     passes the 128-byte id to the other ranks by any means (a file, a
 *     broadcast of its own, a command-line argument as hex), and every rank
 *     calls flatmem_comm_create(rank, world_size, id). Rank 0 must call
 *     flatmem_comm_create in the process that made the id.
 *  2. From the environment (flatmem_comm_create_from_env), for launchers:
 *       FLATMEM_COORDINATOR=host:port   rank 0 listens on port (all
 *                                       interfaces), the others connect to
 *                                       host:port. Required.
 *       FLATMEM_RANK, FLATMEM_WORLD_SIZE  this rank, the number of ranks.
 *     When FLATMEM_RANK / FLATMEM_WORLD_SIZE are unset, the launcher's own
 *     variables are read, in this order: OMPI_COMM_WORLD_RANK/_SIZE (Open
 *     MPI's mpirun), PMI_RANK/PMI_SIZE (MPICH, Intel MPI), SLURM_PROCID/
 *     SLURM_NTASKS (srun), RANK/WORLD_SIZE (torchrun). Optional:
 *       FLATMEM_SESSION=<text>   ranks of different sessions that meet on
 *                                one coordinator reject each other.
 *       FLATMEM_COMM_TIMEOUT_MS  default for options.timeout_ms.
 *
 * Addresses: "host:port", "host", ":port" or "[ipv6]:port"; host is a name or
 * a numeric address, port 0 (or none) picks a free port.
 *
 * UCX reads its own environment (UCX_TLS, UCX_NET_DEVICES, ...). The
 * bootstrap listener needs the tcp transport; for one host
 * UCX_TLS=tcp,self,posix (or sm) adds shared memory for the data. Loading
 * libflatmem puts back the crash-signal handlers UCX installs on load (set
 * UCX_ERROR_SIGNALS to keep UCX's) and sets UCX's log level to "fatal"
 * (set UCX_LOG_LEVEL to choose): flatmem reports failures as statuses.
 *
 * ------------------------------------------------------------------------
 * Failure: timeouts, poisoning, abort
 * ------------------------------------------------------------------------
 * Every wait has a deadline: a per-call timeout_ms (> 0), or 0 for the
 * handle's default (options.timeout_ms). Nothing waits forever.
 *  - A wait that passes its deadline returns FLATMEM_STATUS_TIMEOUT; a peer
 *    whose connection resets, that aborts, or a transport error returns
 *    FLATMEM_STATUS_PEER_FAILURE. The message names the operation, the peer
 *    and the step ("all_reduce #12, step 3 of 6: receive from rank 2: timed
 *    out after 5000 ms").
 *  - The handle is then poisoned: outstanding transfers are cancelled (no
 *    buffer of the caller is written after the failing call returns), the
 *    other ranks are told (they fail at once with PEER_FAILURE naming this
 *    rank and its reason instead of waiting for their own deadline), and
 *    every later call returns FLATMEM_STATUS_COMM_POISONED with the first
 *    error's text. Release it with flatmem_comm_abort (or _destroy).
 *  - A rank that dies is seen by the ranks connected to it (UCX's peer
 *    error handling); ranks waiting on a rank that waits on the dead one see
 *    the abort notice or their deadline. Within the timeout, every live rank
 *    returns an error.
 *
 * ------------------------------------------------------------------------
 * Messages
 * ------------------------------------------------------------------------
 * Buffers are DLTensors: kDLCPU (host transport) or kDLCUDA (device
 * transport; after flatmem_comm_init_device; the tensor's device id must be
 * the one given there). Any dtype (bits a multiple of 8, lanes 1), any ndim,
 * compact row-major (strides NULL or compact) -- a message is the tensor's
 * bytes. A receive must have exactly the size of the matching send:
 * a mismatch is FLATMEM_STATUS_INVALID_ARGUMENT naming both sizes (the
 * communicator stays usable). Host messages between a pair of ranks with the
 * same tag are received in the order they were sent.
 *
 * Thread rule: one thread at a time per handle (as for every flatmem handle);
 * the handle's progress thread is internal. Distinct communicators are
 * independent, also within one process (each has its own UCX context).
 */
#ifndef FLATMEM_COMM_H
#define FLATMEM_COMM_H

#include <flatmem/flatmem.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Bytes of a unique id (like NCCL's). */
#define FLATMEM_COMM_UNIQUE_ID_BYTES 128

/** What rank 0 makes and every rank passes to flatmem_comm_create. Plain
 *  bytes: copy it, send it, write it as hex; it holds rank 0's listening
 *  address and a random session number (a stale id from an earlier run is
 *  refused by a coordinator of a later one). */
typedef struct flatmem_comm_unique_id {
  unsigned char internal[FLATMEM_COMM_UNIQUE_ID_BYTES];
} flatmem_comm_unique_id;

/** An outstanding non-blocking send or receive. */
typedef struct flatmem_comm_request_s flatmem_comm_request_t;

typedef struct flatmem_comm_options {
  /** sizeof(flatmem_comm_options) as the caller was compiled. */
  size_t struct_size;
  /** Default deadline of every wait, in milliseconds (0 = the environment's
   *  FLATMEM_COMM_TIMEOUT_MS, else 60000). Calls with timeout_ms = 0 use it. */
  int64_t timeout_ms;
  /** How long flatmem_comm_create waits for all ranks to join, in
   *  milliseconds (0 = 120000). Ranks may start in any order within it:
   *  connections to a coordinator that is not listening yet are retried. */
  int64_t connect_timeout_ms;
} flatmem_comm_options;

#define FLATMEM_COMM_OPTIONS_INIT { sizeof(flatmem_comm_options), 0, 0 }

/** Fill the struct_size bytes at options with the defaults, struct_size =
 *  struct_size (pass sizeof(*options)). Thread-safe. */
FLATMEM_API flatmem_status flatmem_comm_options_init(flatmem_comm_options *options,
                                                     size_t struct_size);

/**
 * Rank 0: open a UCX listener and describe it in *id.
 *
 *   address  where to listen and what the other ranks dial: "host:port",
 *            "host", "[ipv6]:port" or ":port"; NULL or "" = the environment's
 *            FLATMEM_COMM_ADDRESS. With a host, the listener binds to it and
 *            the id names it. Without one, the listener binds to all
 *            interfaces and the id names the first up, non-loopback IPv4
 *            address of this machine (127.0.0.1 if there is none). Port 0 =
 *            any free port.
 *
 * The listener lives until the flatmem_comm_create of rank 0 that uses the
 * id returns (it adopts it), or until the process exits. A port already in
 * use gives FLATMEM_STATUS_INVALID_ARGUMENT naming the address. Thread-safe.
 */
FLATMEM_API flatmem_status flatmem_comm_unique_id_create(const char *address,
                                                         flatmem_comm_unique_id *id);

/**
 * Create this rank's communicator (collective over all world_size ranks).
 *
 *   rank        0 .. world_size - 1, distinct on every rank
 *   world_size  >= 1 and the same on every rank (a rank that disagrees is
 *               refused: INVALID_ARGUMENT on it and on rank 0)
 *   id          from flatmem_comm_unique_id_create on rank 0
 *   options     NULL = defaults
 *
 * Returns when all ranks have joined and every pair of ranks is connected, or
 * fails after options.connect_timeout_ms naming the ranks that never arrived.
 * Allocates; starts the handle's progress thread. *out is set on success only.
 */
FLATMEM_API flatmem_status flatmem_comm_create(flatmem_comm_t **out, int32_t rank,
                                               int32_t world_size,
                                               const flatmem_comm_unique_id *id,
                                               const flatmem_comm_options *options);

/** Create from the environment (FLATMEM_COORDINATOR, FLATMEM_RANK,
 *  FLATMEM_WORLD_SIZE or a launcher's variables; see the top of this header).
 *  A missing or malformed variable is INVALID_ARGUMENT naming it. */
FLATMEM_API flatmem_status flatmem_comm_create_from_env(flatmem_comm_t **out,
                                                        const flatmem_comm_options *options);

/**
 * Create world_size communicators of one group inside this process (like
 * ncclCommInitAll): comms[r] is rank r. Messages are copied between the
 * ranks' buffers in memory; no UCX. For one process driving several devices,
 * and for tests. Each handle is then used by its own thread (a collective
 * blocks until every rank's thread has called it). Same timeouts, poisoning
 * (a poisoned rank poisons the whole group) and abort as the UCX transport.
 * comms must hold world_size pointers (1 .. 4096); they are set on success
 * only. Destroy each handle.
 */
FLATMEM_API flatmem_status flatmem_comm_create_local(flatmem_comm_t **comms, int32_t world_size,
                                                     const flatmem_comm_options *options);

/** Release the handle. Not collective, but orderly: what this rank sent is
 *  flushed to its peers, then each peer is told this rank left (so its
 *  connection closing does not count as a failure there: a receive from a
 *  departed rank can still get what it sent, else it times out naming the
 *  departure). Outstanding requests are cancelled (do not wait on them
 *  afterwards); the progress thread stops. With a device transport, NCCL is
 *  finalised (at most the init_device timeout), else aborted. NULL is a
 *  no-op. */
FLATMEM_API flatmem_status flatmem_comm_destroy(flatmem_comm_t *comm);

/** Tell the peers this rank gives up (they fail with PEER_FAILURE naming it),
 *  abort NCCL at once if a device transport exists, then release the handle.
 *  Use it after an error, or to make the other ranks stop waiting. NULL is a
 *  no-op. */
FLATMEM_API flatmem_status flatmem_comm_abort(flatmem_comm_t *comm);

/** This rank and the number of ranks. Work on poisoned handles too. */
FLATMEM_API flatmem_status flatmem_comm_rank(const flatmem_comm_t *comm, int32_t *rank);
/** The number of ranks (as flatmem_comm_rank, on poisoned handles too). */
FLATMEM_API flatmem_status flatmem_comm_world_size(const flatmem_comm_t *comm,
                                                   int32_t *world_size);

/** SUCCESS while the handle is healthy; otherwise the status that poisoned
 *  it (TIMEOUT, PEER_FAILURE, ...) with its message in flatmem_last_error. */
FLATMEM_API flatmem_status flatmem_comm_health(const flatmem_comm_t *comm);

/**
 * Non-blocking point-to-point messages.
 *
 *   buffer   the message (see "Messages"); must stay valid and, for a send,
 *            unchanged until the request completes
 *   peer     0 .. world_size - 1; may be this rank (copied locally)
 *   tag      any 32-bit value; sends and receives match on (peer, tag)
 *   request  receives the request; complete it with flatmem_comm_wait
 *   stream   kDLCUDA buffers: the cudaStream_t the NCCL transfer is enqueued
 *            on; the request is then complete once enqueued (wait for the
 *            data with flatmem_comm_synchronize; pair sends and receives in
 *            flatmem_comm_group_start / _end as NCCL requires). A buffer that
 *            is not device or managed memory of the communicator's device is
 *            INVALID_ARGUMENT. Ignored for host buffers.
 *
 * Returns at once. Host transfers progress in the background.
 */
FLATMEM_API flatmem_status flatmem_comm_isend(flatmem_comm_t *comm, const DLTensor *buffer,
                                              int32_t peer, uint32_t tag,
                                              flatmem_comm_request_t **request, void *stream);
/** The receiving side of flatmem_comm_isend (same arguments): the message
 *  from `peer` with `tag` is written into `buffer`. */
FLATMEM_API flatmem_status flatmem_comm_irecv(flatmem_comm_t *comm, DLTensor *buffer,
                                              int32_t peer, uint32_t tag,
                                              flatmem_comm_request_t **request, void *stream);

/** Wait for a request to complete, at most timeout_ms (0 = the handle's
 *  default); the request is released whatever the outcome (do not use it
 *  again). A receive whose message had another size fails with
 *  INVALID_ARGUMENT (the handle stays healthy, the buffer's contents are
 *  unspecified). NULL request is INVALID_ARGUMENT. */
FLATMEM_API flatmem_status flatmem_comm_wait(flatmem_comm_t *comm, flatmem_comm_request_t *request,
                                             int64_t timeout_ms);

/** Whether a request has completed (*done = 1) without waiting; the request
 *  stays valid: finish it with flatmem_comm_wait, which then returns at once
 *  with its outcome. */
FLATMEM_API flatmem_status flatmem_comm_test(flatmem_comm_t *comm, flatmem_comm_request_t *request,
                                             int32_t *done);

/**
 * Ring shift (collective): every rank sends `send` to rank + 1 and receives
 * into `recv` from rank - 1 (mod world_size). send and recv have the same
 * byte size and may not overlap. With world_size 1, recv = send (a copy).
 * Blocking, at most timeout_ms. kDLCUDA: one NCCL group on `stream`.
 */
FLATMEM_API flatmem_status flatmem_comm_ring_shift(flatmem_comm_t *comm, const DLTensor *send,
                                                   DLTensor *recv, int64_t timeout_ms,
                                                   void *stream);

/**
 * All-reduce, sum (collective): recv = sum over ranks of send, on every rank.
 * Dtypes: fp32, fp64, int32, int64 (kDLCUDA also bf16 / fp16, summed by
 * NCCL). send and recv have the same shape and dtype; recv may be send
 * (in place) but must not partially overlap it.
 *
 * Host: the sum of each element is formed in a fixed order, so every rank
 * gets bitwise the same result and repeated calls give the same bits. Small
 * messages (world_size <= 64 and world_size * bytes <= 64 KiB) take one
 * direct exchange -- every rank sends its buffer to every other at once, one
 * network latency in all -- and are summed in rank order 0, 1, ...; larger
 * ones a ring reduce-scatter then all-gather over chunks (each rank sends
 * about 2 bytes per byte of the message, whatever world_size). Blocking, at
 * most timeout_ms per step. kDLCUDA: ncclAllReduce on `stream`.
 */
FLATMEM_API flatmem_status flatmem_comm_all_reduce(flatmem_comm_t *comm, const DLTensor *send,
                                                   DLTensor *recv, int64_t timeout_ms,
                                                   void *stream);

/** All ranks reach this call before any returns (collective, host only).
 *  At most timeout_ms. */
FLATMEM_API flatmem_status flatmem_comm_barrier(flatmem_comm_t *comm, int64_t timeout_ms);

/**
 * Device transport (collective): create the NCCL communicator of these ranks
 * on CUDA device cuda_device (this rank's GPU), its unique id broadcast from
 * rank 0 over the host transport, initialised non-blocking and polled until
 * timeout_ms (0 = the handle's default). UNSUPPORTED when the library was
 * built without NCCL. Calling it twice is INVALID_ARGUMENT. Ranks must use
 * distinct GPUs (NCCL cannot host two ranks on one GPU). Needed by every
 * device path of a communicator: kDLCUDA isend / irecv / all_reduce, the
 * cyclic runtime's device gradients and the ring contrastive losses on
 * kDLCUDA tensors (flatmem.h, "Ring across ranks").
 *
 * NCCL (2.19 or newer) is opened at run time: $FLATMEM_NCCL_LIBRARY if set,
 * else libnccl.so.2 from the loader's path, else the NCCL found when flatmem
 * was built; libflatmem itself never needs libnccl or a GPU driver to load.
 * Each rank first checks locally that NCCL loads and cuda_device exists; if
 * that fails on any rank, every rank returns that rank's status
 * (UNSUPPORTED: no NCCL or no usable CUDA driver; INVALID_ARGUMENT: no such
 * device) and the handle stays healthy, so the call may be retried. Later
 * failures (NCCL initialisation errors, timeout_ms passed) abort NCCL and
 * poison the handle (TIMEOUT / PEER_FAILURE).
 */
FLATMEM_API flatmem_status flatmem_comm_init_device(flatmem_comm_t *comm, int32_t cuda_device,
                                                    int64_t timeout_ms);

/** Group device sends and receives that must progress together (as
 *  ncclGroupStart / ncclGroupEnd): between the two, kDLCUDA isend / irecv
 *  are collected and issued by group_end. Host messages are not affected.
 *  Call both from the same thread (NCCL groups are per thread); groups nest;
 *  group_end without group_start is INVALID_ARGUMENT. UNSUPPORTED without
 *  NCCL. */
FLATMEM_API flatmem_status flatmem_comm_group_start(flatmem_comm_t *comm);
/** Issues the device messages collected since flatmem_comm_group_start
 *  (see there). */
FLATMEM_API flatmem_status flatmem_comm_group_end(flatmem_comm_t *comm, int64_t timeout_ms);

/** Wait on the host until `stream` has finished its work, at most timeout_ms,
 *  (INVALID_ARGUMENT inside an open group),
 *  checking the NCCL communicator for asynchronous errors meanwhile; on a
 *  timeout or an NCCL error the NCCL communicator is aborted (so the stream
 *  drains) and the handle poisoned. The way to put a deadline on device
 *  transfers. UNSUPPORTED without NCCL. */
FLATMEM_API flatmem_status flatmem_comm_synchronize(flatmem_comm_t *comm, void *stream,
                                                    int64_t timeout_ms);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FLATMEM_COMM_H */
