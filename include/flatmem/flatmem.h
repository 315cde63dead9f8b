/*
 * flatmem.h -- the public C ABI of flatmem.
 *
 * flatmem brings memory-saving training techniques to any framework through a
 * stable C ABI. This header is plain C99 (it also compiles as C++) and is the
 * manual: every function states what it computes, the shapes, dtypes and
 * devices it accepts, whether it allocates, and its thread rule.
 *
 * ------------------------------------------------------------------------
 * Conventions that hold for every function
 * ------------------------------------------------------------------------
 * - Every function returns a flatmem_status. FLATMEM_STATUS_SUCCESS is 0.
 *   On any other status, flatmem_last_error() returns a message naming the
 *   offending argument, its shape or value, and what was expected.
 * - On error nothing the caller owns is written: outputs are validated
 *   before any of them is touched.
 * - Argument order: the handle first (for *_create: the out-pointer that
 *   receives it), then inputs, then outputs, then workspace pointer and
 *   size, then the stream. Size queries put their size_t* result last.
 * - Tensors are DLPack DLTensor (<dlpack/dlpack.h>). Every field is checked:
 *   device type, dtype (code, bits, lanes = 1), ndim, shape (every extent
 *   >= 1), strides (NULL = compact row-major; otherwise the innermost stride
 *   must be 1 and row strides may exceed the row length, in elements),
 *   byte_offset, alignment of data + byte_offset to the element size, and
 *   that byte extents fit in 64 bits.
 * - Tensors on kDLCPU run on the CPU backend. Tensors on kDLCUDA run on the
 *   CUDA backend when the library was built with it (nvcc found at build
 *   time); a library built without CUDA, or a process where no CUDA device
 *   can be used (no driver, no device), refuses them with
 *   FLATMEM_STATUS_UNSUPPORTED. All tensors of one call, scalars and outputs
 *   included, must be on the same device (type and id). Functions that are
 *   CPU-only say so.
 * - kDLCUDA calls never allocate, never synchronise the device and never
 *   read device memory on the host: work is enqueued on `stream` and the
 *   function returns; results are ready when the stream gets there. A
 *   workspace is required (see the contrastive section, "CUDA tensors").
 *   The one exception is the ring loss on kDLCUDA tensors (a handle with
 *   options.comm; "Ring across ranks"), which synchronises `stream` and
 *   keeps device memory of its own.
 * - Workspace: every compute function takes (workspace, workspace_bytes).
 *   Ask the matching *_workspace_size function first. Passing NULL and 0
 *   lets the handle allocate and keep a buffer of its own (grown on demand,
 *   freed by *_destroy). A non-NULL workspace smaller than the query gives
 *   FLATMEM_STATUS_WORKSPACE_TOO_SMALL. Any alignment is accepted (the
 *   query includes 64 bytes of slack for aligning internally).
 * - stream: a cudaStream_t of the tensors' device for kDLCUDA tensors (NULL
 *   = the legacy default stream); ignored on the CPU.
 * - Thread rule: a handle is used by one thread at a time; distinct handles
 *   are independent. flatmem_last_error() is per thread. Functions without a
 *   handle are thread-safe.
 * - Structs that cross the ABI evolve by appending fields, never by
 *   changing or removing one, and both sides say how many bytes they know
 *   (the "extensible struct" rule of Linux's openat2 / clone3):
 *   - Structs the library READS (options, schedules) begin with size_t
 *     struct_size = sizeof as the caller was compiled. Initialise them with
 *     the *_INIT macro or the *_init() function. The library reads
 *     min(struct_size, its sizeof) bytes; a field the caller's struct does
 *     not have, or leaves 0, means "default". Bytes past the library's
 *     sizeof (a caller built against a newer header) must be 0: a non-zero
 *     one is a field this library does not know, refused with
 *     FLATMEM_STATUS_UNSUPPORTED naming the struct, never ignored.
 *   - Every struct the library WRITES, init functions included, comes with
 *     a size argument right after its pointer: pass sizeof(*ptr). The
 *     library writes exactly that many bytes: its fields up to
 *     min(size, its sizeof), and zeros past its sizeof (fields it does not
 *     know read 0). It never writes past `size`. An init function also
 *     sets struct_size = size. Arrays of structs take the element size
 *     instead: element i lies at (char *)array + i * element_size.
 *   - A size of 0 or above FLATMEM_MAX_STRUCT_SIZE (4096: no flatmem struct
 *     comes near it; a larger value is uninitialised memory) is
 *     FLATMEM_STATUS_INVALID_ARGUMENT naming the argument, and so is a size
 *     below sizeof(size_t) for a struct that begins with struct_size (inits,
 *     the get_schedule outputs): it could only hold a truncated struct_size.
 *   - No struct has padding: a field is appended 8-byte aligned (a 4-byte
 *     field comes with a second one or a reserved one), so that every byte
 *     of a struct is a named field both sides agree on. The gate
 *     (scripts/check-abi.sh) refuses padding and any change to a field a
 *     released header had.
 *   - Reserved fields (reserved0, reserved1, ...) name bytes that were
 *     padding in ABI 1. Set them to 0 (the INIT macros and init functions
 *     do); the library writes 0 into those of structs it fills. In a struct
 *     the library reads they are ignored when struct_size <= the library's
 *     sizeof, because an ABI-1 caller's compiler may have left them
 *     indeterminate; a caller whose struct_size is larger (built against a
 *     newer header) must leave them 0: non-zero is FLATMEM_STATUS_UNSUPPORTED
 *     naming the field, like any unknown field.
 *   - A NULL options pointer means all defaults.
 *   - flatmem_reversible_function, flatmem_reversible_block and
 *     flatmem_comm_unique_id are frozen: they never change (new callbacks
 *     would come as a new struct and function).
 *   - The ABI (SONAME libflatmem.so.1) is checked against a baseline with
 *     libabigail's abidiff on every build of the tests; an intended break
 *     bumps the SONAME (see docs/abi.md).
 * - Anything not yet promised stable sits behind FLATMEM_EXPERIMENTAL.
 */
#ifndef FLATMEM_FLATMEM_H
#define FLATMEM_FLATMEM_H

#include <stddef.h>
#include <stdint.h>

#include <dlpack/dlpack.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(FLATMEM_BUILDING_LIBRARY) && defined(__GNUC__)
#define FLATMEM_API __attribute__((visibility("default")))
#else
#define FLATMEM_API
#endif

/* ======================================================================== */
/* Versions                                                                 */
/* ======================================================================== */

#define FLATMEM_VERSION_MAJOR 0
#define FLATMEM_VERSION_MINOR 2
#define FLATMEM_VERSION_PATCH 0
/** Packed version: major * 10000 + minor * 100 + patch. */
#define FLATMEM_VERSION \
  (FLATMEM_VERSION_MAJOR * 10000 + FLATMEM_VERSION_MINOR * 100 + FLATMEM_VERSION_PATCH)

/** The ABI version: the library is libflatmem.so.FLATMEM_ABI_VERSION. */
#define FLATMEM_ABI_VERSION 1

/** The largest size argument or struct_size the library accepts (see the
 *  conventions above). */
#define FLATMEM_MAX_STRUCT_SIZE 4096

/** The packed version of the library actually loaded (compare it with
 *  FLATMEM_VERSION to detect a header/library mismatch). Thread-safe. */
FLATMEM_API int flatmem_version(void);

/** The same as "MAJOR.MINOR.PATCH", a static string. Thread-safe. */
FLATMEM_API const char *flatmem_version_string(void);

/* ======================================================================== */
/* Status and errors                                                        */
/* ======================================================================== */

/** Result of every function. Values are explicit and never reused. */
typedef enum flatmem_status {
  FLATMEM_STATUS_SUCCESS = 0,
  /** An argument is NULL, has the wrong dtype/device/ndim/shape/stride, a
   *  value out of range, or sizes whose byte extent overflows. */
  FLATMEM_STATUS_INVALID_ARGUMENT = 1,
  /** A valid request this build or machine cannot serve (e.g. a CUDA
   *  tensor without CUDA). */
  FLATMEM_STATUS_UNSUPPORTED = 2,
  /** The library could not allocate memory it needed. */
  FLATMEM_STATUS_OUT_OF_MEMORY = 3,
  /** A caller workspace smaller than the matching *_workspace_size. */
  FLATMEM_STATUS_WORKSPACE_TOO_SMALL = 4,
  /** NaN or Inf found in an input under FLATMEM_NONFINITE_ERROR. */
  FLATMEM_STATUS_NON_FINITE = 5,
  /** A bug in flatmem: please report it with the message. */
  FLATMEM_STATUS_INTERNAL = 6,
  /** A communicator wait passed its deadline: a peer is dead, wedged, slow
   *  or never arrived. The message names the operation, the peer and the
   *  step. The communicator is poisoned afterwards. */
  FLATMEM_STATUS_TIMEOUT = 7,
  /** A peer of a communicator failed: its connection reset, it aborted, it
   *  could not be reached, or it rejected this rank (e.g. another session's
   *  id). The message names the peer. The communicator is poisoned. */
  FLATMEM_STATUS_PEER_FAILURE = 8,
  /** The communicator failed earlier (its first error is repeated in the
   *  message): every call fails fast; release it with flatmem_comm_abort. */
  FLATMEM_STATUS_COMM_POISONED = 9,
  FLATMEM_STATUS_MAX = 0x7fffffff
} flatmem_status;

/** A static English name for a status ("FLATMEM_STATUS_INVALID_ARGUMENT");
 *  "FLATMEM_STATUS_UNKNOWN" for values this version does not know.
 *  Thread-safe. */
FLATMEM_API const char *flatmem_status_string(flatmem_status status);

/** The calling thread's message for the last failed call: which argument,
 *  the shape or value it had and what was expected. "" when the thread's last
 *  call succeeded. The pointer stays valid until the thread's next flatmem
 *  call. Thread-safe (per-thread storage). */
FLATMEM_API const char *flatmem_last_error(void);

/** Policy for NaN and Inf found in input features. */
typedef enum flatmem_nonfinite_policy {
  /** Default. Inputs are scanned (O((b + c) * d), under 1% of the work)
   *  before anything is computed; a NaN or Inf gives
   *  FLATMEM_STATUS_NON_FINITE naming the tensor, row and column, and no
   *  output is written. CPU tensors only: honouring it on kDLCUDA would
   *  need a host round trip, so kDLCUDA calls under this policy return
   *  FLATMEM_STATUS_UNSUPPORTED. */
  FLATMEM_NONFINITE_ERROR = 0,
  /** No scan: NaN/Inf propagate into the loss and gradients as IEEE
   *  arithmetic dictates; the backward then also accepts non-finite
   *  row_lse / col_lse / dloss. Required for kDLCUDA tensors. */
  FLATMEM_NONFINITE_PROPAGATE = 1,
  FLATMEM_NONFINITE_MAX = 0x7fffffff
} flatmem_nonfinite_policy;

/* ======================================================================== */
/* CPU instruction set                                                      */
/* ======================================================================== */
/*
 * The CPU backend's element-wise kernels (the exponentials and reductions of
 * the contrastive loss, LayerNorm, softmax and GELU of the built-in blocks)
 * are compiled once per instruction set, and the contrastive tile products of
 * bf16 inputs have their own kernels for AVX512_BF16; one instruction set
 * runs, for the whole process:
 *  - by default the best this processor (and its OS) supports;
 *  - else the one the environment variable FLATMEM_CPU_ISA names when the
 *    process first asks (amx, avx512bf16, avx512, avx2, baseline, any case;
 *    empty or "auto" = the best), the way ONEDNN_MAX_CPU_ISA or OPENBLAS_CORETYPE cap theirs;
 *  - else the one flatmem_cpu_isa_set() chose last (it overrides the
 *    variable).
 * A value that names an instruction set the processor lacks is an error,
 * never an illegal instruction: FLATMEM_STATUS_UNSUPPORTED (an unknown word:
 * FLATMEM_STATUS_INVALID_ARGUMENT) from flatmem_cpu_isa_get, from
 * flatmem_contrastive_create / _forward / _backward and from
 * flatmem_block_create, the message naming the variable and what this
 * processor has.
 * Results are bitwise reproducible for one instruction set; different ones
 * round differently (fused multiply-adds, vector widths), within the error
 * bounds each function states. The setting covers the matrix products too:
 * they are flatmem's own register-blocked kernels for each instruction set
 * (no BLAS, so no BLAS's table of known processors, decides what runs);
 * below AVX512BF16 every contrastive tile product (fp32, bf16 widened to
 * fp32, fp16 widened) is an fp32 product. flatmem_cpu_isa_engine names them.
 */
typedef enum flatmem_cpu_isa {
  /** flatmem_cpu_isa_set(DEFAULT): back to FLATMEM_CPU_ISA, or the best. */
  FLATMEM_CPU_ISA_DEFAULT = 0,
  /** Any x86-64 (SSE2), and the only one on other processors. */
  FLATMEM_CPU_ISA_BASELINE = 1,
  /** x86-64-v3: AVX2 with FMA (BMI1/2, F16C). */
  FLATMEM_CPU_ISA_AVX2 = 2,
  /** x86-64-v4: AVX-512 F, BW, DQ and VL, 512-bit vectors. */
  FLATMEM_CPU_ISA_AVX512 = 3,
  /** AVX512 plus AVX512_BF16 (Cooper Lake, Sapphire Rapids and later Xeons;
   *  AMD Zen 4 and later): the contrastive tile products of bf16 inputs run
   *  on vdpbf16ps (bf16 products, fp32 accumulation) instead of widening to
   *  fp32 for sgemm; the element-wise kernels are those of AVX512. See
   *  "16-bit inputs on the CPU" below flatmem_contrastive_options. */
  FLATMEM_CPU_ISA_AVX512BF16 = 4,
  /** AVX512BF16 plus AMX-TILE and AMX-BF16 (Sapphire Rapids, Emerald Rapids,
   *  Granite Rapids Xeons), with the OS's tile state enabled and this
   *  process's permission for it, which flatmem asks Linux for once
   *  (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), as oneDNN does)
   *  the first time the library detects the processor: the contrastive tile
   *  products of bf16 inputs run on AMX tiles (bf16 products, fp32 sums;
   *  the numerics of AVX512BF16, see "16-bit inputs on the CPU"); everything
   *  else as AVX512BF16. */
  FLATMEM_CPU_ISA_AMX = 5,
  FLATMEM_CPU_ISA_MAX = 0x7fffffff
} flatmem_cpu_isa;

/** *in_use: the instruction set the kernels run with now; *best: the best
 *  this processor supports among those compiled in. Either pointer may be
 *  NULL (not both). Fails (see above) when FLATMEM_CPU_ISA is malformed or
 *  asks for more than *best. Thread-safe. */
FLATMEM_API flatmem_status flatmem_cpu_isa_get(flatmem_cpu_isa *in_use, flatmem_cpu_isa *best);

/** Selects the instruction set for the whole process (DEFAULT: back to the
 *  environment's choice). FLATMEM_STATUS_UNSUPPORTED, and nothing changes,
 *  when the processor lacks it. Thread-safe, but calls already running may
 *  finish with the previous one: select before computing when bitwise
 *  reproducibility matters. */
FLATMEM_API flatmem_status flatmem_cpu_isa_set(flatmem_cpu_isa isa);

/** "amx", "avx512bf16", "avx512", "avx2", "baseline", "default"; "unknown" for
 *  other values.
 *  A static string. Thread-safe. */
FLATMEM_API const char *flatmem_cpu_isa_name(flatmem_cpu_isa isa);

/** The engine behind the CPU products at instruction set `isa` (DEFAULT: the
 *  one the kernels use now), in words: library, version and the kernel per
 *  input dtype, e.g. "flatmem 0.2.0 own kernels at amx: fp32 avx512 fma
 *  12x32; bf16 AMX tiles ...; fp16 widened to fp32". Every product -- the
 *  contrastive tile products and the built-in blocks' GEMMs -- runs on
 *  flatmem's own kernels for the selected instruction set; no BLAS's CPU
 *  table decides. For logs and benchmark rows: the text is not a stable
 *  format. A static string; "unknown" for a value that is no
 *  flatmem_cpu_isa. Thread-safe. */
FLATMEM_API const char *flatmem_cpu_isa_engine(flatmem_cpu_isa isa);

/** A communicator (see <flatmem/comm.h>, included at the end of this file). */
typedef struct flatmem_comm_s flatmem_comm_t;

/* ======================================================================== */
/* Tiled contrastive loss                                                   */
/* ======================================================================== */
/*
 * Row features q (b x d), column features k (c x d), logit scale s > 0.
 * Logits x_ij = s * <q_i, k_j>. The b x c logit matrix is never stored:
 * tiles of it are computed, folded into running log-sum-exp statistics
 * (max subtracted, so s = 100 is safe), and recomputed in the backward pass.
 * Memory beyond inputs and outputs: O(tile_rows * tile_cols * threads +
 * (tile_rows + tile_cols) * d * threads + b + c), see the workspace queries.
 *
 * Losses (b, c, d >= 1):
 *
 *  FLATMEM_CONTRASTIVE_INFONCE (rows -> columns), c >= b allowed (e.g. hard
 *  negatives appended as extra columns):
 *      l_i  = LSE_j(x_ij) - x_{i, y_i},   LSE_j(x_ij) = log sum_j exp(x_ij)
 *      L    = (1/b) sum_i l_i
 *    with y_i from an optional int64 label tensor (shape (b,), values in
 *    [0, c)), default y_i = i (which then requires c >= b).
 *
 *  FLATMEM_CONTRASTIVE_SYMMETRIC (CLIP), c = b required, labels not
 *  accepted (row i is paired with column i):
 *      L = 1/2 * ( (1/b) sum_i [LSE_j(x_ij) - x_ii]
 *                + (1/b) sum_j [LSE_i(x_ij) - x_jj] )
 *    Fused: one tile walk in forward produces both the row and the column
 *    log-sum-exp; one recompute per tile in backward feeds dq, dk and ds,
 *    8*b^2*d FLOPs for forward + backward.
 *
 * Saved state: the forward returns row_lse (b,) and, for the symmetric loss,
 * col_lse (c,): row_lse_i = LSE_j(x_ij), col_lse_j = LSE_i(x_ij). These fp32
 * vectors are the only state the backward needs besides q, k and s.
 *
 * Gradient convention (backward), with g the upstream gradient dloss:
 *    dq_i = g * dL/dq_i,  dk_j = g * dL/dk_j,  ds = g * dL/ds
 * where L is the mean loss above (mean over the b rows of this call) and s is
 * the logit scale itself, not its logarithm: a framework that learns
 * t = log s multiplies ds by s. With P_ij = exp(x_ij - row_lse_i),
 * Q_ij = exp(x_ij - col_lse_j) and G = dL/dx:
 *    InfoNCE:    G_ij = (P_ij - [j = y_i]) / b
 *    Symmetric:  G_ij = (P_ij + Q_ij - 2 [i = j]) / (2 b)
 *    dq = s * G k,   dk = s * G^T q,   ds = sum_ij G_ij <q_i, k_j>.
 *
 * Dtypes: q and k are both fp32, both bf16 (kDLBfloat, 16) or both fp16
 * (kDLFloat, 16). Products are accumulated in fp32; bf16/fp16 tiles are
 * widened tile by tile (no fp32 copy of the inputs), except bf16 at the CPU
 * ISA level avx512bf16 (see "bf16 products on the CPU" below). logit_scale, loss,
 * row_lse, col_lse, dloss and dlogit_scale are fp32. dq and dk are fp32 or the
 * input dtype; with the input dtype being 16-bit they are accumulated in an
 * fp32 buffer inside the workspace ((b + c) * d * 4 bytes) and rounded once
 * at the end.
 *
 * Shapes: q (b, d), k (c, d), rows with innermost stride 1 and any row stride
 * >= d. labels (b,) int64 or NULL. logit_scale, loss, dloss, dlogit_scale:
 * one element (ndim 0, or ndim 1 with shape (1,)). row_lse (b,), col_lse (c,)
 * contiguous. dq like q, dk like k (own strides allowed).
 *
 * Determinism: results are bitwise identical from run to run for the same
 * inputs and options, whatever the thread count: work is split into a fixed
 * grid of row and column groups whose accumulation order does not depend on
 * which thread runs it.
 *
 * CUDA tensors (a library built with CUDA; sm_80 and newer):
 *  - Same losses, shapes, strides, dtypes, saved state and gradient
 *    convention as on the CPU. logit_scale, loss, labels, row_lse, col_lse,
 *    dloss and dlogit_scale are device tensors too; q, k and every pointer are
 *    checked to be device (or managed) memory of the tensors' device id.
 *  - The handle must be created with nonfinite = FLATMEM_NONFINITE_PROPAGATE
 *    (FLATMEM_STATUS_UNSUPPORTED otherwise, see flatmem_nonfinite_policy).
 *  - Values behind device pointers are not checked on the host: a logit
 *    scale that is not finite and > 0, or a label outside [0, c), makes the
 *    loss (and the gradients it touches) NaN instead of an error status.
 *  - Two engines run the softmax losses on one device. The tile kernels
 *    fuse every product on chip (64 x 128 tiles). The panel engine lets
 *    cuBLASLt write R x C panels of fp32 logits into the workspace and runs
 *    its own passes over them (running log-sum-exps in the forward; G in
 *    place, then cuBLASLt products into fp32 accumulators, in the backward;
 *    docs/contrastive/panels.md). The handle chooses when it is created:
 *    the panels for bf16 q and k with b and c >= 16384 on a device of
 *    compute capability 9.0 or newer (where a GPU run measured them 3-4x
 *    faster), the tiles otherwise and for the ring. Forced, the panels run
 *    the sigmoid loss and each block of the softmax ring too (written and
 *    tested on the CPU, not yet run on a GPU). Environment, read by
 *    flatmem_contrastive_create:
 *    FLATMEM_CUDA_ENGINE = auto | tiles | panels forces an engine;
 *    FLATMEM_CUDA_PANEL_BYTES (bytes, suffix K / M / G; default 64M) is the
 *    panel engine's workspace dial -- larger panels and, once dk's fp32
 *    accumulator (c x d x 4 bytes) fits, one backward sweep instead of two;
 *    FLATMEM_CUDA_PANEL_SHAPE = <rows>x<cols> forces the panel extents (a
 *    tuning knob). A value these do not parse fails the create with
 *    FLATMEM_STATUS_INVALID_ARGUMENT naming the variable. The panel engine
 *    opens cuBLASLt (libcublasLt.so.<major>, or $FLATMEM_CUBLASLT_LIBRARY)
 *    at its first call; FLATMEM_STATUS_UNSUPPORTED when it cannot.
 *  - workspace must be a device buffer of at least the queried size (NULL
 *    is refused with FLATMEM_STATUS_INVALID_ARGUMENT: the CUDA backend never
 *    allocates). Queries with kDLCUDA tensors return the CUDA needs of the
 *    engine the handle chooses for those shapes. Tiles: forward
 *    (16 b + 32 c) * 8 bytes at most (partial log-sum-exp states); backward
 *    2 * SMs * 64 * ceil(d / 64) * 4 bytes (one fp32 accumulator tile per
 *    resident CTA; SMs = multiprocessors of the device) plus b / 8 bytes.
 *    Panels: at most the dial (54.5 MiB at b = 65536, d = 768 by default),
 *    unless the smallest panel (128 x 128) does not fit in it.
 *  - Errors found before the first kernel launch are reported as for the
 *    CPU, with nothing written. Launch failures give FLATMEM_STATUS_INTERNAL;
 *    errors while the kernels run surface on the stream, as for any CUDA
 *    work.
 *  - Products run on tensor cores: bf16 / fp16 inputs exactly (fp32
 *    accumulation); fp32 inputs as TF32 by default or in about full fp32
 *    precision with fp32_precision = FLATMEM_FP32_PRECISION_FULL (each
 *    operand split into two TF32 parts, three products; about 3x the
 *    tensor-core time). In the backward the recomputed G enters the second
 *    product rounded to the input type (TF32 for fp32).
 *  - Tiles are fixed (64 x 128); tile_rows, tile_cols and num_threads are
 *    CPU settings. Results are bitwise reproducible from run to run on one
 *    GPU (fixed work split, fixed-order reductions, no atomics) but are not
 *    bitwise equal to the CPU backend's.
 *  - Cost (tiles): the forward does 2 b c d FLOPs, the backward 8 b c d (dq
 *    and dk in two passes, each recomputing its logit tiles: every output
 *    row then has a single owner and needs no atomics). Panels: the forward
 *    2 b c d; the backward 6 b c d when dk's accumulator fits the dial, else
 *    8 b c d (a sweep for dq, one for dk), all in cuBLASLt GEMMs with fixed
 *    algorithms and fixed-order split-K, so also bitwise reproducible.
 *
 * Ring across ranks (options.comm != NULL; CPU tensors over the host
 * transport, CUDA tensors over NCCL -- "On CUDA tensors" below):
 *  The loss of one global batch spread over the world_size ranks of a
 *  flatmem_comm_t (<flatmem/comm.h>). Rank r passes ITS rows q_r (b_r x d)
 *  and ITS columns k_r (c_r x d); nobody holds the whole batch.
 *  - Global indices: row i of rank r is global row R_r + i, column j of rank
 *    r is global column C_r + j, where R_r = b_0 + ... + b_{r-1} and
 *    C_r = c_0 + ... + c_{r-1} (prefix sums in rank order). B = sum_r b_r,
 *    C = sum_r c_r. The loss is that of the concatenated batch
 *    q = [q_0; q_1; ...] (B x d), k = [k_0; k_1; ...] (C x d).
 *  - INFONCE: labels (b_r,) int64 are GLOBAL column indices in [0, C): a
 *    positive may live on any rank. Without labels row g's positive is
 *    column g (needs R_r + b_r <= C on every rank). b_r and c_r may differ
 *    from rank to rank.
 *  - SYMMETRIC: b_r = c_r on every rank (row g pairs with column g; the
 *    ranks may hold different counts).
 *  - loss: L of the global batch (the mean over the B rows; symmetric
 *    1/2 (mean row terms + mean column terms)), identical bits on every
 *    rank. row_lse (b_r,) and col_lse (c_r,) are the GLOBAL log-sum-exps of
 *    this rank's rows (over all C columns) and of its own columns (over all
 *    B rows): pass them back to the backward unchanged.
 *  - Backward: dq = g dL/dq_r (this rank's rows), dk = g dL/dk_r (this
 *    rank's columns), dlogit_scale = g dL/ds, identical on every rank, where
 *    L is the GLOBAL mean above. These are the exact gradients of L: nothing
 *    is summed over ranks. (The Inf-CL reference returns the sum over ranks
 *    of ds, N times this.) A data-parallel wrapper that AVERAGES parameter
 *    gradients over its N ranks (as DDP does) would divide the already
 *    global dq, dk and ds by N: pass dloss = N (or sum the parameter
 *    gradients over ranks instead of averaging them). One that sums them
 *    passes dloss = 1; do not sum ds over ranks, each rank already has it.
 *  - Every rank must pass the same loss, d, dtype, logit scale (bitwise),
 *    nonfinite policy, fp32_precision and, in the backward, the same dloss
 *    and dk-or-NULL.
 *    Each call starts with one small all-gather of these (and of each
 *    rank's shapes and the outcome of its own argument checks); a mismatch
 *    is FLATMEM_STATUS_INVALID_ARGUMENT on every rank naming the ranks and
 *    values ("logit_scale: rank 0 has 10, rank 2 has 20"); a rank whose
 *    arguments are refused fails with its own message and the others with
 *    its status naming it. Under FLATMEM_NONFINITE_ERROR a NaN/Inf on one
 *    rank fails every rank (FLATMEM_STATUS_NON_FINITE; that rank names the
 *    tensor, row and column, the others "rank 1 found a non-finite
 *    input").
 *  - Calls are collective: every rank calls forward (or backward) in the
 *    same order. The communicator must outlive the handle and is used by
 *    one thread at a time (the handle's calls are its users). Errors of the
 *    transport (TIMEOUT, PEER_FAILURE, COMM_POISONED) are the call's status,
 *    the message naming the step ("contrastive forward ring, step 2 of 4:
 *    column block from rank 1: ..."); any failure inside the ring poisons
 *    the communicator. Outputs are written only after every message has
 *    arrived: on error nothing the caller owns is written.
 *  - Workspace: workspace must be NULL and workspace_bytes 0 (else
 *    INVALID_ARGUMENT): the transit buffers depend on the other ranks'
 *    shapes, which a rank learns only inside the call, so the handle
 *    allocates them and keeps them (grown on demand, freed by destroy). The
 *    workspace_size queries return 0 for such a handle. Handle memory, rank
 *    r: 2 column blocks of max_s c_s x d in the input dtype, the row states
 *    (12 b_r bytes), thread scratch as in one process; symmetric forward 3
 *    column states (12 max_s c_s bytes each); backward dq in fp32 (4 b_r d)
 *    and, with dk, 3 fp32 blocks of max_s c_s x d (a fresh one and two
 *    partials in transit).
 *  - How: at step t = 0 .. n-1 rank r holds the column block of rank
 *    (r - t) mod n. It posts the send of that block to r + 1 and the
 *    receive of the next from r - 1, then computes (its rows) x (the block)
 *    while they travel (the communicator's progress thread moves them). The
 *    forward's column (max, sum) states travel with their blocks and reach
 *    their owner after the last step; in the backward the partial dk of a
 *    block travels one step behind it and ends at its owner. Blocks travel
 *    in the input dtype (bf16 features: half the bytes of fp32). The loss
 *    and ds are one all-reduce of a double each. Per step and rank the
 *    forward sends c d (input bytes) + 12 c bytes (symmetric) and the
 *    backward c d (input bytes) + 4 c + 4 c d (dk) bytes, c = the block's
 *    columns; compute per rank is 1/n of the single-process loss.
 *  - Determinism: bitwise reproducible for fixed ranks, shapes and options
 *    (every merge and sum runs in a fixed order). With one rank it gives
 *    the single-process results bit for bit; with more ranks the order of
 *    the sums differs, so results agree with one process to rounding.
 *  - On CUDA tensors (a library built with CUDA and NCCL): every rank calls
 *    flatmem_comm_init_device(comm, its device) once first, and passes
 *    tensors of that device (else INVALID_ARGUMENT naming options.comm or
 *    q; a build without NCCL: UNSUPPORTED). The same schedule runs with the
 *    CUDA tile kernels, on `stream`, computing each block while NCCL moves
 *    the next one on a transfer stream of the ring's own (ordered by
 *    events; one NCCL group per step, which every rank issues in the same
 *    order). The call is synchronous for the host: it waits for `stream` to
 *    reach it and reads logit_scale, dloss, logit_bias and the labels
 *    (they take part in the agreement; labels are checked on the host as
 *    above), and it waits once at its end, under the communicator's
 *    deadline, before writing the outputs (queued on `stream`). Handle
 *    memory on the GPU (cudaMalloc, kept and grown like the CPU's, freed
 *    by destroy), rank r, B' = max_s c_s: 2 column blocks (B' d, input
 *    dtype) when there are several ranks; forward 8 b_r (row states) +
 *    8 * 16 b_r (tile partials) + 12 b_r bytes, symmetric 3 column states
 *    (8 B' each) and 8 * 32 B' of tile partials; backward and sigmoid with
 *    dq an fp32 accumulator (4 b_r d), with dk 3 fp32 blocks (4 B' d
 *    each), the gradient passes' per-CTA slots (2 per SM, 64 x d fp32
 *    each), and O(b_r / 64) doubles of partial sums. Never a b_r x C
 *    buffer. Every result of one rank equals the single-device call's bit
 *    for bit (the one-rank ring still sends its relayed items to itself
 *    through NCCL). A failure fails the communicator and aborts its NCCL
 *    transport, so no transfer stays queued on `stream`. Not yet run on a
 *    GPU in flatmem's own tests (compiled only; scripts/gpu-check.sh runs
 *    tests/contrastive/gpu/test_gpu_ring.cpp where a GPU is lent).
 *
 * Threads (CPU): the handle owns num_threads - 1 worker threads (created by
 * flatmem_contrastive_create, joined by flatmem_contrastive_destroy); the
 * calling thread is the remaining one. Each tile's products run on the
 * thread that owns the tile, in flatmem's own kernels (no BLAS is linked or
 * called), so the host's BLAS settings and threads are never touched.
 */

typedef struct flatmem_contrastive_s flatmem_contrastive_t;

typedef enum flatmem_contrastive_loss {
  /** 0 selects the default, FLATMEM_CONTRASTIVE_SYMMETRIC. */
  FLATMEM_CONTRASTIVE_DEFAULT = 0,
  FLATMEM_CONTRASTIVE_SYMMETRIC = 1,
  FLATMEM_CONTRASTIVE_INFONCE = 2,
  /** The pairwise sigmoid (SigLIP) loss: flatmem_contrastive_sigmoid_*
   *  below, not flatmem_contrastive_forward / _backward. */
  FLATMEM_CONTRASTIVE_SIGMOID = 3,
  FLATMEM_CONTRASTIVE_LOSS_MAX = 0x7fffffff
} flatmem_contrastive_loss;

/** How fp32 values enter reduced-precision products: rounded ONCE to the
 *  product's format, or SPLIT in two parts of it (about full fp32). This is
 *  the one definition of the option; the bindings' "precision" arguments
 *  ("default", "round_once" or its alias "tf32", "full") link here.
 *  - CUDA: the fp32 inputs (and, in the backward, the recomputed G) on
 *    tensor cores: ROUND_ONCE = TF32, FULL = 3xTF32.
 *  - CPU at ISA level avx512bf16 or amx with bf16 q and k: the recomputed
 *    fp32 G, which meets the bf16 features in the bf16 products (see "bf16
 *    products on the CPU" below): ROUND_ONCE = G rounded once to bf16
 *    (bf16-accurate dq and dk, like the frameworks' bf16 autograd; the
 *    fastest), FULL = G split in two bf16 parts (about fp32 gradients). The
 *    loss and dlogit_scale do not depend on it.
 *  - Everywhere else the CPU multiplies in full fp32 and the option has no
 *    effect (any value is accepted). */
typedef enum flatmem_fp32_precision {
  /** 0: the default: ROUND_ONCE (TF32) on CUDA; FULL on the CPU. */
  FLATMEM_FP32_PRECISION_DEFAULT = 0,
  /** Rounded once. CUDA: TF32 products (10-bit mantissas, fp32
   *  accumulation): each logit errs by up to about 2^-10 * s * sum_t
   *  |q_it k_jt|. CPU bf16 path: G rounded once to bf16 (each entry off by
   *  up to 2^-8 of itself), the backward's two gradient products at the full
   *  bf16 rate. */
  FLATMEM_FP32_PRECISION_ROUND_ONCE = 1,
  /** The CUDA name of ROUND_ONCE (the same value, its first name). */
  FLATMEM_FP32_PRECISION_TF32 = 1,
  /** Split, about full fp32. CUDA: "3xTF32" (operands split in two TF32
   *  parts, three tensor-core products), about 3x the time of TF32. CPU
   *  bf16 path: G split in hi + lo = bf16(G) + bf16(G - hi) (residual at
   *  most 2^-16 |G|, below fp32 accumulation's n 2^-24 for n >= 256 terms),
   *  two bf16 products each, about the time of fp32 FMAs. */
  FLATMEM_FP32_PRECISION_FULL = 2,
  FLATMEM_FP32_PRECISION_MAX = 0x7fffffff
} flatmem_fp32_precision;

typedef struct flatmem_contrastive_options {
  /** sizeof(flatmem_contrastive_options) as the caller was compiled. */
  size_t struct_size;
  /** Which loss (0 = symmetric CLIP). */
  flatmem_contrastive_loss loss;
  /** CPU threads including the caller's (0 = all online processors,
   *  at most 256). */
  int32_t num_threads;
  /** Tile extent in rows of q / rows of k (0 = 512 each; 1..4096). Results
   *  depend on the tile extents (summation order), not on num_threads. */
  int32_t tile_rows;
  int32_t tile_cols;
  /** What NaN/Inf in q or k does (0 = FLATMEM_NONFINITE_ERROR; kDLCUDA
   *  tensors need FLATMEM_NONFINITE_PROPAGATE). */
  flatmem_nonfinite_policy nonfinite;
  /** Reserved (ABI 1 padding): set 0; see "Reserved fields" in flatmem.h. */
  int32_t reserved0;
  /** A flatmem_fp32_precision value (0 = FLATMEM_FP32_PRECISION_DEFAULT).
   *  64 bits wide: fields are appended 8-byte aligned (see "Conventions"). */
  int64_t fp32_precision;
  /** NULL: a single process (the loss of this call's q and k). Otherwise the
   *  communicator whose ranks share one global batch (see "Ring across
   *  ranks" above); it must outlive the handle. */
  flatmem_comm_t *comm;
  /** Bytes the handle may hold to keep logit tiles from the forward for the
   *  backward (0 = none, the default; see "Logit cache" below). CPU tensors
   *  only; must be 0 with a communicator. */
  size_t logit_cache_bytes;
} flatmem_contrastive_options;

#define FLATMEM_CONTRASTIVE_OPTIONS_INIT                                                  \
  { sizeof(flatmem_contrastive_options), FLATMEM_CONTRASTIVE_DEFAULT, 0, 0, 0,            \
    FLATMEM_NONFINITE_ERROR, 0, FLATMEM_FP32_PRECISION_DEFAULT, NULL, 0 }

/*
 * Logit cache (options.logit_cache_bytes), a memory/compute dial for the CPU
 * backend. Without it the backward recomputes every logit tile (8 b c d
 * FLOPs for forward + backward of the symmetric loss). With a budget of B
 * bytes the forward also keeps the raw tiles <q_i, k_j> (fp32) that fit in
 * B, in row-major tile order, and the next backward reads them instead of
 * recomputing: 8 b c d - 2 min(B / 4, b c) d FLOPs, down to 6 b c d at
 * B >= 4 b c (1 GiB for b = c = 16384; 64 MiB covers b = c = 4096).
 * Measured (symmetric, fp32, d = 512, 2-core AMD EPYC, docs/benchmarks/):
 * forward + backward at b = 16384 takes 4.40 s without the cache and 3.41 s
 * with B = 1 GiB (the backward 3.27 s -> 2.26 s); at b = 4096, 0.29 s -> 0.22 s
 * with B = 64 MiB.
 * The cache is the handle's own memory, allocated by the first forward that
 * uses it (min(B, 4 b c) bytes, kept and reused until the handle is
 * destroyed; never more than B): FLATMEM_STATUS_OUT_OF_MEMORY naming the
 * option when that allocation fails. It is not part of the workspace.
 * Results are bitwise identical with and without the cache: the cached tiles
 * are exactly the ones a recompute would produce. A backward uses them only
 * when its q and k have the same shapes, dtype and contents as the last
 * forward's (a 128-bit fingerprint of q and k taken by the forward, O(b d)
 * time, checked by the backward); otherwise, or after a failed forward, it
 * recomputes as without the cache. A call with kDLCUDA tensors neither
 * fills nor uses it (the CUDA backend always recomputes).
 */

/*
 * bf16 products on the CPU (CPU ISA level avx512bf16: AVX512_BF16, i.e. AMD
 * Zen 4 and later, Intel Cooper Lake, Sapphire Rapids and later; see
 * flatmem_cpu_isa). With bf16 q and k the three tile products run on
 * flatmem's own vdpbf16ps kernels on the bf16 rows in place, instead of
 * widening tiles to fp32 for sgemm (every other ISA level, and fp16 or fp32
 * inputs everywhere, keep sgemm):
 *  - logits <q_i, k_j>: exact bf16 x bf16 products added in fp32, the same
 *    error bound as before (gamma_d * sum_t |q_it k_jt|); the loss, row_lse
 *    and col_lse keep their fp32 accuracy, only the summation order changes.
 *  - dq = s G k and dk = s G^T q: G (fp32) enters as options.fp32_precision
 *    says: DEFAULT / FULL split in two bf16 parts (about fp32: an extra
 *    2^-16 + gamma_n times sum |s G_ij| |k_jt|), ROUND_ONCE (TF32) rounded
 *    once (an extra 2^-8 times the same sum: bf16-accurate gradients, like
 *    the frameworks' bf16 autograd; the fastest). ds is formed from fp32 G and is unchanged.
 *  - Denormal bf16 inputs and fp32 partial sums below 2^-126 are flushed to
 *    zero by the instruction (absolute error <= 2^-126 per term).
 *  - Everything else (log-sum-exp folds, the element-wise passes, the ring,
 *    the sigmoid loss's terms) is as on the other levels. Results are
 *    bitwise identical whatever the thread count and from run to run at one
 *    ISA; across ISA levels they differ within the bounds above.
 *  - Workspace: the same query at every level (for bf16 inputs the thread's
 *    16-bit scratch is the larger of the widened rows, (tile_rows +
 *    tile_cols) d floats, and the kernels' packing, about tile_rows *
 *    tile_cols + 32 max(d, tile_rows, tile_cols) 32-bit words).
 *  At ISA level amx the same three products run on AMX tiles under the
 *  same contract (exact bf16 products, fp32 sums, G as the option says).
 *  The reversible blocks' products are not covered (they stay fp32).
 */

/** Fill the struct_size bytes at options with the defaults, struct_size =
 *  struct_size (pass sizeof(*options); for languages that cannot expand the
 *  macro). Writes nothing on error. Thread-safe. */
FLATMEM_API flatmem_status flatmem_contrastive_options_init(flatmem_contrastive_options *options,
                                                            size_t struct_size);

/** Create a handle. options may be NULL (defaults). Allocates the handle and
 *  starts its worker threads. *out is set only on success. */
FLATMEM_API flatmem_status flatmem_contrastive_create(flatmem_contrastive_t **out,
                                                      const flatmem_contrastive_options *options);

/** Destroy a handle: joins its threads and frees its buffers. NULL is a
 *  no-op returning SUCCESS. */
FLATMEM_API flatmem_status flatmem_contrastive_destroy(flatmem_contrastive_t *handle);

/** Bytes of workspace flatmem_contrastive_forward needs for these shapes and
 *  dtypes. Reads only device, dtype, ndim and shape of q and k (their data may
 *  be NULL). Does not allocate. 0 for a handle with a communicator (the ring
 *  takes no workspace). */
FLATMEM_API flatmem_status flatmem_contrastive_forward_workspace_size(
    const flatmem_contrastive_t *handle, const DLTensor *q, const DLTensor *k, size_t *bytes);

/** Bytes of workspace flatmem_contrastive_backward needs. Reads only device,
 *  dtype, ndim and shape of q, k, dq and dk (data may be NULL; dq or dk may be
 *  NULL when that gradient will not be requested). Does not allocate. */
FLATMEM_API flatmem_status flatmem_contrastive_backward_workspace_size(
    const flatmem_contrastive_t *handle, const DLTensor *q, const DLTensor *k, const DLTensor *dq,
    const DLTensor *dk, size_t *bytes);
/* (The backward query too returns 0 for a handle with a communicator.) */

/**
 * Forward pass: the mean loss and the saved log-sum-exp vectors.
 *
 *   q            (b, d) fp32 | bf16 | fp16         row features
 *   k            (c, d) same dtype as q            column features
 *   labels       (b,) int64 in [0, c), or NULL     InfoNCE only
 *   logit_scale  one fp32 element, finite, > 0     s
 *   loss         one fp32 element (written)        L
 *   row_lse      (b,) fp32 (written)               LSE over columns per row
 *   col_lse      (c,) fp32 (written) for SYMMETRIC; must be NULL for INFONCE
 *
 * Allocates only when workspace is NULL (then into the handle's own buffer;
 * CPU tensors only). On kDLCUDA: enqueued on `stream`, returns at once.
 */
FLATMEM_API flatmem_status flatmem_contrastive_forward(
    flatmem_contrastive_t *handle, const DLTensor *q, const DLTensor *k, const DLTensor *labels,
    const DLTensor *logit_scale, DLTensor *loss, DLTensor *row_lse, DLTensor *col_lse,
    void *workspace, size_t workspace_bytes, void *stream);

/**
 * Backward pass: gradients of g * L (see the gradient convention above),
 * recomputing each logit tile once.
 *
 *   q, k, labels, logit_scale   as given to the forward
 *   row_lse, col_lse            as returned by the forward (col_lse NULL
 *                               for INFONCE); finite unless the handle's
 *                               policy is FLATMEM_NONFINITE_PROPAGATE
 *   dloss                       one fp32 element g, or NULL for g = 1
 *   dq            (b, d) fp32 or q's dtype (written), or NULL to skip
 *   dk            (c, d) fp32 or k's dtype (written), or NULL to skip
 *   dlogit_scale  one fp32 element, dL/ds (written), or NULL to skip
 *
 * At least one of dq, dk, dlogit_scale must be non-NULL. dq and dk are
 * overwritten, not accumulated into.
 */
FLATMEM_API flatmem_status flatmem_contrastive_backward(
    flatmem_contrastive_t *handle, const DLTensor *q, const DLTensor *k, const DLTensor *labels,
    const DLTensor *logit_scale, const DLTensor *row_lse, const DLTensor *col_lse,
    const DLTensor *dloss, DLTensor *dq, DLTensor *dk, DLTensor *dlogit_scale, void *workspace,
    size_t workspace_bytes, void *stream);

/* ------------------------------------------------------------------------ */
/* Sigmoid (SigLIP) loss: a handle created with loss = FLATMEM_CONTRASTIVE_SIGMOID */
/* ------------------------------------------------------------------------ */
/*
 * Row features q (b x d), column features k (c x d), logit scale s (finite,
 * > 0) and logit bias t (finite), both given by the caller (frameworks learn
 * log s and t; ds and dt are returned, a framework learning log s multiplies
 * ds by s). Logits x_ij = s <q_i, k_j> + t. With z_ij = +1 for the positive
 * pair of row i and -1 for every other pair:
 *
 *     L = -(1/b) sum_i sum_j log sigmoid(z_ij x_ij)        (b, c, d >= 1)
 *
 * the sum over all c columns of a row, the mean over the b rows (as SigLIP
 * normalises by the batch). Row i's positive is column y_i: y_i = i without
 * labels (then c >= b is required; c = b is the paper's case), else y_i from
 * an int64 label tensor (b,) with values in [0, c). Exactly one positive per
 * row.
 *
 * Numerically safe form: -log sigmoid(z x) = softplus(v), v = -z x,
 *     softplus(v) = max(v, 0) + log1p(exp(-|v|)),
 * and dL/dx_ij = -z_ij sigmoid(v_ij) / b with
 *     sigmoid(v) = 1 / (1 + e) for v >= 0, e / (1 + e) for v < 0, e = exp(-|v|),
 * so no exponential overflows and no 1 - sigmoid cancels, for any s (10..100
 * and beyond) and t (e.g. -10). Per-element terms are summed in double.
 *
 * Unlike the softmax losses, dL/dx_ij depends on x_ij alone (no row or column
 * normaliser): the value and every gradient come from ONE walk over the logit
 * tiles and no state is saved between calls. With G = dL/dx:
 *     dq = s G k,  dk = s G^T q,  ds = sum_ij G_ij <q_i, k_j>,  dt = sum_ij G_ij.
 *
 * Why separate functions rather than the existing forward / backward: those
 * have no place for the bias t and its gradient, and their saved log-sum-exp
 * vectors mean nothing here. A bias argument added to them would be NULL for
 * two of three losses and would change their ABI; new functions leave the
 * softmax entry points untouched. flatmem_contrastive_forward / _backward and
 * their workspace queries refuse a SIGMOID handle (INVALID_ARGUMENT naming
 * these functions), and these refuse a handle of another loss.
 *
 * The three paths (CPU; FLOPs of the tile products, the element-wise work is
 * O(b c)):
 *   value_and_grad  L and any of dq, dk, ds, dt: per tile one logit product
 *                   and the two gradient products, 6 b c d FLOPs in all (2
 *                   b c d less than forward + backward). Saves the whole
 *                   recompute; frameworks call it in their forward and scale
 *                   the gradients by the upstream gradient in their backward.
 *   forward         L only: 2 b c d FLOPs, no gradient buffers.
 *   backward        g * (dq, dk, ds, dt) for an upstream gradient g,
 *                   recomputing the logits: 6 b c d FLOPs (forward + backward
 *                   8 b c d). For callers that must free or not keep the
 *                   gradients between forward and backward.
 *
 * Dtypes, shapes, strides and determinism as for the softmax losses above:
 * q and k both fp32, bf16 or fp16 (fp32 accumulation); logit_scale,
 * logit_bias, loss, dloss, dlogit_scale, dlogit_bias one fp32 element each;
 * dq, dk fp32 or the input dtype (16-bit ones accumulated in fp32 in the
 * workspace, (b + c) d 4 bytes, rounded once). Results are bitwise identical
 * whatever the thread count (the same Latin-square tile schedule).
 *
 * Workspace (CPU): flatmem_contrastive_sigmoid_workspace_size gives the bytes
 * for the call with these dq / dk (NULL for the forward, or for a gradient not
 * requested): per thread one tile (tile_rows x tile_cols fp32) plus, for
 * 16-bit inputs, the widened rows (bf16: or the bf16 kernels' packing, when
 * larger); 3 doubles per row group; the 16-bit
 * gradient accumulators. workspace NULL: the handle's own buffer is used.
 *
 * CUDA tensors: as for the softmax losses ("CUDA tensors" above: device
 * tensors throughout, logit_bias and dloss included; PROPAGATE handles; a
 * device workspace of the queried size, never NULL; tensor-core products;
 * bitwise reproducible on one GPU, not bitwise equal to the CPU). A logit
 * bias that is not finite, like a bad s or label, makes the outputs NaN. Two
 * row-owned passes, no atomics: the row pass gives L, ds, dt and dq, the
 * column pass dk, each recomputing its logit tiles; value_and_grad and
 * backward with dq and dk do 8 b c d FLOPs (4 b c d with one of them, 2 b c d
 * for the forward or the scalars alone). Workspace: with dq or dk the
 * backward's accumulator tiles (above), and always 3 doubles per 64 rows of
 * max(b, c) (per-row-tile partial sums). The CUDA path is compiled wherever
 * nvcc is found and tested only on machines with a GPU (ctest -L gpu).
 *
 * Ring across ranks (options.comm != NULL; CPU or CUDA tensors): the same four
 * functions, collective, on the global batch exactly as "Ring across ranks"
 * above says for INFONCE: rank r passes its rows q_r (b_r x d) and its
 * columns k_r (c_r x d); labels are GLOBAL column indices in [0, C), and
 * without labels global row g's positive is global column g (needs
 * R_r + b_r <= C on every rank; b_r and c_r may differ). L is the mean over
 * the B global rows; loss, dlogit_scale and dlogit_bias are identical bits on
 * every rank, dq and dk are this rank's rows and columns of the exact
 * gradient of the global L (nothing to sum over ranks; a wrapper that
 * averages parameter gradients over N ranks passes dloss = N, as above).
 * One pass round the ring computes everything asked for: at step t rank r
 * holds the column block of rank (r - t) mod n, sends it on to r + 1 while it
 * computes (its rows) x (that block), adds s G k into its dq, and adds its
 * share of that block's dk to the partial dk that arrived from r - 1 before
 * sending it on (it reaches the block's owner after the last step); one
 * all-reduce of three doubles gives L, ds and dt. Per step: 2 b_r c_o d
 * FLOPs (forward) or 6 b_r c_o d (value_and_grad, backward); messages: the
 * column blocks in the input dtype and, with dk, the fp32 partial dk blocks.
 * Every rank must pass the same d, dtype, logit_scale and logit_bias
 * (bitwise), nonfinite policy, dloss (backward), and the same choice of NULL
 * or a tensor for loss, dk, dlogit_scale and dlogit_bias (these are summed
 * or delivered across ranks; dq may differ). Mismatches, refused arguments,
 * non-finite inputs and transport errors fail every rank as above; outputs
 * are written only after every message has arrived. workspace must be NULL
 * (0 bytes) and the workspace query returns 0: the handle keeps 2 column
 * blocks (max_s c_s x d, input dtype), and with dq 4 b_r d bytes, with dk 3
 * fp32 blocks of max_s c_s x d. flatmem_contrastive_ring_stats_get reports
 * the last sigmoid_forward (or value_and_grad with only the loss) as the
 * forward and a call with gradients as the backward.
 *
 * The ring on kDLCUDA tensors: as "On CUDA tensors" above (the sigmoid ring
 * keeps, with dq, an fp32 accumulator of 4 b_r d bytes and, with dk, 3 fp32
 * blocks of max_s c_s x d on the GPU).
 *
 * Not supported (FLATMEM_STATUS_UNSUPPORTED with a message, never a wrong
 * answer): the logit cache (options.logit_cache_bytes != 0, refused at
 * create): value_and_grad never recomputes a tile, so there is nothing to
 * cache.
 */

/** Workspace bytes of the sigmoid calls: dq, dk as they will be passed (both
 *  NULL for flatmem_contrastive_sigmoid_forward). Reads only metadata. */
FLATMEM_API flatmem_status flatmem_contrastive_sigmoid_workspace_size(
    const flatmem_contrastive_t *handle, const DLTensor *q, const DLTensor *k, const DLTensor *dq,
    const DLTensor *dk, size_t *bytes);

/**
 * The loss L alone (2 b c d FLOPs).
 *
 *   q, k         (b, d), (c, d) fp32 | bf16 | fp16 (same dtype)
 *   labels       (b,) int64 in [0, c), or NULL (y_i = i, needs c >= b)
 *   logit_scale  one fp32 element s, finite, > 0
 *   logit_bias   one fp32 element t, finite
 *   loss         one fp32 element (written)
 */
FLATMEM_API flatmem_status flatmem_contrastive_sigmoid_forward(
    flatmem_contrastive_t *handle, const DLTensor *q, const DLTensor *k, const DLTensor *labels,
    const DLTensor *logit_scale, const DLTensor *logit_bias, DLTensor *loss, void *workspace,
    size_t workspace_bytes, void *stream);

/**
 * The loss and its gradients in one tile walk (6 b c d FLOPs).
 *
 *   loss          one fp32 element L (written), or NULL
 *   dq            (b, d) fp32 or q's dtype: dL/dq (written), or NULL
 *   dk            (c, d) fp32 or k's dtype: dL/dk (written), or NULL
 *   dlogit_scale  one fp32 element dL/ds (written), or NULL
 *   dlogit_bias   one fp32 element dL/dt (written), or NULL
 * At least one output must be non-NULL. dq and dk are overwritten.
 */
FLATMEM_API flatmem_status flatmem_contrastive_sigmoid_value_and_grad(
    flatmem_contrastive_t *handle, const DLTensor *q, const DLTensor *k, const DLTensor *labels,
    const DLTensor *logit_scale, const DLTensor *logit_bias, DLTensor *loss, DLTensor *dq,
    DLTensor *dk, DLTensor *dlogit_scale, DLTensor *dlogit_bias, void *workspace,
    size_t workspace_bytes, void *stream);

/**
 * Gradients of g * L, recomputing the logits (6 b c d FLOPs): as
 * value_and_grad without the loss, every gradient times g.
 *
 *   dloss         one fp32 element g (finite under FLATMEM_NONFINITE_ERROR),
 *                 or NULL for g = 1
 *   dq, dk, dlogit_scale, dlogit_bias   as in value_and_grad (one non-NULL)
 */
FLATMEM_API flatmem_status flatmem_contrastive_sigmoid_backward(
    flatmem_contrastive_t *handle, const DLTensor *q, const DLTensor *k, const DLTensor *labels,
    const DLTensor *logit_scale, const DLTensor *logit_bias, const DLTensor *dloss, DLTensor *dq,
    DLTensor *dk, DLTensor *dlogit_scale, DLTensor *dlogit_bias, void *workspace,
    size_t workspace_bytes, void *stream);

#ifdef FLATMEM_EXPERIMENTAL
/** What the last ring call of a handle measured on this rank (experimental:
 *  for benchmarks; the fields may change). */
typedef struct flatmem_contrastive_ring_stats {
  /** Ring payload this rank sent (column blocks, column states or col_lse,
   *  partial dk); the metadata all-gather and the one-double all-reduces
   *  are not counted. */
  uint64_t bytes_sent;
  uint64_t messages_sent;
  /** Seconds this rank was blocked waiting for ring messages: the transfer
   *  time compute did not hide. */
  double wait_seconds;
  /** Seconds of the whole call. */
  double seconds;
  int32_t steps;
  /** Reserved (ABI 1 padding): written 0. */
  int32_t reserved0;
} flatmem_contrastive_ring_stats;

/** backward = 0: the last ring forward; 1: the last ring backward. A handle
 *  without a communicator reports zeros. stats_size = sizeof(*stats). */
FLATMEM_API flatmem_status flatmem_contrastive_ring_stats_get(const flatmem_contrastive_t *handle,
                                                              int32_t backward,
                                                              flatmem_contrastive_ring_stats *stats,
                                                              size_t stats_size);
#endif

#ifdef __cplusplus
} /* extern "C" */
#endif

/* Reversible segments and built-in transformer blocks. */
#include <flatmem/reversible.h>
/* Communicators over UCX (host) and NCCL (device). */
#include <flatmem/comm.h>
/* Cyclic data parallelism over a communicator. */
#include <flatmem/cyclic.h>
/* Stage-parallel cyclic training (one rank per stage). */
#include <flatmem/cyclic_stages.h>

#endif /* FLATMEM_FLATMEM_H */
