"""flatmem for JAX, through XLA FFI custom calls: the tiled contrastive loss
and reversible segments of flatmem's built-in transformer blocks.

    import jax, jax.numpy as jnp
    from flatmem_jax import clip_loss, infonce_loss, reversible_transformer

    loss = clip_loss(q, k, logit_scale)                    # symmetric CLIP, q and k (b, d)
    loss = infonce_loss(q, k, logit_scale, labels=None)    # rows -> columns, k (c, d)
    loss = sigmoid_loss(q, k, logit_scale, logit_bias)     # SigLIP's pairwise sigmoid loss
    dq, dk, ds = jax.grad(clip_loss, argnums=(0, 1, 2))(q, k, logit_scale)
    loss = clip_loss(q, k, logit_scale, logit_cache_bytes=4 * b * b)   # a logit cache, below
    loss = clip_loss(q, k, logit_scale, precision="tf32")  # options.fp32_precision, below
    y1, y2 = reversible_transformer(x1, x2, params, heads=4)   # see its docstring
    comm = flatmem_jax.ring.initialize()                   # one process per rank: flatmem_jax.ring
    loss = clip_loss(q_r, k_r, logit_scale, comm=comm)     # this rank's shard of a global batch

(What follows is about the losses; reversible_transformer's docstring covers it,
and sigmoid_loss's docstring the sigmoid loss, whose custom VJP differs: its
value and gradients come from one tile walk, so its forward under
differentiation saves the gradients themselves.)

Both are ``jax.custom_vjp`` functions over flatmem's C ABI: the forward saves
only the log-sum-exp vectors (row_lse, and col_lse for CLIP) besides q, k and
the scale, and the backward recomputes the logit tiles; the b x c logit matrix
is never stored. They work eagerly and under ``jax.jit``, ``jax.grad`` and
``jax.vmap``.

Arguments
    q, k         (b, d) and (c, d), both float32, bfloat16 or float16. The loss
                 is float32 (products are accumulated in fp32); the gradients
                 of q and k have their dtype.
    logit_scale  s > 0 (the scale itself, not its logarithm), one element,
                 converted to a float32 0-d array; differentiable.
    labels       InfoNCE only: integer (b,) in [0, c), or None for labels
                 0..b-1 (then c >= b). Not differentiable.
    logit_cache_bytes
                 keyword, static (a Python int below 2**63, not traced),
                 default 0: a memory/compute dial (flatmem.h, "Logit
                 cache"). The forward keeps the raw logit tiles <q_i, k_j>
                 (fp32) that fit in this many bytes inside its flatmem
                 handle, and the backward reads them instead of
                 recomputing: forward + backward take
                 8 b c d - 2 min(bytes / 4, b c) d FLOPs instead of 8 b c d,
                 i.e. 6 b c d at 4 b c bytes (64 MiB for b = c = 4096). The
                 values and gradients are bitwise the same with and without
                 it. Memory: min(bytes, 4 b c) bytes per pooled handle of
                 that budget, outside XLA's buffers, held until the process
                 exits (see "Handles"). CPU only; under XLA:CUDA it is
                 accepted and ignored (flatmem's CUDA backend recomputes).
    precision    keyword, static, "default" (default), "tf32" or "full"
                 (anything else: ValueError at trace time): the handle's
                 options.fp32_precision (flatmem.h, flatmem_fp32_precision),
                 for clip_loss, infonce_loss and sigmoid_loss, with or
                 without comm. CUDA: float32 inputs multiply as TF32
                 ("default", "tf32") or in about full fp32 ("full": 3xTF32,
                 about 3x the tensor-core time). CPU at ISA level avx512bf16
                 or amx (bf16 tile products) with bfloat16 q and k: how the
                 fp32 gradient matrix G enters the backward products
                 dq = s G k, dk = s G^T q -- "default" and "full" split G in
                 two bf16 parts (about fp32 gradients), "tf32" rounds it once
                 to bf16 (bf16-accurate gradients, the fastest); the loss and
                 the scale's gradient do not change.
                 Anywhere else on the CPU (other ISA levels, float32 /
                 float16 inputs) it has no effect: the same bits as
                 "default".

Across processes
    With comm=RingComm (flatmem_jax.ring.initialize()), clip_loss,
    infonce_loss and sigmoid_loss compute the loss of ONE global batch spread
    over processes, each passing its shard, through flatmem's ring; the
    gradients are this rank's rows of the exact gradients of the global mean,
    the scale's (and the sigmoid loss's bias') gradient the global one on
    every rank. Collective; CPU only. See
    flatmem_jax.ring's docstring.

Differentiation
    Reverse mode, first order (jax.grad, jax.vjp). Forward mode (jax.jvp,
    jacfwd, hessian) and gradients of gradients raise JAX's errors.

vmap
    Every custom call is made with ``vmap_method="sequential"``: under
    ``jax.vmap`` XLA runs one flatmem call per batch element, in a loop.
    Results equal the per-element calls exactly (flatmem is deterministic).

Errors
    Shape and dtype errors that flatmem's workspace query sees (wrong dtypes,
    mismatched d, c != b for CLIP, ...) raise ``FlatmemError`` when the
    function is traced. Errors only the computation sees (labels out of range,
    NaN/Inf in q or k, a non-positive scale) come from XLA when it runs: a
    ``jax.errors.JaxRuntimeError`` (or a ``ValueError`` when it surfaces while
    a result is read) whose text holds flatmem's status and message, e.g.
    "INVALID_ARGUMENT: flatmem_contrastive_forward: FLATMEM_STATUS_INVALID_ARGUMENT:
    labels: labels[2] = 9 is outside [0, c = 4)".

Handles
    Each custom call borrows a flatmem handle from a process-wide pool kept
    per (loss, platform, logit_cache_bytes, precision): calls with different
    budgets or precisions never share one, and each one in use costs its own
    handle (worker threads, and the cache once filled). The backward takes
    the handle whose last forward read its q and k, so a forward followed by
    its backward -- one training step under
    ``jax.jit(jax.value_and_grad(...))``, or eager calls -- reads the cached
    tiles. A backward that finds another forward's tiles there (two cached
    losses interleaved in one step, or the loop of ``jax.vmap``: only the
    last forward's tiles survive) recomputes instead: correct, only without
    the saving (flatmem checks a fingerprint of q and k).

Platforms
    CPU, and CUDA when libflatmem_jax.so was built with nvcc (``has_cuda``):
    the CUDA handlers hand XLA's device buffers and stream to flatmem (run
    on an H200 under XLA:GPU: tests/gpu_check.py). A flatmem built without
    CUDA refuses them: XLA's
    UNIMPLEMENTED error carrying flatmem's FLATMEM_STATUS_UNSUPPORTED message.

The handler library
    libflatmem_jax.so (bindings/jax/CMakeLists.txt; `pip install
    --no-build-isolation bindings/jax` builds it and puts it in this package)
    is loaded from the path in the environment variable FLATMEM_JAX_LIBRARY;
    without it, from this package's folder; then by the dynamic loader's own
    search. It links the
    installed libflatmem through its RUNPATH. FLATMEM_JAX_NUM_THREADS (read
    once, when the first call runs) sets the CPU threads of each flatmem call
    (default: all online processors).
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np

from flatmem._header import NAMES as _NAMES
from flatmem._options import c_integer, c_type, enum_value, precision_value

__all__ = ["clip_loss", "infonce_loss", "sigmoid_loss", "reversible_transformer", "FlatmemError", "has_cuda",
           "library_path", "RingComm", "ring"]
__version__ = "0.2.0"

# The header's values by name (flatmem/_header.py, generated from include/flatmem/*.h and checked
# against them by ctest bindings/header_tables; flatmem._options translates option names with it).
_LOSSES = _NAMES["flatmem_contrastive_loss"]
_SYMMETRIC, _INFONCE, _SIGMOID = _LOSSES["symmetric"], _LOSSES["infonce"], _LOSSES["sigmoid"]
# DLPack type codes (dlpack.h): what the workspace query is told q and k are.
_DL_INT, _DL_UINT, _DL_FLOAT, _DL_BFLOAT, _DL_COMPLEX = 0, 1, 2, 4, 5


class FlatmemError(ValueError):
    """flatmem refused the shapes or dtypes of a call while it was traced.

    ``status`` is flatmem's status name (e.g. "FLATMEM_STATUS_INVALID_ARGUMENT");
    the message is flatmem's, naming the argument and what was expected.
    """

    def __init__(self, status: str, message: str):
        super().__init__(f"{status}: {message}")
        self.status = status


# ---------------------------------------------------------------------------
# Loading libflatmem_jax.so and registering its handlers
# ---------------------------------------------------------------------------


def _library_path():
    env = os.environ.get("FLATMEM_JAX_LIBRARY")
    if env:
        return env
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "libflatmem_jax.so")
    return here if os.path.exists(here) else "libflatmem_jax.so"


def _load_library():
    path = _library_path()
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        raise ImportError(
            f"flatmem_jax: cannot load the handler library {path!r} ({e}); install the "
            "package with it (PKG_CONFIG_PATH=PREFIX/lib/pkgconfig pip install "
            "--no-build-isolation bindings/jax), or build it with bindings/jax/CMakeLists.txt "
            "and point FLATMEM_JAX_LIBRARY at libflatmem_jax.so") from e
    header, loaded = lib.flatmem_jax_header_version(), lib.flatmem_jax_library_version()
    # Same major (the ABI), and a library at least as new as the header compiled against.
    if loaded // 10000 != header // 10000 or loaded < header:
        raise ImportError(
            f"flatmem_jax: {path} was compiled against flatmem {header} but loads "
            f"libflatmem {loaded}; rebuild it against the installed flatmem")
    lib.flatmem_jax_workspace_size.restype = ctypes.c_int
    lib.flatmem_jax_workspace_size.argtypes = [
        ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64,
        ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64,
        ctypes.POINTER(ctypes.c_size_t), ctypes.c_char_p, ctypes.c_size_t]
    lib.flatmem_jax_contrastive_pool_stats.restype = None
    lib.flatmem_jax_contrastive_pool_stats.argtypes = [ctypes.POINTER(ctypes.c_int64)] * 3
    return lib, path


def _check_num_threads_setting():
    # libflatmem_jax reads it when the first call runs; flatmem checks the range.
    # (the pattern is what the library's strtol accepts as a whole)
    text = os.environ.get("FLATMEM_JAX_NUM_THREADS", "")
    if text and not re.fullmatch(r"\s*[+-]?[0-9]+", text):
        raise ImportError(
            f"flatmem_jax: FLATMEM_JAX_NUM_THREADS={text!r} is not an integer "
            "(0 or unset: all online processors)")


_check_num_threads_setting()
if sys.byteorder != "little":  # labels travel as (low, high) int32 word pairs
    raise ImportError("flatmem_jax: needs a little-endian machine")

_lib, library_path = _load_library()
has_cuda: bool = bool(_lib.flatmem_jax_has_cuda())

# XLA target name -> exported symbol stem (the symbol adds _cpu / _cuda).
_TARGETS = {
    "flatmem_clip_forward": "flatmem_jax_clip_forward",
    "flatmem_clip_backward": "flatmem_jax_clip_backward",
    "flatmem_infonce_forward": "flatmem_jax_infonce_forward",
    "flatmem_infonce_backward": "flatmem_jax_infonce_backward",
    "flatmem_sigmoid_forward": "flatmem_jax_sigmoid_forward",
    "flatmem_sigmoid_value_and_grad": "flatmem_jax_sigmoid_value_and_grad",
    "flatmem_sigmoid_backward": "flatmem_jax_sigmoid_backward",
    "flatmem_reversible_forward": "flatmem_jax_reversible_forward",
    "flatmem_reversible_backward": "flatmem_jax_reversible_backward",
    "flatmem_ring_clip_forward": "flatmem_jax_ring_clip_forward",
    "flatmem_ring_clip_backward": "flatmem_jax_ring_clip_backward",
    "flatmem_ring_infonce_forward": "flatmem_jax_ring_infonce_forward",
    "flatmem_ring_infonce_backward": "flatmem_jax_ring_infonce_backward",
    "flatmem_ring_sigmoid_forward": "flatmem_jax_ring_sigmoid_forward",
    "flatmem_ring_sigmoid_value_and_grad": "flatmem_jax_ring_sigmoid_value_and_grad",
    "flatmem_ring_sigmoid_backward": "flatmem_jax_ring_sigmoid_backward",
    "flatmem_ring_all_reduce": "flatmem_jax_ring_all_reduce",
}
for _name, _symbol in _TARGETS.items():
    jax.ffi.register_ffi_target(
        _name, jax.ffi.pycapsule(getattr(_lib, _symbol + "_cpu")), platform="cpu")
    if has_cuda:
        jax.ffi.register_ffi_target(
            _name, jax.ffi.pycapsule(getattr(_lib, _symbol + "_cuda")), platform="CUDA")


# ---------------------------------------------------------------------------
# Trace-time helpers
# ---------------------------------------------------------------------------


def _dlpack_type(dtype) -> tuple[int, int]:
    dtype = np.dtype(dtype)
    if dtype == jnp.bfloat16:
        return _DL_BFLOAT, 16
    kind = {"f": _DL_FLOAT, "i": _DL_INT, "u": _DL_UINT, "c": _DL_COMPLEX}.get(dtype.kind)
    if kind is None:
        raise TypeError(f"flatmem_jax: q and k must be float32, bfloat16 or float16, not {dtype}")
    return kind, dtype.itemsize * 8


@functools.lru_cache(maxsize=256)
def _workspace_bytes(loss: int, backward: bool, q_dtype, q_shape, k_dtype, k_shape) -> int:
    """Bytes of workspace the CPU handler needs (flatmem's own query)."""
    size = ctypes.c_size_t(0)
    message = ctypes.create_string_buffer(1024)
    status = _lib.flatmem_jax_workspace_size(
        loss, int(backward), *_dlpack_type(q_dtype), *q_shape, *_dlpack_type(k_dtype), *k_shape,
        ctypes.byref(size), message, len(message))
    if status != 0:
        name, _, text = message.value.decode(errors="replace").partition(": ")
        raise FlatmemError(name, text)
    return size.value


def _features(q, k):
    q, k = jnp.asarray(q), jnp.asarray(k)
    for name, x in (("q", q), ("k", k)):
        if x.ndim != 2:
            raise ValueError(f"flatmem_jax: {name} must be 2-D (rows, d), got shape {x.shape}")
    return q, k


def _scalar(x, name):
    """A one-element argument (logit_scale, logit_bias) as the float32 0-d
    array the handlers take."""
    x = jnp.asarray(x, dtype=jnp.float32)
    if x.size != 1:
        raise ValueError(f"flatmem_jax: {name} must have one element, got shape {x.shape}")
    return x.reshape(())


def _scale(logit_scale):
    return _scalar(logit_scale, "logit_scale")


def _cache_budget(logit_cache_bytes) -> int:
    """logit_cache_bytes as the u64 attribute the handlers take: a static
    integer in [0, 2**63), else TypeError / ValueError (at trace time). JAX
    cannot lower a u64 attribute of 2**63 or more; no budget needs one (the
    cache never exceeds 4 b c bytes)."""
    return c_integer(logit_cache_bytes, "logit_cache_bytes",
                     c_type("flatmem_contrastive_options", "logit_cache_bytes"), limit=2**63, unit="bytes",
                     note=" (it must be a static Python integer, below 2**63; 0 = no cache)")


def _pool_stats():
    """(handles, cached_backwards, cached_backwards_on_forward_handle): the
    contrastive handle pool's counters (flatmem_jax.h), for tests."""
    values = [ctypes.c_int64(0) for _ in range(3)]
    _lib.flatmem_jax_contrastive_pool_stats(*(ctypes.byref(v) for v in values))
    return tuple(v.value for v in values)


def _labels_operand(labels):
    """labels as the handlers take them: int64 (b,) when x64 is on, else the
    int32 (b, 2) pairs (low word, sign-extended high word) that are the same
    bytes as an int64 vector on a little-endian machine."""
    labels = jnp.asarray(labels)
    if not jnp.issubdtype(labels.dtype, jnp.integer):
        raise TypeError(f"flatmem_jax: labels must be integers, not {labels.dtype}")
    if labels.ndim != 1:
        raise ValueError(f"flatmem_jax: labels must be 1-D (b,), got shape {labels.shape}")
    if jax.config.jax_enable_x64:
        return labels.astype(jnp.int64)
    low = labels.astype(jnp.int32)
    high = jnp.where(low < 0, -1, 0).astype(jnp.int32)
    return jnp.stack([low, high], axis=-1)


def _call(target: str, results, operands, workspace_bytes, attributes):
    """One custom call: on CPU with the workspace as an extra (dropped) result
    when workspace_bytes is not None (the ring handlers take none), on CUDA
    without (the handler takes XLA's scratch memory); both with the same
    attributes (the CUDA handlers ignore logit_cache_bytes)."""

    def cpu(*ops):
        if workspace_bytes is None:
            return tuple(jax.ffi.ffi_call(target, list(results), vmap_method="sequential")(
                *ops, **attributes))
        shapes = list(results) + [jax.ShapeDtypeStruct((workspace_bytes,), jnp.uint8)]
        out = jax.ffi.ffi_call(target, shapes, vmap_method="sequential")(*ops, **attributes)
        return tuple(out[:-1])

    def cuda(*ops):
        call = jax.ffi.ffi_call(target, list(results), vmap_method="sequential")
        return tuple(call(*ops, **attributes))

    if not has_cuda:
        return cpu(*operands)
    return jax.lax.platform_dependent(*operands, cpu=cpu, cuda=cuda)


# ---------------------------------------------------------------------------
# Forward, backward and the custom VJP
# ---------------------------------------------------------------------------

_F32 = jnp.float32


class _Site(tuple):
    """Where a loss runs (static, hashable): (logit_cache_bytes, comm_slot,
    fp32_precision). comm_slot None: this process alone, a pooled handle with
    that cache budget; otherwise the ring across the ranks of the
    communicator in that registry slot (ring.py), which takes no workspace
    and no cache. fp32_precision: the handle's options.fp32_precision (a
    flatmem_fp32_precision value, flatmem._options.precision_value), either way."""

    cache_bytes = property(lambda self: self[0])
    comm = property(lambda self: self[1])
    precision = property(lambda self: self[2])

    def call(self, name, results, operands, workspace):
        """The custom call `name` (e.g. "clip_forward") of this site;
        workspace() gives the CPU workspace bytes of the single-process one."""
        precision = np.int64(self.precision)
        if self.comm is None:
            return _call(f"flatmem_{name}", results, operands, workspace(),
                         dict(logit_cache_bytes=np.uint64(self.cache_bytes), fp32_precision=precision))
        return _call(f"flatmem_ring_{name}", results, operands, None,
                     dict(comm=np.int64(self.comm), fp32_precision=precision))


def _forward(loss, site, q, k, s, labels):
    b, c = q.shape[0], k.shape[0]
    results = [jax.ShapeDtypeStruct((), _F32), jax.ShapeDtypeStruct((b,), _F32)]
    if loss == _SYMMETRIC:
        results.append(jax.ShapeDtypeStruct((c,), _F32))
    name = "clip_forward" if loss == _SYMMETRIC else "infonce_forward"
    operands = (q, k, s) if labels is None else (q, k, s, labels)
    out = site.call(name, results, operands,
                    lambda: _workspace_bytes(loss, False, q.dtype, q.shape, k.dtype, k.shape))
    return out[0], out[1], (out[2] if loss == _SYMMETRIC else None)


def _backward(loss, site, q, k, s, labels, row_lse, col_lse, g):
    results = [jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct(k.shape, k.dtype),
               jax.ShapeDtypeStruct((), _F32)]
    g = jnp.asarray(g, _F32).reshape(())
    if loss == _SYMMETRIC:
        name, operands = "clip_backward", (q, k, s, row_lse, col_lse, g)
    else:
        name, operands = "infonce_backward", (q, k, s, row_lse, g)
    if labels is not None:
        operands += (labels,)
    dq, dk, ds = site.call(name, results, operands,
                           lambda: _workspace_bytes(loss, True, q.dtype, q.shape, k.dtype, k.shape))
    return dq, dk, ds


# loss and site are static: a Python int and a _Site that select the custom
# call and its attribute.
@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _contrastive(loss, site, q, k, s, labels):
    return _forward(loss, site, q, k, s, labels)[0]


def _contrastive_fwd(loss, site, q, k, s, labels):
    value, row_lse, col_lse = _forward(loss, site, q, k, s, labels)
    return value, (q, k, s, labels, row_lse, col_lse)


def _contrastive_bwd(loss, site, residuals, g):
    q, k, s, labels, row_lse, col_lse = residuals
    dq, dk, ds = _backward(loss, site, q, k, s, labels, row_lse, col_lse, g)
    return dq, dk, ds, None  # labels: integers, no cotangent


_contrastive.defvjp(_contrastive_fwd, _contrastive_bwd)


def _site(logit_cache_bytes, comm, precision="default") -> _Site:
    """The _Site of a call's keywords (checked at trace time)."""
    cache = _cache_budget(logit_cache_bytes)
    fp32_precision = precision_value(precision)
    if comm is None:
        return _Site((cache, None, fp32_precision))
    if not isinstance(comm, RingComm):
        raise TypeError(f"flatmem_jax: comm must be a flatmem_jax.RingComm (from "
                        f"flatmem_jax.ring.initialize) or None, not {type(comm).__name__}")
    if cache != 0:
        raise ValueError("flatmem_jax: logit_cache_bytes must be 0 with comm: flatmem's ring "
                         "keeps no logit cache (flatmem.h, options.logit_cache_bytes)")
    return _Site((0, comm.slot, fp32_precision))


def clip_loss(q, k, logit_scale, *, logit_cache_bytes=0, comm=None, precision="default"):
    """Symmetric CLIP loss of row features q (b, d) and column features k (b, d):

        L = 1/2 [ mean_i (LSE_j s<q_i,k_j> - s<q_i,k_i>) + mean_j (LSE_i s<q_i,k_j> - s<q_j,k_j>) ]

    Returns a float32 scalar; differentiable in q, k and logit_scale.
    logit_cache_bytes (static int, default 0 = off): bytes of logit tiles the
    forward keeps for the backward -- 6 b^2 d instead of 8 b^2 d FLOPs for
    forward + backward at 4 b^2 bytes, bitwise the same results, CPU only;
    see the module's docstring.
    comm (a RingComm, default None): the loss of the GLOBAL batch spread over
    the communicator's ranks -- this rank passes its b_r pairs, q and k
    (b_r, d), and gets L of the concatenated batch (rank order), its rows'
    dq and dk and the global ds (see flatmem_jax.ring). Collective.
    precision (static, "default" | "tf32" | "full"; anything else:
    ValueError): options.fp32_precision -- CUDA: TF32 or 3xTF32 products for
    float32 inputs; CPU at ISA level avx512bf16 or amx with bfloat16 inputs:
    "tf32" rounds the gradient matrix G once to bf16 in the backward's products
    (bf16-accurate dq, dk, the fastest) where "default" / "full" split it in
    two bf16 parts (about fp32 gradients); no effect elsewhere on the CPU.
    See the module's docstring.
    """
    q, k = _features(q, k)
    return _contrastive(_SYMMETRIC, _site(logit_cache_bytes, comm, precision), q, k,
                        _scale(logit_scale), None)


def infonce_loss(q, k, logit_scale, labels=None, *, logit_cache_bytes=0, comm=None,
                 precision="default"):
    """InfoNCE loss of rows q (b, d) against columns k (c, d), c >= b allowed:

        L = mean_i (LSE_j s<q_i,k_j> - s<q_i,k_{y_i}>),   y = labels or 0..b-1

    Returns a float32 scalar; differentiable in q, k and logit_scale.
    logit_cache_bytes (static int, default 0 = off): bytes of logit tiles the
    forward keeps for the backward -- 6 b c d instead of 8 b c d FLOPs for
    forward + backward at 4 b c bytes, bitwise the same results, CPU only;
    see the module's docstring.
    comm (a RingComm, default None): the loss of the GLOBAL batch spread over
    the communicator's ranks -- this rank passes its rows q (b_r, d) and its
    columns k (c_r, d); labels (b_r,) are then GLOBAL column indices in
    [0, C), C = sum of c_r, and may point at any rank's columns (None: row g
    of the global batch pairs with column g). See flatmem_jax.ring.
    Collective.
    precision (static, "default" | "tf32" | "full"): options.fp32_precision,
    as for clip_loss.
    """
    q, k = _features(q, k)
    labels = None if labels is None else _labels_operand(labels)
    return _contrastive(_INFONCE, _site(logit_cache_bytes, comm, precision), q, k,
                        _scale(logit_scale), labels)


# ---------------------------------------------------------------------------
# The sigmoid (SigLIP) loss
# ---------------------------------------------------------------------------


def _sigmoid_call(site, stage, q, k, s, t, labels, g=None):
    """One custom call of the sigmoid loss: stage "forward" -> (loss,),
    "value_and_grad" -> (loss, dq, dk, ds, dt), "backward" (g) -> (dq, dk,
    ds, dt) of g L (flatmem.h, "Sigmoid (SigLIP) loss")."""
    scalar = jax.ShapeDtypeStruct((), _F32)
    grads = [jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct(k.shape, k.dtype),
             scalar, scalar]
    results = {"forward": [scalar], "value_and_grad": [scalar] + grads, "backward": grads}[stage]
    operands = (q, k, s, t)
    if stage == "backward":
        operands += (jnp.asarray(g, _F32).reshape(()),)
    if labels is not None:
        operands += (labels,)
    # value_and_grad and backward take the same workspace (dq, dk in the input dtypes).
    return site.call(f"sigmoid_{stage}", results, operands,
                     lambda: _workspace_bytes(_SIGMOID, stage != "forward", q.dtype, q.shape,
                                              k.dtype, k.shape))


def _times(g, x):
    """g x for a saved gradient x, computed in fp32 and stored in x's dtype
    (exact for g = 1, the cotangent of a loss differentiated directly)."""
    return (x.astype(_F32) * g).astype(x.dtype)


# site and recompute are static: the _Site of the call and a Python bool.
@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _sigmoid(site, recompute, q, k, s, t, labels):
    # Not differentiated: the plain forward (2 b c d FLOPs), no gradient products.
    return _sigmoid_call(site, "forward", q, k, s, t, labels)[0]


def _sigmoid_fwd(site, recompute, q, k, s, t, labels):
    if recompute:  # save nothing new; the backward walks the tiles again
        return _sigmoid_call(site, "forward", q, k, s, t, labels)[0], (q, k, s, t, labels)
    loss, dq, dk, ds, dt = _sigmoid_call(site, "value_and_grad", q, k, s, t, labels)
    return loss, (dq, dk, ds, dt)


def _sigmoid_bwd(site, recompute, residuals, g):
    if recompute:
        q, k, s, t, labels = residuals
        dq, dk, ds, dt = _sigmoid_call(site, "backward", q, k, s, t, labels, g)
    else:  # the gradients of L, saved by the forward, times the cotangent: no tile walk
        dq, dk, ds, dt = (_times(g, x) for x in residuals)
    return dq, dk, ds, dt, None  # labels: integers, no cotangent


_sigmoid.defvjp(_sigmoid_fwd, _sigmoid_bwd)


def sigmoid_loss(q, k, logit_scale, logit_bias, labels=None, *, recompute=False, comm=None,
                 precision="default"):
    """The pairwise sigmoid (SigLIP) loss of rows q (b, d) against columns k (c, d):

        x_ij = s <q_i, k_j> + t,   z_ij = +1 if j = y_i else -1
        L = -(1/b) sum_i sum_j log sigmoid(z_ij x_ij)

    summed over all c columns of a row, averaged over the b rows (SigLIP
    normalises by the batch); y = labels, or y_i = i when labels is None
    (then c >= b). Returns a float32 scalar, differentiable in q, k,
    logit_scale and logit_bias (reverse mode, first order: jax.grad,
    jax.value_and_grad, jax.vjp; under jax.jit; jax.vmap runs one call per
    element). log sigmoid is evaluated in its overflow-free form, so any s
    (10..100 and beyond) and t (e.g. -10) are safe.

    q, k         (b, d) and (c, d), both float32, bfloat16 or float16 (fp32
                 accumulation); the gradients of q and k have their dtype.
    logit_scale  s > 0, the scale itself (not its logarithm), one element,
                 taken as float32. The gradient returned is dL/ds for the s
                 given: a model that learns log s gets s dL/ds by the chain
                 rule, e.g. sigmoid_loss(q, k, jnp.exp(log_s), t).
    logit_bias   t, finite, one element, taken as float32; gradient dL/dt.
    labels       integer (b,) in [0, c), row i's one positive column, or None
                 (y_i = i). Not differentiable.
    recompute    static bool, default False: what the forward keeps for the
                 backward (both give the same values and gradients to
                 rounding; with g = 1 the same bits).
                   False  under differentiation the forward makes ONE call,
                          flatmem_contrastive_sigmoid_value_and_grad (loss,
                          dq, dk, ds, dt in one tile walk, 6 b c d FLOPs), and
                          saves dq, dk ((b + c) d elements in the input dtype)
                          and ds, dt; the backward only multiplies them by the
                          cotangent (element-wise, no tile walk). 6 b c d in
                          all.
                   True   the forward computes the loss alone (2 b c d) and
                          saves nothing beyond q, k, s, t, labels; the
                          backward calls flatmem_contrastive_sigmoid_backward,
                          which walks the tiles again (6 b c d): 8 b c d in
                          all, for callers that cannot hold (b + c) d
                          gradient elements from the forward to the backward.
                 Not differentiated (jax.jit(sigmoid_loss), eval), either
                 way only flatmem_contrastive_sigmoid_forward runs (2 b c d
                 FLOPs, no gradient products). Never a b x c buffer.
    comm         a RingComm (flatmem_jax.ring.initialize()), default None:
                 the loss of the GLOBAL batch spread over the communicator's
                 ranks -- this rank passes its rows q (b_r, d) and columns
                 k (c_r, d); labels (b_r,) are GLOBAL column indices in
                 [0, C), C = sum of c_r (None: row g of the global batch pairs
                 with column g); L is the mean over all B global rows, the
                 same on every rank, dq and dk this rank's rows of its
                 gradient, ds and dt the global ones on every rank.
                 Collective; CPU only. See flatmem_jax.ring.
    precision    static, "default" (default), "tf32" or "full" (anything
                 else: ValueError): options.fp32_precision, as for clip_loss
                 -- CUDA: TF32 or 3xTF32 products for float32 inputs; CPU at
                 ISA level avx512bf16 or amx with bfloat16 inputs: "tf32"
                 rounds the gradient matrix G once to bf16 in the gradient
                 products (bf16-accurate dq, dk), "default" / "full" split it
                 in two bf16 parts; no effect elsewhere on the CPU.

    Errors: shapes and dtypes flatmem refuses raise FlatmemError at trace
    time; labels out of range, NaN/Inf, s <= 0 or a non-finite t fail when
    XLA runs the call, with flatmem's status and message naming the argument.
    """
    q, k = _features(q, k)
    if not isinstance(recompute, (bool, np.bool_)):
        raise TypeError(f"flatmem_jax: recompute must be a static Python bool, not {recompute!r}")
    labels = None if labels is None else _labels_operand(labels)
    return _sigmoid(_site(0, comm, precision), bool(recompute), q, k,
                    _scalar(logit_scale, "logit_scale"),
                    _scalar(logit_bias, "logit_bias"), labels)


# ---------------------------------------------------------------------------
# Reversible segments of built-in blocks
# ---------------------------------------------------------------------------

_ATTENTION_NAMES = ("ln_weight", "ln_bias", "qkv_weight", "qkv_bias", "proj_weight", "proj_bias")
_MLP_NAMES = ("ln_weight", "ln_bias", "fc1_weight", "fc1_bias", "fc2_weight", "fc2_bias")

_lib.flatmem_jax_reversible_workspace_size.restype = ctypes.c_int
_lib.flatmem_jax_reversible_workspace_size.argtypes = [
    ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_float,
    ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_int64),
    ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_size_t), ctypes.c_char_p, ctypes.c_size_t]


class _ReversibleConfig(tuple):
    """(heads, hidden, eps, mode, num_threads, seed, offset, math): static, hashable."""

    heads = property(lambda self: self[0])
    hidden = property(lambda self: self[1])
    eps = property(lambda self: self[2])
    mode = property(lambda self: self[3])
    num_threads = property(lambda self: self[4])
    seed = property(lambda self: self[5])
    offset = property(lambda self: self[6])
    math = property(lambda self: self[7])

    def attributes(self):
        return dict(mode=np.int32(self.mode), num_threads=np.int32(self.num_threads),
                    seed=np.uint64(self.seed), offset=np.uint64(self.offset),
                    heads=np.int32(self.heads), hidden=np.int32(self.hidden),
                    eps=np.float32(self.eps), math=np.int32(self.math))


@functools.lru_cache(maxsize=256)
def _reversible_workspace_bytes(config, backward: bool, depth: int, shape) -> int:
    """Bytes of workspace the CPU handler needs (flatmem's own query, on the
    cached CPU segment of this configuration; what flatmem refuses in the
    configuration -- heads, eps, math, mode, threads -- raises here, at trace
    time, for either platform)."""
    size = ctypes.c_size_t(0)
    message = ctypes.create_string_buffer(1024)
    dims = (ctypes.c_int64 * len(shape))(*shape)
    status = _lib.flatmem_jax_reversible_workspace_size(
        int(backward), depth, shape[-1], config.heads, config.hidden, config.eps, config.math,
        config.mode, config.num_threads, len(shape), dims, _DL_FLOAT, 32, ctypes.byref(size),
        message, len(message))
    if status != 0:
        name, _, text = message.value.decode(errors="replace").partition(": ")
        raise FlatmemError(name, text)
    return size.value


def _reversible_call(target, config, results, operands, depth, shape, backward):
    """One custom call, as _call for the losses: on CPU with the workspace as
    an extra (dropped) result after (y1, y2) / (dx1, dx2), on CUDA without
    (the handler takes XLA's scratch memory)."""
    ws = _reversible_workspace_bytes(config, backward, depth, shape)
    attributes = config.attributes()

    def cpu(*ops):
        shapes = list(results)
        shapes.insert(2, jax.ShapeDtypeStruct((ws,), jnp.uint8))
        out = jax.ffi.ffi_call(target, shapes, vmap_method="sequential")(*ops, **attributes)
        return tuple(out[:2]) + tuple(out[3:])

    def cuda(*ops):
        call = jax.ffi.ffi_call(target, list(results), vmap_method="sequential")
        return tuple(call(*ops, **attributes))

    if not has_cuda:
        return cpu(*operands)
    return jax.lax.platform_dependent(*operands, cpu=cpu, cuda=cuda)


def _reversible_forward(config, x1, x2, flat):
    state = jax.ShapeDtypeStruct(x1.shape, _F32)
    y1, y2 = _reversible_call("flatmem_reversible_forward", config, [state, state], (x1, x2, *flat),
                              len(flat) // 12, x1.shape, False)
    return y1, y2


def _reversible_backward(config, y1, y2, dy1, dy2, flat):
    state = jax.ShapeDtypeStruct(y1.shape, _F32)
    results = [state, state] + [jax.ShapeDtypeStruct(p.shape, _F32) for p in flat]
    out = _reversible_call("flatmem_reversible_backward", config, results,
                           (y1, y2, dy1, dy2, *flat), len(flat) // 12, y1.shape, True)
    return out[0], out[1], tuple(out[2:])


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _reversible(config, x1, x2, flat):
    return _reversible_forward(config, x1, x2, flat)


def _reversible_fwd(config, x1, x2, flat):
    y1, y2 = _reversible_forward(config, x1, x2, flat)
    # Only the output (and the parameters, which are inputs anyway): the
    # backward rebuilds every block's activations from (y1, y2).
    return (y1, y2), (y1, y2, flat)


def _reversible_bwd(config, saved, cotangents):
    y1, y2, flat = saved
    dy1, dy2 = (jnp.asarray(c, _F32) for c in cotangents)
    dx1, dx2, grads = _reversible_backward(config, y1, y2, dy1, dy2, flat)
    return dx1, dx2, grads


_reversible.defvjp(_reversible_fwd, _reversible_bwd)


def _flatten_parameters(params, width):
    """The 12 * depth parameter arrays in handler order, and the MLP hidden
    width; shapes and dtypes checked here, at trace time."""
    try:
        layers = [(list(attention), list(mlp)) for attention, mlp in params]
    except (TypeError, ValueError):
        raise ValueError("flatmem_jax: params must be a list of (attention parameters, mlp "
                         "parameters) pairs, one per block") from None
    if not layers:
        raise ValueError("flatmem_jax: params is empty; a segment has at least one block")
    flat, hidden = [], None
    for k, (attention, mlp) in enumerate(layers):
        for part, arrays, names in ((0, attention, _ATTENTION_NAMES), (1, mlp, _MLP_NAMES)):
            if len(arrays) != 6:
                raise ValueError(f"flatmem_jax: params[{k}][{part}] has {len(arrays)} arrays; the "
                                 f"{'attention' if part == 0 else 'mlp'} block takes 6 {names}")
        if hidden is None:
            hidden = int(np.shape(mlp[2])[-1]) if np.ndim(mlp[2]) == 2 else 0
        w, h = width, hidden
        expected = ([(w,), (w,), (w, 3 * w), (3 * w,), (w, w), (w,)],
                    [(w,), (w,), (w, h), (h,), (h, w), (w,)])
        for part, arrays, names in ((0, attention, _ATTENTION_NAMES), (1, mlp, _MLP_NAMES)):
            for i, a in enumerate(arrays):
                a = jnp.asarray(a)
                what = f"params[{k}][{part}][{i}] ({'attention' if part == 0 else 'mlp'} {names[i]})"
                if a.dtype != _F32:
                    raise TypeError(f"flatmem_jax: {what}: dtype {a.dtype}; the built-in blocks take float32")
                if a.shape != expected[part][i]:
                    raise ValueError(f"flatmem_jax: {what}: shape {a.shape}, expected {expected[part][i]}"
                                     + (" (hidden is taken from params[0][1][2])" if part == 1 else ""))
                flat.append(a)
    return tuple(flat), hidden


def reversible_transformer(x1, x2, params, *, heads, mode="auto", seed=0, offset=0, eps=1e-6,
                           num_threads=0, math="fp32"):
    """A reversible transformer segment of flatmem's built-in blocks:

        for each block k:   y1 = x1 + Attention_k(x2),   y2 = x2 + MLP_k(y1)

    with Attention_k(x) = MHSA(LN(x)) (``heads`` heads) and MLP_k(x) =
    GELU(LN(x) W1 + b1) W2 + b2 (include/flatmem/reversible.h gives the
    formulas). Returns (y1, y2), differentiable in x1, x2 and every parameter
    (``jax.grad``, ``jax.vjp``; under ``jax.jit``; ``jax.vmap`` runs one call
    per element). The forward saves only (y1, y2) besides the parameters; the
    backward rebuilds each block's activations from its output, so activation
    memory does not grow with depth.

    x1, x2     float32 (batch, tokens, width) or (tokens, width), the same shape
    params     [(attention, mlp), ...], one pair per block: attention = 6 arrays
               (ln_weight (w,), ln_bias (w,), qkv_weight (w, 3w), qkv_bias (3w,),
               proj_weight (w, w), proj_bias (w,)), mlp = 6 arrays (ln_weight,
               ln_bias, fc1_weight (w, h), fc1_bias (h,), fc2_weight (h, w),
               fc2_bias (w,)); float32; h is the same for every block
    heads      attention heads (width % heads == 0)
    mode       "auto" (default), "vanilla" or "overlapped": how the backward
               runs (results are the same; "standard" keeps activations in
               flatmem between two XLA calls and is not offered)
    seed, offset   passed to flatmem (the built-in blocks draw no randomness)
    eps        LayerNorm epsilon
    num_threads    CPU threads of each call (0: $FLATMEM_JAX_NUM_THREADS, or all)
    math       precision of the blocks' matrix products (flatmem_block_math):
               "fp32" (default) or "tf32" (CUDA: inputs rounded to TF32 on
               tensor cores, fp32 accumulation; the CPU computes FP32 for
               either, so the results are the same there)

    mode, seed, offset, eps, heads, num_threads and math are static (Python
    values). CPU, and CUDA when the handlers were built with nvcc
    (``has_cuda``): parameters and states are then device buffers, the calls
    run on XLA's stream (checked on an H200: tests/gpu_check.py).
    """
    x1, x2 = jnp.asarray(x1), jnp.asarray(x2)
    for name, x in (("x1", x1), ("x2", x2)):
        if x.dtype != _F32:
            raise TypeError(f"flatmem_jax: {name}: dtype {x.dtype}; the built-in blocks take float32")
        if x.ndim not in (2, 3):
            raise ValueError(f"flatmem_jax: {name} must be (batch, tokens, width) or (tokens, width), "
                             f"got shape {x.shape}")
    if x1.shape != x2.shape:
        raise ValueError(f"flatmem_jax: x2 has shape {x2.shape}, x1 {x1.shape}; they must be the same")
    # STANDARD keeps every block's activations in the flatmem handle between its forward and its
    # backward, which two separate XLA calls cannot share: it is not offered here.
    if isinstance(mode, str) and mode.lower() == "standard":
        raise ValueError("flatmem_jax: mode 'standard' is not offered: it keeps every block's "
                         "activations inside flatmem from the forward call to the backward call, "
                         "which XLA runs as separate calls; plain JAX autodiff is that baseline")
    mode_value = enum_value(mode, "flatmem_reversible_mode", "mode")  # numbers: flatmem judges them
    math_value = enum_value(math, "flatmem_block_math", "math")  # (FlatmemError at trace time)
    flat, hidden = _flatten_parameters(params, x1.shape[-1])
    config = _ReversibleConfig((int(heads), int(hidden), float(eps), mode_value, int(num_threads),
                                int(seed), int(offset), math_value))
    return _reversible(config, x1, x2, flat)


# The ring across ranks (ring.py uses the loader and helpers above).
from . import ring  # noqa: E402
from .ring import RingComm  # noqa: E402
