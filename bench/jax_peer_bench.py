#!/usr/bin/env python3
"""jax_peer_bench -- flatmem beside its real peer, the materialised loss in plain JAX.

--loss clip (the default): the symmetric contrastive (CLIP) loss, forward + backward, fp32, b = c,
in one run:

  jax-materialised   logits = s q k^T, (CE rows + CE cols) / 2 with jax.nn.logsumexp,
                     jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2))), XLA:CPU
  flatmem-jax        flatmem_jax.clip_loss (bindings/jax) under the same jit and value_and_grad
  flatmem-jax-cache  the same with logit_cache_bytes = b^2 * 4 (n/a when the binding has no such
                     keyword)
  flatmem-c          flatmem's C API: build/bench/contrastive_bench --worker flatmem
  flatmem-c-cache    the same with --logit-cache-bytes b^2 * 4 (n/a when the binary has no such flag)
  gemm4-c            the four b x b x d GEMMs of flatmem's default path (contrastive_bench --worker
                     gemm4): the floor on this machine

--loss sigmoid: the pairwise sigmoid (SigLIP) loss, logits x = s q k^T + t (t = --bias, -10),
L = -(1/b) sum_ij log_sigmoid(z_ij x_ij), z = +1 on the diagonal, -1 elsewhere; value and the
gradients of q, k, s and t:

  jax-materialised-sigmoid  that formula with jax.nn.log_sigmoid on the b x b logits,
                     jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3))), XLA:CPU
  flatmem-jax-sigmoid  flatmem_jax.sigmoid_loss under the same jit and value_and_grad (n/a when the
                     installed flatmem_jax has no sigmoid_loss)
  flatmem-c-sigmoid  flatmem's C API: contrastive_bench --worker sigmoid
                     (flatmem_contrastive_sigmoid_value_and_grad: loss, dq, dk, ds, dt in one call)
  gemm3-c            the three b x b x d GEMMs of the sigmoid loss (contrastive_bench --worker gemm3)

--loss all: both sets. In every mode:

  inputs-jax, inputs-c   baselines: a process of the same kind holding only q, k and arrays of the
                     gradients' shapes; "extra memory" = a variant's peak RSS - its baseline's

--dtypes fp32,bf16 (the default: both): the bf16 rows, each beside its fp32 row and with tables of
its own (no targets):

  jax-materialised-bf16, jax-materialised-sigmoid-bf16   the same plain-JAX formulation on
                     jnp.bfloat16 q, k (contrastive_bench's features rounded to nearest even); s (and
                     t) stay jnp.float32 scalars, which JAX's type promotion lets make the logits and
                     the log-sum-exp float32 after the bf16 product (q.grad, k.grad are bf16)
  flatmem-jax-bf16, flatmem-jax-sigmoid-bf16   flatmem_jax.clip_loss / sigmoid_loss on the same bf16 q, k
  flatmem-c-bf16, flatmem-c-sigmoid-bf16       contrastive_bench --worker flatmem / sigmoid --dtype bf16
                     (bf16 q, k, dq, dk)
  inputs-jax-bf16, inputs-c-bf16               their baselines (bf16 q, k and gradient-shaped arrays;
                     the C one also holds the rounded features in fp32, as its workers do)

Loss error: every row with a loss also prints |L - L64| / |L64| against the float64 loss of the very
inputs it used (bf16 rows: the rounded values), from contrastive_bench --worker reference /
sigmoid-reference --dtype D (reference-c*, sigmoid-reference-c*: dgemm in column strips and the loss
in double, once per (b, dtype), a process of its own, untimed in the tables).

Every (b, variant) runs in its own process; the peak RSS is that child's ru_maxrss (os.wait4). All
variants see the same unit-norm features: those of contrastive_bench (bench_support.hpp's
make_features, seed 1), which the JAX children rebuild bit for bit in NumPy. The first call
(compilation) is not timed; the time is the best of --reps calls, each blocked until ready. With
--rounds N every variant of a size runs N times in turn and the fastest run is kept (a busy machine
slows some runs, never speeds one up), with the largest peak RSS seen.

    build/wheel-venv/bin/python bench/jax_peer_bench.py                       # b = 4096, 16384
    build/wheel-venv/bin/python bench/jax_peer_bench.py --sizes 512,1024 --reps 2 --csv /tmp/peer.csv
    build/wheel-venv/bin/python bench/jax_peer_bench.py --loss sigmoid --csv bench/jax_peer_sigmoid_bench.csv

Needs the wheel's venv (scripts/build-wheel.sh: flatmem with flatmem_jax, and JAX)
and, for the flatmem-c rows, a Release build/bench/contrastive_bench.

Adding a variant is one entry in VARIANTS below.

The driver imports neither NumPy nor JAX on purpose: a child's ru_maxrss starts from the resident
set of the process it was forked from, so the driver must stay smaller than any child.
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import glob
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable, Optional

from bench_report import cpu_model, machine_ram, seconds, size

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MiB, GiB = 1024.0**2, 1024.0**3
SEED = 1  # contrastive_bench's features (VariantConfig::seed); its worker takes no seed option

# Targets reported against (the task's; the same for both losses).
TARGET_BATCH = 16384
TARGET_TIME = 0.85          # flatmem (default options) <= 0.85x JAX's time at b = 16384 ...
TARGET_MEMORY = 1.0 / 8.0   # ... with <= 1/8 of its peak RSS
BIAS = -10.0                # the sigmoid loss's logit bias t (SigLIP's initial value)
CACHE_TARGET_BATCHES = (4096, 16384)
CACHE_TARGET_TIME = 0.80    # with a b^2 * 4 byte logit cache: <= 0.8x JAX's time at both sizes


def _none(b: int, d: int) -> dict:
    return {}


def _cache_budget(b: int, d: int) -> dict:
    return {"logit_cache_bytes": b * b * 4}


def _cache_flag(b: int, d: int) -> dict:
    return {"--logit-cache-bytes": b * b * 4}


def _dtype_flag(b: int, d: int) -> dict:
    return {"--dtype": "bf16"}


@dataclasses.dataclass(frozen=True)
class Variant:
    name: str
    label: str
    runner: str                  # "jax": a child of this script; "c": contrastive_bench --worker
    # jax: "inputs" | "materialised" | "flatmem" | "materialised-sigmoid" | "flatmem-sigmoid";
    # c: the worker's name
    kind: str
    baseline: Optional[str]      # the variant whose peak is subtracted; None for a baseline itself
    role: str                    # "baseline" | "peer" | "flatmem" | "cache" | "floor"
    # jax: keyword arguments of the loss; c: extra worker flags -- both from (b, d)
    options: Callable[[int, int], dict] = _none
    # bytes beyond the inputs known before running (skip above --mem-limit-gib)
    planned_bytes: Callable[[int, int], float] = lambda b, d: 0.0
    loss: str = "clip"           # "clip" | "sigmoid"; baselines serve both
    dtype: str = "fp32"          # "fp32" | "bf16": of q, k (and the gradients)


VARIANTS = [
    Variant("inputs-jax", "inputs only (JAX process)", "jax", "inputs", None, "baseline"),
    Variant("inputs-c", "inputs only (contrastive_bench --worker inputs)", "c", "inputs", None,
            "baseline"),
    Variant("jax-materialised", "plain JAX, materialised logits (XLA:CPU)", "jax", "materialised",
            "inputs-jax", "peer", planned_bytes=lambda b, d: 3.0 * 4.0 * b * b),
    Variant("flatmem-jax", "flatmem_jax.clip_loss", "jax", "flatmem", "inputs-jax", "flatmem"),
    Variant("flatmem-c", "flatmem C API (contrastive_bench --worker flatmem)", "c", "flatmem",
            "inputs-c", "flatmem"),
    Variant("flatmem-jax-cache", "flatmem_jax.clip_loss, logit_cache_bytes = b^2*4", "jax",
            "flatmem", "inputs-jax", "cache", _cache_budget, lambda b, d: 4.0 * b * b),
    Variant("flatmem-c-cache", "flatmem C API, --logit-cache-bytes b^2*4", "c", "flatmem",
            "inputs-c", "cache", _cache_flag, lambda b, d: 4.0 * b * b),
    # What this machine's sgemm needs for flatmem's FLOPs: four b x b x d products (8 b^2 d, the
    # default path; the cache path does three of them). A time target below it cannot be met here.
    Variant("gemm4-c", "4 GEMMs of b x b x d (contrastive_bench --worker gemm4): flatmem's floor", "c",
            "gemm4", "inputs-c", "floor"),
    Variant("jax-materialised-sigmoid", "plain JAX sigmoid loss, materialised logits (XLA:CPU)", "jax",
            "materialised-sigmoid", "inputs-jax", "peer", planned_bytes=lambda b, d: 3.0 * 4.0 * b * b,
            loss="sigmoid"),
    Variant("flatmem-jax-sigmoid", "flatmem_jax.sigmoid_loss", "jax", "flatmem-sigmoid", "inputs-jax",
            "flatmem", loss="sigmoid"),
    Variant("flatmem-c-sigmoid", "flatmem C API (contrastive_bench --worker sigmoid)", "c", "sigmoid",
            "inputs-c", "flatmem", loss="sigmoid"),
    # The sigmoid loss's 6 b^2 d FLOPs as three plain GEMMs: its floor here.
    Variant("gemm3-c", "3 GEMMs of b x b x d (contrastive_bench --worker gemm3): the sigmoid's floor", "c",
            "gemm3", "inputs-c", "floor", loss="sigmoid"),
    # bf16 q, k (the features rounded to nearest even), beside the fp32 rows
    Variant("inputs-jax-bf16", "inputs only (JAX process, bf16)", "jax", "inputs", None, "baseline",
            dtype="bf16"),
    Variant("inputs-c-bf16", "inputs only (contrastive_bench --worker inputs --dtype bf16)", "c", "inputs", None,
            "baseline", _dtype_flag, dtype="bf16"),
    Variant("jax-materialised-bf16", "plain JAX on bf16 q, k, materialised logits (XLA:CPU)", "jax",
            "materialised", "inputs-jax-bf16", "peer", planned_bytes=lambda b, d: 3.0 * 4.0 * b * b, dtype="bf16"),
    Variant("flatmem-jax-bf16", "flatmem_jax.clip_loss on bf16 q, k", "jax", "flatmem", "inputs-jax-bf16",
            "flatmem", dtype="bf16"),
    Variant("flatmem-c-bf16", "flatmem C API, bf16 (contrastive_bench --worker flatmem --dtype bf16)", "c",
            "flatmem", "inputs-c-bf16", "flatmem", _dtype_flag, dtype="bf16"),
    Variant("jax-materialised-sigmoid-bf16", "plain JAX sigmoid loss on bf16 q, k, materialised logits", "jax",
            "materialised-sigmoid", "inputs-jax-bf16", "peer", planned_bytes=lambda b, d: 3.0 * 4.0 * b * b,
            loss="sigmoid", dtype="bf16"),
    Variant("flatmem-jax-sigmoid-bf16", "flatmem_jax.sigmoid_loss on bf16 q, k", "jax", "flatmem-sigmoid",
            "inputs-jax-bf16", "flatmem", loss="sigmoid", dtype="bf16"),
    Variant("flatmem-c-sigmoid-bf16", "flatmem C API, bf16 (contrastive_bench --worker sigmoid --dtype bf16)",
            "c", "sigmoid", "inputs-c-bf16", "flatmem", _dtype_flag, loss="sigmoid", dtype="bf16"),
    # the float64 losses of the same inputs (the err columns): run once per (b, dtype), untimed
    Variant("reference-c", "float64 CLIP loss (contrastive_bench --worker reference)", "c", "reference", None,
            "reference"),
    Variant("reference-c-bf16", "float64 CLIP loss of the bf16 inputs", "c", "reference", None, "reference",
            _dtype_flag, dtype="bf16"),
    Variant("sigmoid-reference-c", "float64 sigmoid loss (contrastive_bench --worker sigmoid-reference)", "c",
            "sigmoid-reference", None, "reference", loss="sigmoid"),
    Variant("sigmoid-reference-c-bf16", "float64 sigmoid loss of the bf16 inputs", "c", "sigmoid-reference", None,
            "reference", _dtype_flag, loss="sigmoid", dtype="bf16"),
]
BY_NAME = {v.name: v for v in VARIANTS}
DTYPES = ("fp32", "bf16")
PEERS = {("clip", "fp32"): "jax-materialised", ("sigmoid", "fp32"): "jax-materialised-sigmoid",
         ("clip", "bf16"): "jax-materialised-bf16", ("sigmoid", "bf16"): "jax-materialised-sigmoid-bf16"}
REFERENCES = {(v.loss, v.dtype): v.name for v in VARIANTS if v.role == "reference"}
LOSS_TITLES = {"clip": "Symmetric CLIP loss, forward + backward",
               "sigmoid": "Sigmoid (SigLIP) loss, value and gradients of q, k, s, t"}


def peer_of(name: str) -> str:
    """The plain-JAX variant a variant is compared with: the materialised loss of its kind and dtype."""
    v = BY_NAME[name]
    return PEERS[(v.loss, v.dtype)]


def reference_of(name: str) -> Optional[str]:
    """The float64 reference of a variant's loss (None for the baselines, floors and references)."""
    v = BY_NAME[name]
    return REFERENCES[(v.loss, v.dtype)] if v.role in ("peer", "flatmem", "cache") else None


# ---------------------------------------------------------------------------
# Features: contrastive_bench's make_features (bench/bench_support.hpp), in NumPy
# ---------------------------------------------------------------------------


def make_features(b: int, d: int, seed: int, chunk: int = 64):
    """q_i uniform on the unit sphere, k_i = normalize(q_i + noise), float32 (b, d): the same bits
    as bench::make_features (splitmix64 per row, Box-Muller in double, GCC's left-to-right
    evaluation of the two uniforms of one normal; norms summed in order). Built in row chunks so
    that the float64 intermediates stay small."""
    import numpy as np

    u64 = np.uint64
    golden, mix1, mix2 = u64(0x9E3779B97F4A7C15), u64(0xBF58476D1CE4E5B9), u64(0x94D049BB133111EB)
    row_mix = u64(0xD1B54A32D192ED03)
    q = np.empty((b, d), np.float32)
    k = np.empty((b, d), np.float32)
    steps = np.arange(1, 4 * d + 1, dtype=u64) * golden  # uniform n of a row: state0 + (n+1) G
    for r0 in range(0, b, chunk):
        rows = np.arange(r0, min(b, r0 + chunk), dtype=u64)
        z = ((u64(seed) << u64(40)) ^ (rows * row_mix))[:, None] + steps[None, :]
        z = (z ^ (z >> u64(30))) * mix1
        z = (z ^ (z >> u64(27))) * mix2
        z ^= z >> u64(31)
        u = ((z >> u64(11)).astype(np.float64) + 0.5) / 9007199254740992.0
        u = u.reshape(len(rows), d, 2, 2)  # per element t: (q: log, cos), (noise: log, cos)
        normal = (np.sqrt(-2.0 * np.log(u[..., 0])) * np.cos(6.283185307179586 * u[..., 1]))
        normal = normal.astype(np.float32)
        qc, kc = normal[:, :, 0], normal[:, :, 0] + normal[:, :, 1]
        for src, dst in ((qc, q), (kc, k)):
            norm = np.sqrt(np.cumsum(src.astype(np.float64) ** 2, axis=1)[:, -1:])
            dst[r0:r0 + len(rows)] = (src / norm).astype(np.float32)
    return q, k


# ---------------------------------------------------------------------------
# Child side
# ---------------------------------------------------------------------------


def jax_worker(args, out) -> int:
    v = BY_NAME[args.worker]
    import numpy as np
    import jax
    import jax.numpy as jnp

    b, d = args.batch, args.dim
    kwargs = v.options(b, d)
    if v.kind in ("flatmem", "flatmem-sigmoid"):
        import inspect

        import flatmem_jax

        function = "clip_loss" if v.kind == "flatmem" else "sigmoid_loss"
        binding = getattr(flatmem_jax, function, None)
        if binding is None:
            out.write(f"na=flatmem_jax {getattr(flatmem_jax, '__version__', '?')} has no {function}\n")
            return 0
        params = inspect.signature(binding).parameters
        open_kw = any(p.kind == p.VAR_KEYWORD for p in params.values())
        missing = [kw for kw in kwargs if kw not in params and not open_kw]
        if missing:
            out.write(f"na=binding has no {', '.join(missing)}\n")
            return 0

        def loss(q, k, *scalars):  # (s) for the CLIP loss, (s, t) for the sigmoid loss
            return binding(q, k, *scalars, **kwargs)
    elif v.kind == "materialised":
        def loss(q, k, s):
            logits = s * (q @ k.T)
            diag = jnp.diagonal(logits)
            rows = jnp.mean(jax.nn.logsumexp(logits, axis=1) - diag)
            cols = jnp.mean(jax.nn.logsumexp(logits, axis=0) - diag)
            return (rows + cols) / 2
    elif v.kind == "materialised-sigmoid":
        def loss(q, k, s, t):  # big_vision's sigmoid loss: z = 2 I - 1, -(1/b) sum log_sigmoid(z x)
            logits = s * (q @ k.T) + t
            z = 2.0 * jnp.eye(q.shape[0], k.shape[0], dtype=logits.dtype) - 1.0
            return -jnp.sum(jax.nn.log_sigmoid(z * logits)) / q.shape[0]
    elif v.kind != "inputs":
        raise SystemExit(f"jax_peer_bench: unknown JAX variant kind {v.kind!r}")

    q_host, k_host = make_features(b, d, SEED)
    dtype = jnp.bfloat16 if v.dtype == "bf16" else jnp.float32
    if v.dtype == "bf16":  # round to nearest even (ml_dtypes), as contrastive_bench's bf16 rows
        q_host, k_host = q_host.astype(jnp.bfloat16), k_host.astype(jnp.bfloat16)
    q, k = jax.device_put(q_host), jax.device_put(k_host)
    del q_host, k_host
    s = jnp.float32(args.scale)
    scalars = (s, jnp.float32(args.bias)) if v.loss == "sigmoid" else (s,)
    if v.kind == "inputs":
        # q, k and two filled arrays the size of dq, dk on the device; nothing compiled, so that
        # XLA's compiler shows up in the variants' extra memory (it is part of what they cost)
        dq, dk = (jax.device_put(np.ones((b, d), dtype)) for _ in range(2))
        jax.block_until_ready((q, k, s, dq, dk))
        out.write(f"checksum={float(np.asarray(q)[0, 0]) + float(np.asarray(dk)[-1, -1])!r}\n")
        return 0
    fn = jax.jit(jax.value_and_grad(loss, argnums=tuple(range(2 + len(scalars)))))

    try:
        t0 = time.perf_counter()
        result = jax.block_until_ready(fn(q, k, *scalars))
        warmup = time.perf_counter() - t0
    except TypeError as e:  # a keyword the binding declares (**kwargs) but refuses
        if kwargs and "keyword" in str(e):
            out.write(f"na=binding has no {', '.join(kwargs)}\n")
            return 0
        raise
    del result
    times, value, dscale, dbias = [], math.nan, math.nan, math.nan
    for _ in range(max(1, args.reps)):
        t0 = time.perf_counter()
        result = jax.block_until_ready(fn(q, k, *scalars))
        times.append(time.perf_counter() - t0)
        value, dscale = float(result[0]), float(result[1][2])
        loss_dtype = str(result[0].dtype)
        if len(scalars) > 1:
            dbias = float(result[1][3])
        del result  # the next call must not find the previous results alive
    out.write(f"warmup_s={warmup!r}\ntotal_s={min(times)!r}\n"
              f"median_total_s={statistics.median(times)!r}\nreps={len(times)}\n")
    out.write(f"loss={value!r}\ndscale={dscale!r}\nloss_dtype={loss_dtype}\n")
    if math.isfinite(dbias):
        out.write(f"dbias={dbias!r}\n")
    return 0


def header_declaration(name: str, headers) -> Optional[str]:
    for path in headers:
        try:
            text = open(path, errors="replace").read()
        except OSError:
            continue
        m = re.search(r"([^;{}/]*\b" + name + r"\s*\([^)]*\))\s*;", text)
        if m:
            return " ".join(m.group(1).split())
    return None


def isa_of(lib, headers) -> str:
    """flatmem_cpu_isa_name(...) if this libflatmem has it, called when the installed header declares
    one of the signatures below; otherwise says that it is there."""
    import ctypes

    try:
        fn = lib.flatmem_cpu_isa_name
    except AttributeError:
        return ""
    decl = header_declaration("flatmem_cpu_isa_name", headers) or ""
    args = re.sub(r"\s+", " ", decl[decl.find("(") + 1:decl.rfind(")")]).strip()
    returns_text = re.search(r"char\s*\*\s*(FLATMEM_\w+\s+)?flatmem_cpu_isa_name\s*\($", decl[:decl.find("(") + 1])
    if returns_text and args in ("", "void"):                      # const char *f(void)
        fn.restype, fn.argtypes = ctypes.c_char_p, []
        return (fn() or b"?").decode(errors="replace")
    if returns_text and re.fullmatch(r"flatmem_cpu_isa\s*\w*", args) and hasattr(lib, "flatmem_cpu_isa_get"):
        # const char *f(flatmem_cpu_isa), the ISA in use from flatmem_cpu_isa_get(&in_use, NULL)
        in_use = ctypes.c_int(0)
        get = lib.flatmem_cpu_isa_get
        get.restype, get.argtypes = ctypes.c_int, [ctypes.POINTER(ctypes.c_int), ctypes.c_void_p]
        status = get(ctypes.byref(in_use), None)
        fn.restype, fn.argtypes = ctypes.c_char_p, [ctypes.c_int]
        return (fn(in_use.value) or b"?").decode(errors="replace") if status == 0 else f"(status {status})"
    if re.fullmatch(r"const char \*\s*\*\s*\w*", args):          # flatmem_status f(const char **)
        name = ctypes.c_char_p()
        fn.restype, fn.argtypes = ctypes.c_int, [ctypes.POINTER(ctypes.c_char_p)]
        status = fn(ctypes.byref(name))
        return name.value.decode(errors="replace") if status == 0 and name.value else f"(status {status})"
    if re.fullmatch(r"char \*\s*\w*\s*, size_t\s*\w*", args):    # flatmem_status f(char *, size_t)
        buf = ctypes.create_string_buffer(256)
        fn.restype, fn.argtypes = ctypes.c_int, [ctypes.c_char_p, ctypes.c_size_t]
        status = fn(buf, len(buf))
        return buf.value.decode(errors="replace") if status == 0 else f"(status {status})"
    return f"flatmem_cpu_isa_name present ({decl or 'no declaration found'}), not called"


def library_file(lib, symbol: str = "flatmem_version_string") -> str:
    """The file a ctypes library was loaded from (dladdr on one of its symbols)."""
    import ctypes

    class DlInfo(ctypes.Structure):
        _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                    ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]

    info = DlInfo()
    process = ctypes.CDLL(None)
    process.dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(DlInfo)]
    address = ctypes.cast(getattr(lib, symbol), ctypes.c_void_p)
    if not process.dladdr(address, ctypes.byref(info)) or not info.dli_fname:
        return ""
    return os.path.realpath(info.dli_fname.decode())


def info_worker(args, out) -> int:
    """Versions: jax, jaxlib, flatmem_jax and the libflatmem it loaded, and the libflatmem of
    contrastive_bench (--c-lib); flatmem's CPU ISA when the library can tell."""
    import ctypes

    import jax
    import jaxlib

    out.write(f"jax={jax.__version__}\njaxlib={jaxlib.__version__}\n")
    out.write(f"python={sys.version.split()[0]}\njax_backend={jax.default_backend()}\n")
    libs = []
    try:
        import flatmem_jax

        out.write(f"flatmem_jax={flatmem_jax.__version__} ({flatmem_jax.library_path})\n")
        libs.append(("jax", ctypes.CDLL("libflatmem.so.1")))  # the one flatmem_jax's RUNPATH found
    except Exception as e:  # noqa: BLE001 -- reported; the flatmem-jax rows then fail themselves
        out.write(f"flatmem_jax=not importable: {str(e).splitlines()[0]}\n")
    if args.c_lib:
        try:
            libs.append(("c", ctypes.CDLL(args.c_lib)))
        except OSError as e:
            out.write(f"flatmem_version_c=cannot load {args.c_lib}: {e}\n")
    for tag, lib in libs:
        lib.flatmem_version_string.restype = ctypes.c_char_p
        path = library_file(lib)
        out.write(f"flatmem_version_{tag}={lib.flatmem_version_string().decode()}\n")
        out.write(f"flatmem_path_{tag}={path}\n")
        # the installed headers beside the library (PREFIX/lib/.. /include), then the checkout's
        headers = sorted(glob.glob(os.path.join(os.path.dirname(os.path.dirname(path)), "include",
                                                "flatmem", "*.h"))) if path else []
        headers += sorted(glob.glob(os.path.join(ROOT, "include", "flatmem", "*.h")))
        isa = isa_of(lib, headers)
        if isa:
            out.write(f"isa_{tag}={isa}\n")
    return 0


# ---------------------------------------------------------------------------
# Driver side
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class Run:
    b: int
    variant: str
    status: str = "ok"  # ok | n/a | skipped | failed
    note: str = ""
    values: dict = dataclasses.field(default_factory=dict)
    peak: float = math.nan
    extra: float = math.nan
    baseline_peak: float = math.nan
    planned: float = 0.0

    def get(self, key: str) -> float:
        v = self.values.get(key)
        return v if isinstance(v, float) else math.nan

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def time(self) -> float:
        return self.get("total_s") if self.ok else math.nan


def parse_values(text: str) -> dict:
    values = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if not sep:
            continue
        try:
            values[key] = float(value)
        except ValueError:
            values[key] = value
    return values


def spawn(argv, env=None, timeout=None):
    """Runs argv with a result pipe (its write end's number replaces '{fd}' in argv); returns
    (exit status, key=value text, captured stdout+stderr, ru_maxrss in bytes)."""
    r, w = os.pipe()
    argv = [a.replace("{fd}", str(w)) for a in argv]
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                pass_fds=(w,), env=env, close_fds=True)
        os.close(w)
        chunks = []
        with os.fdopen(r, "rb") as pipe:
            for chunk in iter(lambda: pipe.read(65536), b""):
                chunks.append(chunk)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait
        log.seek(0)
        output = log.read().decode(errors="replace")
    return proc.returncode, b"".join(chunks).decode(errors="replace"), output, 1024.0 * usage.ru_maxrss


def flag_supported(binary: str, flag: str) -> bool:
    """contrastive_bench's worker ignores flags it does not know, so look for the literal."""
    try:
        with open(binary, "rb") as f:
            return flag.encode() in f.read()
    except OSError:
        return False


def run_child(o, v: Variant, b: int) -> Run:
    run = Run(b, v.name, planned=v.planned_bytes(b, o.dim))
    common = ["--batch", str(b), "--dim", str(o.dim), "--scale", repr(o.scale), "--result-fd", "{fd}"]
    bias = [("--bias", repr(o.bias))] if v.loss == "sigmoid" and v.role != "floor" else []
    if v.runner == "jax":
        common += [x for pair in bias for x in pair]
        argv = [sys.executable, os.path.abspath(__file__), "--worker", v.name, "--reps", str(o.reps)]
        env = dict(os.environ, JAX_PLATFORMS="cpu")  # XLA:CPU; XLA_FLAGS, threads: as they are
    else:
        if not os.access(o.contrastive_bench, os.X_OK):
            run.status, run.note = "failed", f"no executable {o.contrastive_bench} (build it)"
            return run
        flags = [(k, str(val)) for k, val in v.options(b, o.dim).items()] + bias
        missing = [k for k, _ in flags if not flag_supported(o.contrastive_bench, k)]
        if missing:
            run.status, run.note = "n/a", f"n/a (contrastive_bench has no {', '.join(missing)})"
            return run
        # --min-time huge: exactly --max-reps timed runs (plus the worker's own warm-up run when a
        # run is shorter than 2 s); the worker reports the fastest
        argv = [o.contrastive_bench, "--worker", v.kind, "--min-time", "1e9", "--max-reps", str(o.reps)]
        argv += [x for pair in flags for x in pair]
        env = None
    rc, text, output, peak = spawn(argv + common, env=env)
    run.values = parse_values(text)
    run.peak = peak
    if "na" in run.values:
        run.status, run.note, run.peak = "n/a", f"n/a ({run.values['na']})", math.nan
    elif rc != 0 or "error" in run.values:
        run.status = "failed"
        tail = [line for line in output.strip().splitlines() if line.strip()][-3:]
        run.note = str(run.values.get("error") or (" | ".join(tail) if tail else f"exit status {rc}"))
    return run


# ---- formatting ---------------------------------------------------------------






def ratio(r: float) -> str:
    return f"{r:.2f}\u00d7" if math.isfinite(r) else "-"


def time_cell(r: Optional[Run]) -> str:
    if r is None:
        return "-"
    return seconds(r.time) if r.ok else (r.note if r.status in ("n/a", "skipped") else "failed")


def verdict(value: float, limit: float) -> str:
    return "not measured" if not math.isfinite(value) else "MET" if value <= limit else "MISSED"


def linked_libflatmem(binary: str) -> str:
    try:
        out = subprocess.run(["ldd", binary], capture_output=True, text=True).stdout
    except OSError:
        return ""
    m = re.search(r"libflatmem\.so\S*\s+=>\s+(\S+)", out)
    return m.group(1) if m else ""


def print_header(o) -> dict:
    losses = {loss for loss, _ in losses_of(o)}
    if "clip" in losses:
        print(f"jax_peer_bench: symmetric CLIP loss, forward + backward, {', '.join(o.dtypes)}, b = c, d = {o.dim}, "
              f"s = {o.scale:g}; best of {o.reps} calls after an untimed warm-up call")
    if "sigmoid" in losses:
        print(f"jax_peer_bench: sigmoid (SigLIP) loss, value and gradients, {', '.join(o.dtypes)}, b = c, d = {o.dim}, "
              f"s = {o.scale:g}, t = {o.bias:g}; best of {o.reps} calls after an untimed warm-up call")
    print(f"machine: {cpu_model()}, {os.cpu_count()} hardware threads, {size(machine_ram())} RAM")
    load = os.getloadavg()
    print(f"load average at start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    c_lib = linked_libflatmem(o.contrastive_bench) if os.access(o.contrastive_bench, os.X_OK) else ""
    rc, text, output, _ = spawn([sys.executable, os.path.abspath(__file__), "--worker", "info",
                                 "--c-lib", c_lib, "--result-fd", "{fd}"],
                                env=dict(os.environ, JAX_PLATFORMS="cpu"))
    info = parse_values(text)
    if rc != 0:
        lines = output.strip().splitlines()
        print(f"(the info child failed, exit status {rc}: {lines[-1] if lines else ''})")
    get = lambda key: str(info.get(key, "?"))  # noqa: E731
    print(f"python {get('python')} ({sys.executable}); jax {get('jax')}, jaxlib {get('jaxlib')}, "
          f"default backend {get('jax_backend')} (JAX_PLATFORMS=cpu in the JAX children)")
    print(f"flatmem_jax {get('flatmem_jax')}")
    print(f"flatmem {get('flatmem_version_jax')} for the flatmem-jax rows ({get('flatmem_path_jax')})")
    if c_lib:
        print(f"flatmem {get('flatmem_version_c')} for the flatmem-c rows ({o.contrastive_bench} -> "
              f"{get('flatmem_path_c')})")
    else:
        print(f"flatmem-c rows: {o.contrastive_bench} (no libflatmem found through ldd)")
    for tag in ("jax", "c"):
        if f"isa_{tag}" in info:
            print(f"flatmem CPU ISA ({tag}): {info[f'isa_{tag}']}")
    settings = [f"{k}={os.environ[k]}" for k in ("FLATMEM_CPU_ISA", "XLA_FLAGS", "FLATMEM_JAX_NUM_THREADS",
                                                  "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")
                if k in os.environ]
    print("environment (inherited by every child): " + (", ".join(settings) if settings else
                                                        "no thread/ISA/XLA settings (defaults)"))
    return info


def find(runs, b, name) -> Optional[Run]:
    for r in runs:
        if r.b == b and r.variant == name:
            return r
    return None


def loss_error(runs, r: Optional[Run]) -> float:
    """|L - L64| / |L64|: a run's loss against the float64 loss of its inputs (NaN without either)."""
    ref = reference_of(r.variant) if r is not None and r.ok else None
    x = find(runs, r.b, ref) if ref else None
    if not (x and x.ok):
        return math.nan
    a, p = r.get("loss"), x.get("loss")
    return abs(a - p) / abs(p) if math.isfinite(a) and math.isfinite(p) and p != 0 else math.nan


def error_cell(runs, r: Optional[Run]) -> str:
    e = loss_error(runs, r)
    return f"{e:.1e}" if math.isfinite(e) else "-"


def print_progress(r: Run, runs=()):
    v = BY_NAME[r.variant]
    line = f"  {r.variant:<29} "
    if not r.ok:
        print(line + (r.note if r.status != "failed" else f"FAILED: {r.note}"))
        return
    if v.role == "reference":
        print(line + f"loss {r.get('loss'):.15g} (float64, {seconds(r.get('ref_s'))})", flush=True)
        return
    if v.role != "baseline":
        line += f"best {seconds(r.time):<9} median {seconds(r.get('median_total_s')):<9} "
        warm = r.get("warmup_s")
        line += f"warm-up {seconds(warm):<9} " if math.isfinite(warm) else f"{'(C worker)':<18} "
    line += f"peak {size(r.peak):<10}"
    if v.baseline:
        line += f" extra {size(r.extra):<10}"
    if math.isfinite(r.get("loss")):
        line += f" loss {r.get('loss'):.7f} err {error_cell(runs, r)}"
    print(line, flush=True)


def selected(o):
    """The chosen variants, their baselines and float64 references first (references: with --ref-max-batch
    > 0)."""
    names = [n for n in o.variants]
    needed = []
    for n in names:
        for extra in (BY_NAME[n].baseline, reference_of(n) if o.ref_max_batch > 0 else None):
            if extra and extra not in needed and extra not in names:
                needed.append(extra)
    order = [v.name for v in VARIANTS]
    first = ("baseline", "reference")
    return sorted(needed + names, key=lambda n: (BY_NAME[n].role not in first, order.index(n)))


def rel_diff(r: Optional[Run], peer: Optional[Run]) -> float:
    if not (r and peer and r.ok and peer.ok):
        return math.nan
    a, p = r.get("loss"), peer.get("loss")
    return abs(a - p) / abs(p) if math.isfinite(a) and math.isfinite(p) and p != 0 else math.nan


def losses_of(o) -> list:
    """The (loss, dtype) pairs of the selected variants, in PEERS order."""
    chosen = {(BY_NAME[n].loss, BY_NAME[n].dtype) for n in o.variants
              if BY_NAME[n].role not in ("baseline", "reference")}
    return [pair for pair in PEERS if pair in chosen]


def print_tables(runs, o):
    for which, dtype in losses_of(o):
        print_loss_tables(runs, o, which, dtype)


def print_loss_tables(runs, o, which, dtype="fp32"):
    """The tables of one loss and dtype: its variants (and the baselines) against its plain-JAX peer."""
    peer_name = PEERS[(which, dtype)]
    suffix = ("" if which == "clip" else f" ({which} loss)") + ("" if dtype == "fp32" else f" ({dtype})")
    names = [n for n in selected(o) if BY_NAME[n].dtype == dtype and
             (BY_NAME[n].role == "baseline" or BY_NAME[n].loss == which)]
    flatmem = [n for n in names if BY_NAME[n].role == "flatmem"]
    cache = [n for n in names if BY_NAME[n].role == "cache"]
    main = flatmem[0] if flatmem else None
    print(f"\n### {LOSS_TITLES[which]}, {dtype}, d = {o.dim}: flatmem vs plain JAX "
          f"({cpu_model()}, {os.cpu_count()} threads)\n")
    if dtype != "fp32":
        print(f"q, k {dtype}: contrastive_bench's fp32 features rounded to nearest even; err: |L - L64| / |L64| "
              f"against the float64 loss of the rounded inputs.\n")
    cols = ["b", "JAX materialised", "err"] + [x for n in flatmem for x in (n, "err")]
    cols += ["cache variants (" + " / ".join(cache) + ")"] * bool(cache)
    cols += [f"{n} / JAX" for n in flatmem]
    cols += ["JAX peak RSS (extra)", f"{main} peak RSS (extra)" if main else "flatmem peak RSS",
             "memory ratio: peak (extra)"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---:|" * len(cols))
    for b in o.sizes:
        peer = find(runs, b, peer_name)
        m = find(runs, b, main) if main else None
        row = [str(b), time_cell(peer), error_cell(runs, peer)]
        row += [x for n in flatmem for x in (time_cell(find(runs, b, n)), error_cell(runs, find(runs, b, n)))]
        if cache:
            row.append(" / ".join(time_cell(find(runs, b, n)) for n in cache))
        row += [ratio((find(runs, b, n) or Run(b, n, "failed")).time / (peer.time if peer else math.nan))
                for n in flatmem]
        mem = lambda r: f"{size(r.peak)} ({size(r.extra)})" if r and r.ok else time_cell(r)  # noqa: E731
        row += [mem(peer), mem(m)]
        if peer and m and peer.ok and m.ok:
            row.append(f"{ratio(m.peak / peer.peak)} ({ratio(m.extra / peer.extra)})")
        else:
            row.append("-")
        print("| " + " | ".join(row) + " |")
    print("\nTimes: fastest of the timed calls (forward + backward, results blocked until ready); the "
          "first call, which compiles, is not timed. Peak RSS: the child process's ru_maxrss; extra: "
          "minus that of a baseline process of the same kind holding only q, k and arrays the size of "
          "dq, dk (inputs-jax for the JAX rows, inputs-c for the C rows). Ratios below 1 favour flatmem.")

    print(f"\n### Every variant{suffix}\n")
    print("| b | variant | best | median | warm-up | peak RSS | baseline | extra memory | loss | "
          "rel. diff to JAX | err vs float64 |")
    print("|---:|---|---:|---:|---:|---:|---|---:|---:|---:|---:|")
    for b in o.sizes:
        peer = find(runs, b, peer_name)
        for n in names:
            r = find(runs, b, n)
            if r is None:
                continue
            v = BY_NAME[n]
            if not r.ok:
                print(f"| {b} | {n} | {time_cell(r)} | | | | | | | | |")
                continue
            if v.role == "reference":
                print(f"| {b} | {n} | - | - | - | - | - | - | {r.get('loss'):.12f} | - | (float64, "
                      f"{seconds(r.get('ref_s'))}) |")
                continue
            loss = r.get("loss")
            print(f"| {b} | {n} | {seconds(r.time) if v.role != 'baseline' else '-'} | "
                  f"{seconds(r.get('median_total_s')) if v.role != 'baseline' else '-'} | "
                  f"{seconds(r.get('warmup_s'))} | {size(r.peak)} | {v.baseline or '-'} | "
                  f"{size(r.extra) if v.baseline else '-'} | "
                  f"{f'{loss:.7f}' if math.isfinite(loss) else '-'} | "
                  f"{f'{rel_diff(r, peer):.1e}' if n != peer_name and math.isfinite(rel_diff(r, peer)) else '-'} | "
                  f"{error_cell(runs, r)} |")

    if dtype != "fp32":  # no targets for the bf16 rows: their times beside the fp32 rows'
        print(f"\n### {dtype} beside fp32{'' if which == 'clip' else f' ({which} loss)'}\n")
        for n in [peer_name] + flatmem:
            twin = n[:-len("-" + dtype)] if n.endswith("-" + dtype) else None
            if twin not in BY_NAME:
                continue
            parts = []
            for b in o.sizes:
                r, f = find(runs, b, n), find(runs, b, twin)
                t = r.time / f.time if r and f and r.ok and f.ok else math.nan
                parts.append(f"b = {b}: {ratio(t)}")
            print(f"- {n} / {twin} (time): " + ", ".join(parts))
        print(f"\nloss agreement (relative difference to {peer_name}):", end="")
        for b in o.sizes:
            peer = find(runs, b, peer_name)
            diffs = [f"{n} {rel_diff(find(runs, b, n), peer):.1e}" for n in names
                     if math.isfinite(rel_diff(find(runs, b, n), peer)) and n != peer_name
                     and BY_NAME[n].role != "reference"]
            if diffs:
                print(f"  b={b}: " + ", ".join(diffs), end=";")
        print()
        return

    print(f"\n### Targets{suffix}\n")
    for n in flatmem:
        r, p = find(runs, TARGET_BATCH, n), find(runs, TARGET_BATCH, peer_name)
        t = r.time / p.time if r and p and r.ok and p.ok else math.nan
        m = r.peak / p.peak if r and p and r.ok and p.ok else math.nan
        both = ("not measured" if not (math.isfinite(t) and math.isfinite(m))
                else "MET" if t <= TARGET_TIME and m <= TARGET_MEMORY else "MISSED")
        print(f"- {n} (default options) <= {TARGET_TIME:.2f}x JAX's time at b = {TARGET_BATCH} with <= 1/"
              f"{round(1 / TARGET_MEMORY)} of its peak RSS: time {ratio(t)} ({verdict(t, TARGET_TIME)}), "
              f"peak RSS {ratio(m)} ({verdict(m, TARGET_MEMORY)}) -> {both}")
    for n in cache:
        parts, verdicts = [], []
        for b in CACHE_TARGET_BATCHES:
            r, p = find(runs, b, n), find(runs, b, peer_name)
            t = r.time / p.time if r and p and r.ok and p.ok else math.nan
            verdicts.append(verdict(t, CACHE_TARGET_TIME))
            note = f" [{r.note}]" if r and r.status == "n/a" else ""
            parts.append(f"b = {b}: {ratio(t)} ({verdicts[-1]}){note}")
        overall = ("MISSED" if "MISSED" in verdicts else "not measured" if "not measured" in verdicts
                   else "MET")
        print(f"- {n} (cache budget b^2*4 bytes) <= {CACHE_TARGET_TIME:.2f}x JAX's time at both "
              f"b = {' and '.join(map(str, CACHE_TARGET_BATCHES))}: {'; '.join(parts)} -> {overall}")

    floor = "gemm4-c" if which == "clip" else "gemm3-c"
    floors = [(b, find(runs, b, floor), find(runs, b, peer_name)) for b in o.sizes]
    floors = [(b, f.time / p.time) for b, f, p in floors if f and p and f.ok and p.ok]
    if floors and which == "sigmoid":
        print("- the floor on this machine: three GEMMs of b x b x d (the sigmoid loss's 6 b^2 d FLOPs, "
              "as many as JAX's) take " + ", ".join(f"{ratio(x)} JAX's time at b = {b}" for b, x in floors) +
              ". flatmem runs the same three products (as tiles) plus an element-wise pass: a time target "
              "far below this floor cannot be met on this machine without a faster sgemm than this "
              "OpenBLAS's.")
    elif floors:
        print("- the floor on this machine: four GEMMs of b x b x d (flatmem's 8 b^2 d FLOPs at default "
              "options) take " + ", ".join(f"{ratio(x)} JAX's time at b = {b}" for b, x in floors) +
              "; the three of the cache path about 3/4 of that ("
              + ", ".join(f"{ratio(0.75 * x)} at b = {b}" for b, x in floors) +
              "). A target below its floor cannot be met on this machine without fewer FLOPs or a "
              "faster sgemm than this OpenBLAS's.")

    print(f"\nloss agreement (relative difference to {peer_name}):", end="")
    for b in o.sizes:
        peer = find(runs, b, peer_name)
        diffs = [f"{n} {rel_diff(find(runs, b, n), peer):.1e}" for n in names
                 if math.isfinite(rel_diff(find(runs, b, n), peer)) and n != peer_name
                     and BY_NAME[n].role != "reference"]
        if diffs:
            print(f"  b={b}: " + ", ".join(diffs), end=";")
    print()


CSV_FIELDS = ["batch", "dim", "variant", "status", "total_s", "median_total_s", "reps", "warmup_s",
              "fwd_s", "bwd_s", "loss", "loss_rel_diff_vs_jax", "dscale", "peak_rss_bytes", "baseline",
              "baseline_peak_rss_bytes", "extra_bytes", "planned_extra_bytes", "machine_ram_bytes", "dtype",
              "loss_rel_err", "loss_dtype", "note"]


def write_csv(path, runs, o):
    def num(x):
        return f"{x:.9g}" if isinstance(x, float) and math.isfinite(x) else ""

    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(CSV_FIELDS)
        for r in runs:
            v = BY_NAME[r.variant]
            peer = find(runs, r.b, peer_of(r.variant)) if v.role != "reference" else None
            w.writerow([r.b, o.dim, r.variant, r.status, num(r.get("total_s")), num(r.get("median_total_s")),
                        num(r.get("reps")), num(r.get("warmup_s")), num(r.get("fwd_s")), num(r.get("bwd_s")),
                        num(r.get("loss")), num(rel_diff(r, peer)) if r.variant not in PEERS.values() else "",
                        num(r.get("dscale")), num(r.peak), v.baseline or "", num(r.baseline_peak),
                        num(r.extra), num(r.planned), num(machine_ram()), v.dtype, num(loss_error(runs, r)),
                        r.values.get("loss_dtype", ""), r.note.replace("\n", " ")])


def fastest(kept: Run, new: Run) -> Run:
    """Of two rounds of one variant: the faster run, with the larger peak RSS of the two (other
    work on the machine only ever adds time); a failure in any round stays a failure."""
    if kept.status == "failed":
        return kept
    if new.status == "failed" or (new.ok and not (kept.ok and kept.time <= new.time)):
        best = new
    else:
        best = kept
    if kept.ok and new.ok:
        best.peak = max(kept.peak, new.peak)
    return best


def main_driver(o) -> int:
    print_header(o)
    runs = []
    limit = o.mem_limit_gib * GiB
    names = selected(o)
    for b in o.sizes:
        inputs = 4.0 * 4.0 * b * o.dim
        print(f"\nb = {b} (q, k, dq, dk: {size(inputs)}; one b x b fp32 matrix: {size(4.0 * b * b)})", flush=True)
        for round_ in range(o.rounds):
            if o.rounds > 1:
                print(f" round {round_ + 1} of {o.rounds}", flush=True)
            for n in names:
                v = BY_NAME[n]
                kept = find(runs, b, n)
                if kept is not None and v.role in ("baseline", "reference"):
                    continue  # baselines and references run once
                base = find(runs, b, v.baseline) if v.baseline else None
                if v.baseline and not (base and base.ok):
                    r = Run(b, n, "skipped", f"not run (baseline {v.baseline} failed)")
                elif v.role == "reference" and b > o.ref_max_batch:
                    r = Run(b, n, "skipped", f"n/a (b > --ref-max-batch {o.ref_max_batch})")
                elif inputs + v.planned_bytes(b, o.dim) > limit:
                    r = Run(b, n, "skipped", f"n/a (needs ~{size(v.planned_bytes(b, o.dim))}, --mem-limit-gib)")
                else:
                    r = run_child(o, v, b)
                for run in (r,) if kept is None else (r, kept):
                    if base and base.ok and run.ok:
                        run.baseline_peak = base.peak
                        run.extra = run.peak - base.peak
                if round_ == 0 or r.status != "skipped":
                    print_progress(r, runs)  # this round's run
                if kept is None:
                    runs.append(r)
                else:
                    best = fastest(kept, r)
                    if base and base.ok and best.ok:
                        best.extra = best.peak - base.peak
                    runs[runs.index(kept)] = best
    print_tables(runs, o)
    if o.csv:
        write_csv(o.csv, runs, o)
        print(f"\nwrote {o.csv}")
    return 1 if any(r.status == "failed" for r in runs) else 0


def parse_args(argv):
    p = argparse.ArgumentParser(
        description="flatmem beside the plain-JAX materialised CLIP loss (forward + backward, fp32), "
                    "every variant in its own process.",
        epilog="variants: " + ", ".join(v.name for v in VARIANTS if v.role != "baseline"))
    p.add_argument("--sizes", default="4096,16384", help="batch sizes b (= c), comma-separated")
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--scale", type=float, default=14.3, help="logit scale s (contrastive_bench's 14.3)")
    p.add_argument("--reps", type=int, default=3, help="timed calls per variant; the fastest is reported")
    p.add_argument("--rounds", type=int, default=1,
                   help="run every variant of a size this many times in turn (a busy machine slows some "
                        "runs); the fastest run and the largest peak RSS are kept")
    p.add_argument("--loss", choices=("clip", "sigmoid", "all"), default="clip",
                   help="which loss's variants run by default (--variants overrides)")
    p.add_argument("--bias", type=float, default=BIAS, help="the sigmoid loss's logit bias t")
    p.add_argument("--variants", help="comma-separated; default: every variant of --loss and --dtypes")
    p.add_argument("--dtypes", default="fp32,bf16", help="the default variants' dtypes: fp32, bf16 (both)")
    p.add_argument("--ref-max-batch", type=int, default=65536,
                   help="float64 reference loss (the err columns) up to this b; 0: none")
    p.add_argument("--csv", help="write one row per (b, variant) here")
    p.add_argument("--mem-limit-gib", type=float, default=20.0,
                   help="skip variants whose planned memory exceeds this")
    p.add_argument("--contrastive-bench", default=os.path.join(ROOT, "build", "bench", "contrastive_bench"),
                   help="the C++ benchmark whose worker runs the flatmem-c rows")
    # child modes
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    p.add_argument("--result-fd", type=int, help=argparse.SUPPRESS)
    p.add_argument("--c-lib", default="", help=argparse.SUPPRESS)
    o = p.parse_args(argv)
    try:
        o.sizes = [int(x) for x in o.sizes.split(",") if x]
    except ValueError:
        p.error("--sizes: comma-separated integers")
    if not o.sizes or min(o.sizes) < 1 or o.dim < 1 or o.reps < 1 or o.rounds < 1:
        p.error("sizes, --dim, --reps and --rounds must be >= 1")
    o.dtypes = [x for x in o.dtypes.split(",") if x]
    if not o.dtypes or any(x not in DTYPES for x in o.dtypes):
        p.error(f"--dtypes: comma-separated, of {', '.join(DTYPES)}")
    if o.variants is None:
        o.variants = [v.name for v in VARIANTS if v.role not in ("baseline", "reference")
                      and o.loss in (v.loss, "all") and v.dtype in o.dtypes]
    else:
        o.variants = [x for x in o.variants.split(",") if x]
    for n in o.variants:
        if n not in BY_NAME:
            p.error(f"unknown variant {n!r} (known: {', '.join(BY_NAME)})")
    return o


def main(argv=None) -> int:
    o = parse_args(sys.argv[1:] if argv is None else argv)
    if o.worker:
        out = os.fdopen(o.result_fd, "w") if o.result_fd is not None else sys.stdout
        try:
            if o.worker == "info":
                return info_worker(o, out)
            if o.worker not in BY_NAME or BY_NAME[o.worker].runner != "jax":
                raise SystemExit(f"jax_peer_bench: no JAX worker {o.worker!r}")
            return jax_worker(o, out)
        except Exception as e:  # noqa: BLE001 -- reported to the driver, which marks the row failed
            out.write("error=" + f"{type(e).__name__}: {e}".replace("\n", " ")[:2000] + "\n")
            raise
        finally:
            out.flush()
    return main_driver(o)


if __name__ == "__main__":
    sys.exit(main())
