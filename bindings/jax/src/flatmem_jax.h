/*
 * flatmem_jax.h -- what libflatmem_jax.so exports: XLA FFI handlers of the
 * tiled contrastive loss and of reversible segments, and small helpers the
 * Python module calls through ctypes. Every function here calls flatmem's C ABI and nothing else.
 *
 * Handlers (register each with jax.ffi.register_ffi_target under the platform
 * its suffix names). Operands in order; [labels] is an optional last operand:
 *
 *   flatmem_jax_clip_forward_{cpu,cuda}
 *       q (b,d), k (b,d), s ()          -> loss (), row_lse (b,), col_lse (b,) [, workspace]
 *   flatmem_jax_clip_backward_{cpu,cuda}
 *       q, k, s, row_lse, col_lse, g () -> dq (b,d), dk (b,d), ds () [, workspace]
 *   flatmem_jax_infonce_forward_{cpu,cuda}
 *       q (b,d), k (c,d), s [, labels]   -> loss (), row_lse (b,) [, workspace]
 *   flatmem_jax_infonce_backward_{cpu,cuda}
 *       q, k, s, row_lse, g [, labels]  -> dq (b,d), dk (c,d), ds () [, workspace]
 *   flatmem_jax_sigmoid_forward_{cpu,cuda}
 *       q (b,d), k (c,d), s (), t () [, labels]      -> loss () [, workspace]
 *   flatmem_jax_sigmoid_value_and_grad_{cpu,cuda}
 *       q, k, s, t [, labels]  -> loss, dq (b,d), dk (c,d), ds (), dt () [, workspace]
 *   flatmem_jax_sigmoid_backward_{cpu,cuda}
 *       q, k, s, t, g () [, labels]  -> dq, dk, ds, dt [, workspace]
 *
 * The sigmoid (SigLIP) ones call flatmem_contrastive_sigmoid_forward (2 b c d
 * FLOPs), _value_and_grad (loss and the gradients of L in one tile walk, 6 b c
 * d) and _backward (the gradients of g L, recomputing the logits, 6 b c d);
 * t is the logit bias, dt its gradient (fp32).
 *
 * Attributes (every one of them): logit_cache_bytes (u64), the logit-cache
 * budget of the pooled handle, flatmem_contrastive_options.logit_cache_bytes
 * (0: none). CPU only: the *_cuda handlers accept it and ignore it (flatmem's
 * CUDA backend recomputes the tiles in any case). fp32_precision (s64), the
 * pooled handle's flatmem_contrastive_options.fp32_precision, a
 * flatmem_fp32_precision value (0 default, 1 TF32, 2 full; any other fails
 * the call with flatmem_contrastive_create's INVALID_ARGUMENT).
 *
 * q and k are f32, bf16 or f16 (both the same); s, loss, lse, g and ds are f32;
 * dq and dk have the dtype of q and k. labels are s64 (b,), or s32 (b, 2)
 * holding each int64 label as its (low, high) 32-bit words, which is what an
 * int64 vector is in memory on a little-endian machine: JAX without x64 has
 * no int64 arrays, and this layout needs no conversion kernel on either
 * platform.
 *
 * Workspace: the CPU handlers take it as their last result, a u8 buffer of
 * flatmem_jax_workspace_size() bytes, so XLA allocates it like any other
 * buffer (XLA:CPU offers FFI handlers no scratch allocator: ScratchAllocator
 * fails there). The CUDA handlers have no workspace result; they ask flatmem
 * for the size at run time and take it from XLA's ScratchAllocator, the
 * device allocator XLA itself uses, stream-ordered on XLA's stream.
 *
 * Handles: flatmem handles are lent from a process-wide pool, one call per
 * handle at a time (flatmem's thread rule; XLA may run two calls at once),
 * kept per (loss, platform, logit_cache_bytes, fp32_precision). They are
 * created with num_threads = $FLATMEM_JAX_NUM_THREADS, read once (unset or
 * 0: all online processors), and live until the process exits, each with
 * its logit cache once filled. A call takes the idle handle whose last
 * forward read its q and k (same data addresses) when there is one, so that
 * a backward finds the tiles its forward cached; flatmem itself checks that
 * they are q's and k's (a fingerprint of the contents) and recomputes
 * otherwise.
 */
#ifndef FLATMEM_JAX_H
#define FLATMEM_JAX_H

#include <stddef.h>
#include <stdint.h>

#include "xla/ffi/api/c_api.h"

#define FLATMEM_JAX_API __attribute__((visibility("default")))

#ifdef __cplusplus
extern "C" {
#endif

/** FLATMEM_VERSION of the flatmem.h these handlers were compiled against. */
FLATMEM_JAX_API int flatmem_jax_header_version(void);
/** flatmem_version() of the libflatmem actually loaded. */
FLATMEM_JAX_API int flatmem_jax_library_version(void);
/** 1 when the *_cuda handlers were compiled in (nvcc was found), else 0. */
FLATMEM_JAX_API int flatmem_jax_has_cuda(void);

/** Bytes of workspace the *_cpu handler of (loss, backward) needs for q of
 *  shape (b, dq) and DLPack dtype (q_code, q_bits), k of shape (c, dk) and
 *  dtype (k_code, k_bits), gradients in the input dtypes. loss is a
 *  flatmem_contrastive_loss value; for FLATMEM_CONTRASTIVE_SIGMOID backward
 *  = 1 sizes the value_and_grad and backward handlers (the same), 0 the
 *  forward. Returns a flatmem_status; on failure
 *  writes "STATUS_NAME: flatmem_last_error()" into message (NUL-terminated,
 *  truncated to message_size). Thread-safe. */
FLATMEM_JAX_API int flatmem_jax_workspace_size(int loss, int backward, int q_code, int q_bits,
                                               int64_t b, int64_t dq, int k_code, int k_bits,
                                               int64_t c, int64_t dk, size_t *bytes,
                                               char *message, size_t message_size);

/** Counters of the contrastive handle pool, for tests: handles created so
 *  far; backward calls with a logit cache (CPU); how many of those got the
 *  handle whose last forward read their q and k. Any pointer may be NULL.
 *  Thread-safe. */
FLATMEM_JAX_API void flatmem_jax_contrastive_pool_stats(int64_t *handles,
                                                        int64_t *cached_backwards,
                                                        int64_t *cached_backwards_on_forward_handle);

FLATMEM_JAX_API XLA_FFI_Error *flatmem_jax_clip_forward_cpu(XLA_FFI_CallFrame *frame);
FLATMEM_JAX_API XLA_FFI_Error *flatmem_jax_clip_backward_cpu(XLA_FFI_CallFrame *frame);
FLATMEM_JAX_API XLA_FFI_Error *flatmem_jax_infonce_forward_cpu(XLA_FFI_CallFrame *frame);
FLATMEM_JAX_API XLA_FFI_Error *flatmem_jax_infonce_backward_cpu(XLA_FFI_CallFrame *frame);
FLATMEM_JAX_API XLA_FFI_Error *flatmem_jax_sigmoid_forward_cpu(XLA_FFI_CallFrame *frame);
FLATMEM_JAX_API XLA_FFI_Error *flatmem_jax_sigmoid_value_and_grad_cpu(XLA_FFI_CallFrame *frame);
FLATMEM_JAX_API XLA_FFI_Error *flatmem_jax_sigmoid_backward_cpu(XLA_FFI_CallFrame *frame);

/* A reversible segment of flatmem's built-in blocks (reversible.h): block k
 * is F = pre-LN attention, G = pre-LN GELU MLP. fp32. Operands:
 *
 *   flatmem_jax_reversible_forward_{cpu,cuda}
 *       x1, x2 (..., width), params...     -> y1, y2 [, workspace]
 *   flatmem_jax_reversible_backward_{cpu,cuda}
 *       y1, y2, dy1, dy2, params...        -> dx1, dx2 [, workspace], grads...
 *
 * params: 12 buffers per block, block 0 first: the attention block's 6
 * parameters, then the MLP block's 6, each in reversible.h's order; grads
 * has their shapes (written, not accumulated: the handler zeroes them --
 * CUDA: cudaMemsetAsync on XLA's stream). The workspace result is the CPU
 * handlers' only, as for the losses; the CUDA handlers take it from XLA's
 * ScratchAllocator at run time.
 * Attributes: mode (s32, flatmem_reversible_mode; STANDARD cannot work across
 * two calls and is refused by the Python side), num_threads (s32, 0 =
 * $FLATMEM_JAX_NUM_THREADS or all processors), seed, offset (u64), heads,
 * hidden (s32), eps (f32), math (s32, flatmem_block_math: 0 FP32, 1 TF32 --
 * CUDA only; the CPU computes FP32 for either). The segment handle and its
 * blocks are cached per (depth, width, heads, hidden, eps, math, mode,
 * threads, device) and lent to one call at a time; a call only points the
 * blocks at its buffers. */
FLATMEM_JAX_API XLA_FFI_Error *flatmem_jax_reversible_forward_cpu(XLA_FFI_CallFrame *frame);
FLATMEM_JAX_API XLA_FFI_Error *flatmem_jax_reversible_backward_cpu(XLA_FFI_CallFrame *frame);

/** Bytes of workspace flatmem_jax_reversible_{forward,backward}_cpu need
 *  for states of this shape and DLPack dtype, with the segment of that
 *  configuration (made and cached here: errors in heads, eps, math, mode or
 *  threads show now). Returns a flatmem_status; on failure writes
 *  "STATUS_NAME: message" into message. Thread-safe. */
FLATMEM_JAX_API int flatmem_jax_reversible_workspace_size(int backward, int depth, int width,
                                                          int heads, int hidden, float eps,
                                                          int math, int mode, int num_threads,
                                                          int ndim, const int64_t *shape,
                                                          int dtype_code, int dtype_bits,
                                                          size_t *bytes, char *message,
                                                          size_t message_size);

/* Ring losses across the ranks of a flatmem communicator (flatmem.h, "Ring
 * across ranks"): one process per rank, each passing ITS rows and columns.
 * Operands and results as the single-process handlers above, without the
 * workspace result (the ring takes none):
 *
 *   flatmem_jax_ring_clip_forward_{cpu,cuda}     q, k, s -> loss, row_lse, col_lse
 *   flatmem_jax_ring_clip_backward_{cpu,cuda}    q, k, s, row_lse, col_lse, g -> dq, dk, ds
 *   flatmem_jax_ring_infonce_forward_{cpu,cuda}  q, k, s [, labels] -> loss, row_lse
 *   flatmem_jax_ring_infonce_backward_{cpu,cuda} q, k, s, row_lse, g [, labels] -> dq, dk, ds
 *   flatmem_jax_ring_sigmoid_forward_{cpu,cuda}  q, k, s, t [, labels] -> loss
 *   flatmem_jax_ring_sigmoid_value_and_grad_{cpu,cuda}
 *                                                q, k, s, t [, labels] -> loss, dq, dk, ds, dt
 *   flatmem_jax_ring_sigmoid_backward_{cpu,cuda} q, k, s, t, g [, labels] -> dq, dk, ds, dt
 *   flatmem_jax_ring_all_reduce_{cpu,cuda}       x -> sum over ranks of x (fp32, fp64,
 *                                                int32, int64; any shape)
 *
 * Attributes: comm (s64, every one of them), the communicator's registry
 * slot from flatmem_jax_comm_create_from_env -- a small index, not a
 * pointer; and the losses' fp32_precision (s64), as above: the options of
 * the slot's ring handle of that loss and precision (every rank must pass
 * the same, which flatmem checks). Every call is collective: every rank runs the same calls in the
 * same order (XLA may reorder custom calls that do not depend on each other
 * by data; keep a program's ring calls ordered by data dependence). Calls on
 * one communicator are serialised (one slot lock). The loss, lse, ds are the
 * GLOBAL ones (identical on every rank); dq and dk this rank's rows of the
 * gradient of the global mean. On any rank's failure every rank's call
 * returns an error with flatmem's message (the communicator is poisoned
 * and later calls fail fast). The *_cuda handlers run the ring on XLA's
 * device buffers and stream once the communicator has its NCCL transport
 * (flatmem_jax_comm_init_device); the all-reduce's returns UNIMPLEMENTED
 * (it sums host buffers only). */
FLATMEM_JAX_API XLA_FFI_Error *flatmem_jax_ring_clip_forward_cpu(XLA_FFI_CallFrame *frame);
FLATMEM_JAX_API XLA_FFI_Error *flatmem_jax_ring_clip_backward_cpu(XLA_FFI_CallFrame *frame);
FLATMEM_JAX_API XLA_FFI_Error *flatmem_jax_ring_infonce_forward_cpu(XLA_FFI_CallFrame *frame);
FLATMEM_JAX_API XLA_FFI_Error *flatmem_jax_ring_infonce_backward_cpu(XLA_FFI_CallFrame *frame);
FLATMEM_JAX_API XLA_FFI_Error *flatmem_jax_ring_sigmoid_forward_cpu(XLA_FFI_CallFrame *frame);
FLATMEM_JAX_API XLA_FFI_Error *flatmem_jax_ring_sigmoid_value_and_grad_cpu(XLA_FFI_CallFrame *frame);
FLATMEM_JAX_API XLA_FFI_Error *flatmem_jax_ring_sigmoid_backward_cpu(XLA_FFI_CallFrame *frame);
FLATMEM_JAX_API XLA_FFI_Error *flatmem_jax_ring_all_reduce_cpu(XLA_FFI_CallFrame *frame);

/* The communicators of the ring handlers. Each returns a flatmem_status; on
 * failure it writes "STATUS_NAME: message" into message (NUL-terminated,
 * truncated to message_size). Thread-safe; calls on one slot are serialised
 * with the ring handlers'.
 *
 *   create_from_env  flatmem_comm_create_from_env with options.timeout_ms and
 *                    .connect_timeout_ms (0: flatmem's defaults); collective.
 *                    *slot receives the new communicator's registry slot.
 *   rank             this rank and the world size.
 *   health           flatmem_comm_health.
 *   barrier          flatmem_comm_barrier (collective).
 *   init_device      flatmem_comm_init_device (collective): the NCCL device
 *                    transport on CUDA device cuda_device, which the ring
 *                    handlers for XLA:GPU move their blocks with.
 *   close            destroys (abort = 0: orderly, flatmem_comm_destroy) or
 *                    aborts (flatmem_comm_abort: the peers fail at once) the
 *                    communicator and its ring handles; the slot stays closed.
 * An unknown or closed slot is FLATMEM_STATUS_INVALID_ARGUMENT. */
FLATMEM_JAX_API int flatmem_jax_comm_create_from_env(int64_t timeout_ms,
                                                     int64_t connect_timeout_ms, int64_t *slot,
                                                     char *message, size_t message_size);
FLATMEM_JAX_API int flatmem_jax_comm_rank(int64_t slot, int32_t *rank, int32_t *world_size,
                                          char *message, size_t message_size);
FLATMEM_JAX_API int flatmem_jax_comm_health(int64_t slot, char *message, size_t message_size);
FLATMEM_JAX_API int flatmem_jax_comm_barrier(int64_t slot, int64_t timeout_ms, char *message,
                                             size_t message_size);
FLATMEM_JAX_API int flatmem_jax_comm_init_device(int64_t slot, int32_t cuda_device,
                                                 int64_t timeout_ms, char *message,
                                                 size_t message_size);
FLATMEM_JAX_API int flatmem_jax_comm_close(int64_t slot, int abort, char *message,
                                           size_t message_size);

/* Present only when flatmem_jax_has_cuda() is 1. A flatmem built without
 * CUDA refuses kDLCUDA tensors: these then return XLA's UNIMPLEMENTED with
 * flatmem's UNSUPPORTED message. None of them has run under XLA:GPU yet. */
FLATMEM_JAX_API XLA_FFI_Error *flatmem_jax_clip_forward_cuda(XLA_FFI_CallFrame *frame);
FLATMEM_JAX_API XLA_FFI_Error *flatmem_jax_clip_backward_cuda(XLA_FFI_CallFrame *frame);
FLATMEM_JAX_API XLA_FFI_Error *flatmem_jax_infonce_forward_cuda(XLA_FFI_CallFrame *frame);
FLATMEM_JAX_API XLA_FFI_Error *flatmem_jax_infonce_backward_cuda(XLA_FFI_CallFrame *frame);
FLATMEM_JAX_API XLA_FFI_Error *flatmem_jax_sigmoid_forward_cuda(XLA_FFI_CallFrame *frame);
FLATMEM_JAX_API XLA_FFI_Error *flatmem_jax_sigmoid_value_and_grad_cuda(XLA_FFI_CallFrame *frame);
FLATMEM_JAX_API XLA_FFI_Error *flatmem_jax_sigmoid_backward_cuda(XLA_FFI_CallFrame *frame);
FLATMEM_JAX_API XLA_FFI_Error *flatmem_jax_reversible_forward_cuda(XLA_FFI_CallFrame *frame);
FLATMEM_JAX_API XLA_FFI_Error *flatmem_jax_reversible_backward_cuda(XLA_FFI_CallFrame *frame);
FLATMEM_JAX_API XLA_FFI_Error *flatmem_jax_ring_clip_forward_cuda(XLA_FFI_CallFrame *frame);
FLATMEM_JAX_API XLA_FFI_Error *flatmem_jax_ring_clip_backward_cuda(XLA_FFI_CallFrame *frame);
FLATMEM_JAX_API XLA_FFI_Error *flatmem_jax_ring_infonce_forward_cuda(XLA_FFI_CallFrame *frame);
FLATMEM_JAX_API XLA_FFI_Error *flatmem_jax_ring_infonce_backward_cuda(XLA_FFI_CallFrame *frame);
FLATMEM_JAX_API XLA_FFI_Error *flatmem_jax_ring_sigmoid_forward_cuda(XLA_FFI_CallFrame *frame);
FLATMEM_JAX_API XLA_FFI_Error *flatmem_jax_ring_sigmoid_value_and_grad_cuda(XLA_FFI_CallFrame *frame);
FLATMEM_JAX_API XLA_FFI_Error *flatmem_jax_ring_sigmoid_backward_cuda(XLA_FFI_CallFrame *frame);
FLATMEM_JAX_API XLA_FFI_Error *flatmem_jax_ring_all_reduce_cuda(XLA_FFI_CallFrame *frame);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FLATMEM_JAX_H */
