/*
 * flatmem/reversible.h -- reversible segments with overlapped recompute.
 *
 * Included by <flatmem/flatmem.h> (either header may be included). Plain C99. The
 * conventions stated at the top of flatmem.h (statuses, last error, DLPack
 * checks, workspace, stream, options structs) hold here too.
 *
 * ------------------------------------------------------------------------
 * The segment
 * ------------------------------------------------------------------------
 * A segment is a stack of n reversible blocks k = 0 .. n-1. Block k maps a
 * state (X1, X2) to (Y1, Y2):
 *
 *     Y1 = X1 + F_k(X2)          (forward)
 *     Y2 = X2 + G_k(Y1)
 *
 *     X2 = Y2 - G_k(Y1)          (inverse, the "rebuild")
 *     X1 = Y1 - F_k(X2)
 *
 * The state is two tensors of the same shape (any ndim 1..8, compact
 * row-major, every extent >= 1), fp32 or fp64, on one device. F_k and G_k map
 * a tensor of that shape, dtype and device to one of the same; they may compute
 * internally in any precision (e.g. bf16 on a GPU) but the two residual
 * streams X1, X2 stay in the state dtype, which bounds the rebuild error.
 *
 * Forward keeps nothing but the segment output (Y1, Y2): activation memory
 * does not grow with n. Backward takes (Y1, Y2) and the upstream gradients
 * (dY1, dY2), rebuilds every block's input from its output and returns the
 * gradients (dX1, dX2) of the segment input; parameter gradients are the
 * business of the F and G callbacks (the built-in blocks accumulate them into
 * caller tensors).
 *
 * Backward, block k (last first), with J_F, J_G the Jacobians:
 *     R_k (rebuild):   g = G_k(Y1) keeping G's residuals;  X2 = Y2 - g
 *                      f = F_k(X2) keeping F's residuals;  X1 = Y1 - f
 *     B_k (gradients): dX1 = dY1 + J_G(Y1)^T dY2
 *                      dX2 = dY2 + J_F(X2)^T dX1
 *
 * Modes (flatmem_reversible_mode):
 *   STANDARD    ordinary backprop: the forward stores every block's inputs and
 *               residuals in the handle (O(n) memory, allocated by the forward);
 *               the backward runs only the B_k. The baseline.
 *   VANILLA     R_k then B_k, block by block on one chain. Memory: 2 states,
 *               1 block's residuals, 2 gradient states. ~4/3 the work of STANDARD.
 *   OVERLAPPED  R_{k-1} runs concurrently with B_k on a second chain (CPU: a
 *               second thread; CUDA: a second stream joined by device-side
 *               events). R_{k-2} waits for B_k, so at most two blocks'
 *               residuals and 3 states are alive. Bitwise identical to VANILLA
 *               (the same calls on the same inputs, in the same order per
 *               chain) as long as the callbacks are deterministic and their
 *               results do not depend on context.num_threads (true of the
 *               built-in blocks). ~4/3 the work of STANDARD, spread over two
 *               chains.
 *   AUTO        (default) per state shape, times two VANILLA and two
 *               OVERLAPPED backwards (alternating), then runs OVERLAPPED if its
 *               best beat VANILLA's by more than 3%, else VANILLA, for the rest
 *               of a round of 64 timed backwards of that shape; then probes
 *               again. On CUDA a backward is timed by two events on the
 *               caller's stream that a later backward reads once the device
 *               has passed them (never a host wait); backwards issued while a
 *               measurement is in flight run the current probe or choice
 *               untimed. Values do not depend on the choice (see OVERLAPPED).
 *               flatmem_reversible_last_mode() says which ran.
 *
 * Randomness: every forward and backward call takes (seed, offset). Block k,
 * part p (F = 0, G = 1) is given
 *     context.seed   = flatmem_reversible_block_seed(seed, k, p)
 *     context.offset = offset
 * in the forward, in the rebuild and in STANDARD's recording forward alike,
 * so a callback that draws dropout masks from (context.seed, context.offset)
 * (e.g. a counter-based generator such as Philox) replays them exactly in the
 * rebuild. Pass the same (seed, offset) to a backward as to its forward.
 *
 * Threads and streams (who calls the callbacks):
 *   CPU, forward and STANDARD/VANILLA backward: the calling thread.
 *   CPU, OVERLAPPED backward: F/G forward callbacks of the rebuild (phase
 *     REBUILD) run on one thread owned by the handle; VJP callbacks run on the
 *     calling thread. A forward of block k-1 may therefore run at the same
 *     time as a VJP of block k (never two callbacks of the same block, never
 *     two forwards or two VJPs at once). Callbacks shared between blocks
 *     (same user pointer) must tolerate that.
 *   context.parallel_for lets a CPU callback use the threads of its chain
 *     (context.num_threads of them, the calling one included).
 *   CUDA (states on kDLCUDA, when the library is built with CUDA): every
 *     callback is called from the calling thread, in enqueue order, and must
 *     enqueue its work on context.stream and return without synchronising:
 *     the caller's stream for the forward and the gradient chain, a stream
 *     owned by the handle (one per device) for the rebuild chain. The two
 *     streams are joined by events only (no host wait inside a backward);
 *     at most two blocks' residuals and 3 states are in flight. AUTO is
 *     timed by events (above). residuals and workspace are device memory; when no
 *     workspace is passed the handle allocates one with cudaMalloc (which
 *     synchronises) the first time and when it must grow. STANDARD's record
 *     is cudaMalloc'ed by the forward. rebuild_error is CPU-only.
 *     NOTE: the CUDA executor is compiled in every CUDA build but has not yet
 *     been run on a GPU.
 *   A callback must not call this handle.
 */
#ifndef FLATMEM_REVERSIBLE_H
#define FLATMEM_REVERSIBLE_H

/* Self-contained: flatmem.h (statuses, FLATMEM_API, DLPack) first. When
 * flatmem.h is the one included, it includes this file at its end. */
#include <flatmem/flatmem.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct flatmem_reversible_s flatmem_reversible_t;

typedef enum flatmem_reversible_mode {
  FLATMEM_REVERSIBLE_AUTO = 0,
  FLATMEM_REVERSIBLE_STANDARD = 1,
  FLATMEM_REVERSIBLE_VANILLA = 2,
  FLATMEM_REVERSIBLE_OVERLAPPED = 3,
  FLATMEM_REVERSIBLE_MODE_MAX = 0x7fffffff
} flatmem_reversible_mode;

/** Which sub-function of a block a callback is called for. */
typedef enum flatmem_reversible_part {
  FLATMEM_REVERSIBLE_F = 0,
  FLATMEM_REVERSIBLE_G = 1,
  FLATMEM_REVERSIBLE_PART_MAX = 0x7fffffff
} flatmem_reversible_part;

/** Why a forward callback is called. */
typedef enum flatmem_reversible_phase {
  /** The segment forward: residuals is NULL, nothing is kept. */
  FLATMEM_REVERSIBLE_PHASE_FORWARD = 0,
  /** STANDARD mode's forward: residuals are kept for the backward. */
  FLATMEM_REVERSIBLE_PHASE_RECORD = 1,
  /** The backward's rebuild: residuals are passed to the VJP right after. */
  FLATMEM_REVERSIBLE_PHASE_REBUILD = 2,
  /** The backward's gradient step (VJP callbacks only). */
  FLATMEM_REVERSIBLE_PHASE_GRADIENT = 3,
  FLATMEM_REVERSIBLE_PHASE_MAX = 0x7fffffff
} flatmem_reversible_phase;

/** What a callback is told about the call it serves. Valid only during
 *  the callback. */
typedef struct flatmem_reversible_context {
  /** sizeof(flatmem_reversible_context) of the library; fields are only
   *  ever appended. A callback compiled against a newer header reads a field
   *  appended after ABI 1 only when struct_size covers it. */
  size_t struct_size;
  /** Block index k in [0, n). */
  int32_t block;
  /** flatmem_reversible_part: F or G. */
  int32_t part;
  /** flatmem_reversible_phase. */
  int32_t phase;
  /** CPU threads this callback may use through parallel_for (>= 1). */
  int32_t num_threads;
  /** flatmem_reversible_block_seed(call seed, block, part). */
  uint64_t seed;
  /** The call's offset. */
  uint64_t offset;
  /** cudaStream_t to enqueue on for CUDA states; NULL on the CPU. */
  void *stream;
  /** CPU: calls body(arg, item, thread) for every item in [0, items) on
   *  this chain's num_threads threads (thread in [0, num_threads)) and
   *  returns when all are done. Items are claimed dynamically: a result must
   *  not depend on which thread ran an item. body must not call parallel_for. */
  void (*parallel_for)(const struct flatmem_reversible_context *context, int64_t items,
                       void (*body)(void *arg, int64_t item, int32_t thread), void *arg);
  /** flatmem's own; do not touch. */
  void *internal;
} flatmem_reversible_context;

/** y = fn(x). y (same shape, dtype and device as x) is overwritten. When
 *  residuals is not NULL it points to residual_size bytes (64-byte aligned,
 *  on the state's device) that the VJP will receive: store there what the VJP
 *  needs (e.g. normalised inputs, attention probabilities). Return
 *  FLATMEM_STATUS_SUCCESS, or another status (optionally after
 *  flatmem_reversible_callback_error()) to abort the segment call. */
typedef flatmem_status (*flatmem_reversible_forward_fn)(void *user,
                                                       const flatmem_reversible_context *context,
                                                       const DLTensor *x, DLTensor *y,
                                                       void *residuals);

/** dx += J_fn(x)^T dy: ADDS the input gradient into dx (which holds the
 *  other path's gradient). x is the input the forward saw (bitwise), and
 *  residuals what that forward stored. Parameter gradients are the callback's
 *  own business (accumulate them; the library calls the VJP of each block
 *  exactly once per backward). */
typedef flatmem_status (*flatmem_reversible_vjp_fn)(void *user,
                                                   const flatmem_reversible_context *context,
                                                   const DLTensor *x, const void *residuals,
                                                   const DLTensor *dy, DLTensor *dx);

/** *bytes = residual bytes the forward needs for inputs shaped like x
 *  (only x's metadata is valid; x->data is NULL). */
typedef flatmem_status (*flatmem_reversible_residual_size_fn)(
    void *user, const flatmem_reversible_context *context, const DLTensor *x, size_t *bytes);

/** One sub-function F_k or G_k. Frozen: never changes (see flatmem.h). */
typedef struct flatmem_reversible_function {
  flatmem_reversible_forward_fn forward; /**< required */
  flatmem_reversible_vjp_fn vjp;         /**< required */
  flatmem_reversible_residual_size_fn residual_size; /**< NULL: no residuals */
  void *user;                            /**< passed back to the three */
} flatmem_reversible_function;

/** Block k: its F and G. */
typedef struct flatmem_reversible_block {
  flatmem_reversible_function f;
  flatmem_reversible_function g;
} flatmem_reversible_block;

typedef struct flatmem_reversible_options {
  /** sizeof(flatmem_reversible_options) as the caller was compiled. */
  size_t struct_size;
  /** Backward mode (0 = AUTO). */
  flatmem_reversible_mode mode;
  /** CPU threads including the caller's (0 = all online processors, at most
   *  256). VANILLA and STANDARD give all of them to one chain; OVERLAPPED
   *  gives the rebuild chain num_threads / 3 (at least 1) and the gradient
   *  chain the rest (VJPs cost about twice a forward). */
  int32_t num_threads;
} flatmem_reversible_options;

#define FLATMEM_REVERSIBLE_OPTIONS_INIT \
  { sizeof(flatmem_reversible_options), FLATMEM_REVERSIBLE_AUTO, 0 }

/** Fill the struct_size bytes at options with the defaults, struct_size =
 *  struct_size (pass sizeof(*options)). Thread-safe. */
FLATMEM_API flatmem_status flatmem_reversible_options_init(flatmem_reversible_options *options,
                                                           size_t struct_size);

/** The seed block `block`, part `part` receives for a call seed:
 *  a SplitMix64 finalisation of seed ^ (0x9E3779B97F4A7C15 * (2 * block + part + 1)).
 *  Thread-safe. */
FLATMEM_API uint64_t flatmem_reversible_block_seed(uint64_t seed, int32_t block, int32_t part);

/** Create a segment of num_blocks (1 .. 65536) blocks. The array is copied;
 *  the user pointers in it must stay valid until destroy. Starts the handle's
 *  threads (CPU). *out is set only on success. */
FLATMEM_API flatmem_status flatmem_reversible_create(flatmem_reversible_t **out,
                                                     const flatmem_reversible_block *blocks,
                                                     int32_t num_blocks,
                                                     const flatmem_reversible_options *options);

/** Joins the handle's threads, frees what it kept. NULL is a no-op. */
FLATMEM_API flatmem_status flatmem_reversible_destroy(flatmem_reversible_t *handle);

/** Workspace bytes of the forward / backward for states shaped like x
 *  (metadata only), in the handle's mode (AUTO: the larger of VANILLA and
 *  OVERLAPPED). Calls the residual_size callbacks. Does not allocate. */
FLATMEM_API flatmem_status flatmem_reversible_forward_workspace_size(flatmem_reversible_t *handle,
                                                                     const DLTensor *x,
                                                                     size_t *bytes);
/** The backward's workspace bytes (see
 *  flatmem_reversible_forward_workspace_size). */
FLATMEM_API flatmem_status flatmem_reversible_backward_workspace_size(flatmem_reversible_t *handle,
                                                                      const DLTensor *x,
                                                                      size_t *bytes);

/**
 * Segment forward: (y1, y2) = block n-1( ... block 0(x1, x2) ... ).
 *
 *   x1, x2   the segment input, same shape/dtype (fp32 | fp64)/device
 *   seed, offset   randomness handed to the callbacks (see above)
 *   y1, y2   written (at the end: they may alias x1, x2; not each other)
 *
 * Keeps nothing (STANDARD mode: keeps every block's inputs and residuals in
 * handle memory, allocated here, until the next forward or destroy). y1 and
 * y2 are written only when every callback succeeded. A failing callback gives
 * its status and a message "block k, F forward: ...".
 */
FLATMEM_API flatmem_status flatmem_reversible_forward(flatmem_reversible_t *handle,
                                                      const DLTensor *x1, const DLTensor *x2,
                                                      uint64_t seed, uint64_t offset, DLTensor *y1,
                                                      DLTensor *y2, void *workspace,
                                                      size_t workspace_bytes, void *stream);

/**
 * Segment backward.
 *
 *   y1, y2    the forward's output (read only)
 *   dy1, dy2  upstream gradients dL/dY1, dL/dY2 (read only)
 *   seed, offset   as given to the forward
 *   dx1, dx2  written: dL/dX1, dL/dX2 (may alias dy1, dy2 exactly)
 *   x1, x2    written if not NULL: the rebuilt segment input (compare it
 *             with the true input to see the rebuild error), both or neither
 *
 * STANDARD mode needs the preceding forward of this handle (same y1 shape)
 * and ignores y1/y2 values. dx1/dx2/x1/x2 are written only when every
 * callback succeeded; parameter gradients the callbacks accumulated before a
 * failure stay accumulated.
 */
FLATMEM_API flatmem_status flatmem_reversible_backward(
    flatmem_reversible_t *handle, const DLTensor *y1, const DLTensor *y2, const DLTensor *dy1,
    const DLTensor *dy2, uint64_t seed, uint64_t offset, DLTensor *dx1, DLTensor *dx2,
    DLTensor *x1, DLTensor *x2, void *workspace, size_t workspace_bytes, void *stream);

/** The mode the last successful backward ran (STANDARD, VANILLA or
 *  OVERLAPPED; AUTO before any backward). */
FLATMEM_API flatmem_status flatmem_reversible_last_mode(const flatmem_reversible_t *handle,
                                                        flatmem_reversible_mode *mode);

/**
 * Rebuild error over depth (a diagnostic; allocates O(n) states): runs the
 * forward from (x1, x2) keeping every block's true input, then the rebuild
 * from the output, and writes for k = 0 .. n-1
 *     errors[k] = max |rebuilt - true| / max(max |true|, tiny)
 * over both streams of block k's input. errors: (n,) fp64 on the CPU.
 * Callbacks run in phases FORWARD and REBUILD (residuals are discarded).
 */
FLATMEM_API flatmem_status flatmem_reversible_rebuild_error(flatmem_reversible_t *handle,
                                                            const DLTensor *x1, const DLTensor *x2,
                                                            uint64_t seed, uint64_t offset,
                                                            DLTensor *errors, void *stream);

/** For callbacks: sets the calling thread's message that the library puts
 *  after "block k, F forward: " when the callback returns a failure status.
 *  message may be NULL (clears it). Thread-safe. */
FLATMEM_API void flatmem_reversible_callback_error(const char *message);

/* ------------------------------------------------------------------------ */
/* Built-in blocks                                                          */
/* ------------------------------------------------------------------------ */
/*
 * Ready-made F and G for a reversible transformer, so that C and JAX users
 * need no callbacks. A state is (batch, tokens, width) (or (tokens, width)
 * for batch 1), fp32, on the CPU or (CUDA builds) on the GPU that holds the
 * block's parameters. Both blocks are pre-LayerNorm:
 *
 *   FLATMEM_BLOCK_ATTENTION:  F(x) = MHSA(LN(x))
 *       LN(x)   = (x - mean) / sqrt(var + eps) * ln_weight + ln_bias  (per token,
 *                 biased variance over width)
 *       [q k v] = LN(x) @ qkv_weight + qkv_bias,  heads of width/heads each
 *       a_h     = softmax(q_h k_h^T / sqrt(width/heads)) v_h   (over the tokens
 *                 of one batch item; no mask)
 *       F(x)    = concat_h(a_h) @ proj_weight + proj_bias
 *   FLATMEM_BLOCK_MLP:        G(x) = GELU(LN(x) @ fc1_weight + fc1_bias) @ fc2_weight + fc2_bias
 *       GELU(u) = u/2 * (1 + erf(u / sqrt 2))  (exact, not the tanh form)
 *
 * Parameters (row-major, fp32, compact; all twelve tensors -- parameters and
 * gradients -- on one device: kDLCPU, or kDLCUDA with one device id), in this order:
 *   ATTENTION: 0 ln_weight (width)  1 ln_bias (width)  2 qkv_weight (width, 3*width)
 *              3 qkv_bias (3*width) 4 proj_weight (width, width) 5 proj_bias (width)
 *              (qkv columns: q of all heads, then k, then v; head h uses
 *               columns h*width/heads .. (h+1)*width/heads - 1 of each)
 *   MLP:       0 ln_weight (width)  1 ln_bias (width)  2 fc1_weight (width, hidden)
 *              3 fc1_bias (hidden)  4 fc2_weight (hidden, width) 5 fc2_bias (width)
 * Their gradients (same shapes) are ACCUMULATED (+=) by the VJP: zero them
 * before a backward. A block's results do not depend on the thread count.
 * The built-in blocks draw no randomness (seed and offset are ignored: no
 * dropout). A block object holds no state during a call, so one object may
 * serve several blocks of a segment (weight tying; their gradients then add).
 *
 * Memory: a block's residuals (what the segment keeps per block between the
 * rebuild and the VJP), in fp32 elements, with rows = batch * tokens:
 *   ATTENTION  (5 * width + 2) * rows + batch * heads * tokens^2
 *   MLP        (width + hidden + 2) * rows
 * Besides, each call allocates and frees scratch of its own (outside the
 * segment workspace): a VJP about 4 * width * rows + threads * tokens^2
 * (ATTENTION) or (2 * hidden + width) * rows (MLP) elements; a forward without
 * residuals the ATTENTION layout above with one tokens^2 tile per thread, or
 * one 64-row slab of hidden per thread (MLP).
 *
 * CUDA (kDLCUDA parameters, CUDA builds; otherwise a CUDA tensor gives
 * UNSUPPORTED): states must be on the parameters' device (a CPU state with
 * CUDA parameters, or the reverse, is INVALID_ARGUMENT naming the state).
 * Every callback enqueues its work on context.stream and returns without
 * synchronising the host. The products run in cuBLASLt, opened at run time
 * (dlopen of $FLATMEM_CUBLASLT_LIBRARY, then "libcublasLt.so.<CUDA major>",
 * then the library found at configure time; UNSUPPORTED naming what was
 * tried when none loads); LayerNorm, GELU, softmax, the head layout and the
 * column sums are our kernels. The residuals have the sizes above (region
 * order differs from the CPU's: a CPU block's residuals are not a CUDA
 * block's). Per-call scratch (the CPU sizes above without the thread tiles,
 * the whole batch's tokens^2 tiles instead, plus 32 MiB of cuBLASLt
 * workspace) is taken with cudaMallocAsync on context.stream from the
 * device's current memory pool (cudaDeviceGetMemPool) and freed with
 * cudaFreeAsync on that stream: nothing is freed before the stream has
 * passed its last use. The pool is the caller's to tune: raise its
 * cudaMemPoolAttrReleaseThreshold to keep the memory between steps, read
 * cudaMemPoolAttrUsedMemHigh for the peak. Results are deterministic for a
 * given device, library and cuBLASLt version (fixed algorithm per shape, our
 * reductions in a fixed order, parameter gradients accumulated in call
 * order), so OVERLAPPED equals VANILLA bitwise there too; they match the
 * CPU block to fp32 rounding (FP32 math) but not bitwise.
 * NOTE: the CUDA blocks are compiled in every CUDA build but have not yet
 * been run on a GPU.
 */

/** Precision of the built-in blocks' matrix products. States, residual
 *  streams, LayerNorm, softmax, GELU and every accumulation stay fp32. */
typedef enum flatmem_block_math {
  /** fp32 inputs, fp32 products (the default). */
  FLATMEM_BLOCK_MATH_FP32 = 0,
  /** CUDA: GEMM inputs rounded to TF32 (10-bit mantissa) on tensor cores,
   *  fp32 accumulation -- ~1e-3 relative error per product. The CPU runs
   *  FP32 for either value. */
  FLATMEM_BLOCK_MATH_TF32 = 1,
  FLATMEM_BLOCK_MATH_MAX = 0x7fffffff
} flatmem_block_math;

typedef struct flatmem_block_s flatmem_block_t;

typedef enum flatmem_block_kind {
  FLATMEM_BLOCK_ATTENTION = 1,
  FLATMEM_BLOCK_MLP = 2,
  FLATMEM_BLOCK_KIND_MAX = 0x7fffffff
} flatmem_block_kind;

/** Number of parameter tensors of every built-in block. */
#define FLATMEM_BLOCK_NUM_PARAMETERS 6

typedef struct flatmem_block_options {
  /** sizeof(flatmem_block_options) as the caller was compiled. */
  size_t struct_size;
  /** Which block (required, no default). */
  flatmem_block_kind kind;
  /** Model width (required, >= 1). */
  int32_t width;
  /** ATTENTION: heads (0 = 1); width must be a multiple of it. Ignored
   *  for MLP. */
  int32_t heads;
  /** MLP: hidden width (0 = 4 * width). Ignored for ATTENTION. */
  int32_t hidden;
  /** LayerNorm epsilon (0 = 1e-6). */
  float layer_norm_eps;
  /** flatmem_block_math of the products (0 = FP32). Appended after 0.1.0:
   *  a caller compiled without it (smaller struct_size) gets FP32. */
  flatmem_block_math math;
} flatmem_block_options;

/* kind 0 and width 0 are refused: set both after initialising. */
#define FLATMEM_BLOCK_OPTIONS_INIT \
  { sizeof(flatmem_block_options), (flatmem_block_kind)0, 0, 0, 0, 0.0f, FLATMEM_BLOCK_MATH_FP32 }

/** Fill the struct_size bytes at options with the defaults, struct_size =
 *  struct_size (pass sizeof(*options)). Thread-safe. */
FLATMEM_API flatmem_status flatmem_block_options_init(flatmem_block_options *options,
                                                      size_t struct_size);

/** Create a built-in block. Its parameters must be set before use. */
FLATMEM_API flatmem_status flatmem_block_create(flatmem_block_t **out,
                                                const flatmem_block_options *options);

/** NULL is a no-op. Destroy segments using the block first. */
FLATMEM_API flatmem_status flatmem_block_destroy(flatmem_block_t *block);

/**
 * Point the block at its parameters and their gradients: arrays of
 * FLATMEM_BLOCK_NUM_PARAMETERS tensors in the order above (grads may be NULL
 * for a forward-only block). Shapes, dtype (fp32), device (one device for
 * all: kDLCPU, or kDLCUDA of one id -- CUDA builds only -- whose pointers are
 * checked to be that device's memory), element alignment and compactness
 * are checked here; gradients must not overlap the
 * parameters. Only data + byte_offset is kept: the DLTensor structs and their
 * shape/strides arrays need not outlive this call, but the memory they point
 * to must stay valid while the block is used. May be called again between
 * segment calls (e.g. JAX gives new buffers every step).
 */
FLATMEM_API flatmem_status flatmem_block_set_parameters(flatmem_block_t *block,
                                                        const DLTensor *parameters,
                                                        const DLTensor *gradients);

/** The callbacks of this block, for flatmem_reversible_block.f or .g. */
FLATMEM_API flatmem_status flatmem_block_function(flatmem_block_t *block,
                                                  flatmem_reversible_function *function);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FLATMEM_REVERSIBLE_H */
