"""flatmem_jax's XLA:CUDA handlers on a real GPU, against plain JAX on the same GPU.

Run by scripts/gpu-check.sh (step jax) on a machine with a GPU and a CUDA jaxlib; not
collected by pytest (no test_ prefix): CI has no GPU. Every flatmem call below runs as an
XLA custom call on the GPU (the arrays live there; jax.jit and jax.grad as a user writes
them), and is compared with the same loss written in jax.numpy (float32, matmuls at
Precision.HIGHEST, every intermediate materialised) on the same inputs:

  clip_loss, infonce_loss (labels, c > b), sigmoid_loss: the loss and the gradients of
      q, k, the scale (and the bias) under jax.jit(jax.value_and_grad), float32 and bfloat16
      inputs, shapes 1 x 1, primes, not multiples of the 64 x 128 tile, 1024 x 768;
  reversible_transformer: (y1, y2) and the gradients of x1, x2 and every parameter under
      jax.jit(jax.grad), modes vanilla / overlapped / auto, math fp32 and tf32.

Contrastive results are judged by a float64 NumPy reference on the values flatmem
computes with (bf16 inputs widened exactly), element by element, within bounds from the
arithmetic: delta bounds the error of one logit (TF32 products for float32 inputs, flatmem's
CUDA default: 2^-10 s sum_t |q_t k_t| <= 2^-10 s for unit rows; exact products for bf16;
plus fp32 accumulation, (d + 2) 2^-24 s); a softmax weight then moves by a factor
e^{+-2 delta} (a sigmoid one by sigma' delta <= |G| delta), so G = dL/dx errs by
2.02 delta (|G| + 2 [positive] / b) (sigmoid: 1.01 delta |G|); Gt and k are rounded to the
product's operand type (2^-10 for TF32 pairs, 2^-8 for bf16), dq and dk to their own
type (2^-8 bf16); ds = sum G raw and dt = sum G add the logit error of raw (delta / s).
The plain-JAX float32 loss on the GPU (Precision.HIGHEST, materialised) is printed
beside it as a second opinion.
Reversible results are compared with plain JAX (jax_reversible_reference.py, float32,
HIGHEST, ordinary autodiff) on the GPU: fp32 math within 1e-4 of each result's largest
element (fp32 GEMMs in another order through 3 blocks), tf32 math within 3e-2 (2^-10 per
product through 3 blocks).
A wrong stream, buffer, workspace or attribute gives errors of order 1, far past these.
Exit status 0 when every comparison holds; each one prints its worst error and bound.
    python3 bindings/jax/tests/gpu_check.py [--cpu]   (FLATMEM_JAX_LIBRARY: the handler library;
    PYTHONPATH: bindings/jax/python and bindings/jax/tests)
"""
import math
import sys

import jax
import jax.numpy as jnp
import numpy as np

import flatmem_jax
import jax_reversible_reference as reversible_reference

HIGHEST = jax.lax.Precision.HIGHEST
failures = []
# --cpu: the same comparisons with flatmem's CPU handlers and JAX on the CPU, to check this
# script itself where there is no GPU (not a check of the CUDA handlers).
PLATFORM = "cpu" if "--cpu" in sys.argv[1:] else "gpu"


def report(name, err, bound):
    ok = bool(err <= bound)
    print(f"  {'ok  ' if ok else 'FAIL'} {name:<58} err {err:10.3e}  bound {bound:10.3e}", flush=True)
    if not ok:
        failures.append(name)


def unit_rows(seed, rows, d, dtype):
    x = np.random.default_rng(seed).standard_normal((rows, d))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return jnp.asarray(x, jnp.float32).astype(dtype)


# --- plain JAX losses (float32, materialised) ---------------------------------------------
def logits(q, k, s):
    return s * jnp.matmul(q.astype(jnp.float32), k.astype(jnp.float32).T, precision=HIGHEST)


def clip_plain(q, k, s):
    x = logits(q, k, s)
    diag = jnp.diagonal(x)
    rows = jax.nn.logsumexp(x, axis=1) - diag
    cols = jax.nn.logsumexp(x, axis=0) - diag
    return 0.5 * (jnp.mean(rows) + jnp.mean(cols))


def infonce_plain(q, k, s, labels):
    x = logits(q, k, s)
    return jnp.mean(jax.nn.logsumexp(x, axis=1) - x[jnp.arange(q.shape[0]), labels])


def sigmoid_plain(q, k, s, t):
    x = logits(q, k, s) + t
    z = 2.0 * jnp.eye(q.shape[0], k.shape[0], dtype=jnp.float32) - 1.0
    return -jnp.sum(jax.nn.log_sigmoid(z * x)) / q.shape[0]


def max_err(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.max(np.abs(got - want))) if got.size else 0.0


def scale_of(x):
    return float(np.max(np.abs(np.asarray(x, np.float64)))) if np.asarray(x).size else 0.0


def widened(x):
    return np.asarray(jnp.asarray(x).astype(jnp.float32), np.float64)


def reference(kind, q, k, s, t, labels):
    """float64: (loss, G = dL/dx, dq, dk, ds, dt, |dG| bound per unit delta, raw)."""
    b, c = q.shape[0], k.shape[0]
    raw = q @ k.T
    x = s * raw + (t if kind == "sigmoid" else 0.0)
    pos = np.zeros((b, c))
    pos[np.arange(b), np.arange(b) if labels is None else labels] = 1.0
    if kind == "sigmoid":
        z = 2.0 * pos - 1.0
        v = -z * x
        loss = float(np.sum(np.logaddexp(0.0, v)) / b)
        G = -z / (1.0 + np.exp(-v)) / b
        dG = 1.01 * np.abs(G)
    else:
        P = np.exp(x - x.max(axis=1, keepdims=True))
        P /= P.sum(axis=1, keepdims=True)
        row_terms = np.log(np.sum(np.exp(x - x.max(axis=1, keepdims=True)), axis=1)) + x.max(axis=1)
        if kind == "clip":
            Pc = np.exp(x - x.max(axis=0, keepdims=True))
            Pc /= Pc.sum(axis=0, keepdims=True)
            col_terms = np.log(np.sum(np.exp(x - x.max(axis=0, keepdims=True)), axis=0)) + x.max(axis=0)
            diag = np.diagonal(x)
            loss = float(0.5 * (np.mean(row_terms - diag) + np.mean(col_terms - diag)))
            G = (P - pos) / (2 * b) + (Pc - pos) / (2 * b)
        else:
            loss = float(np.mean(row_terms - x[np.arange(b), labels]))
            G = (P - pos) / b
        dG = 2.02 * (np.abs(G) + 2.0 * pos / b)
    return loss, G, s * G @ k, s * G.T @ q, float(np.sum(G * raw)), float(np.sum(G)), dG, raw


def contrastive_case(kind, dtype, b, c, d, s=10.0, t=-10.0):
    q = unit_rows(1000 + b, b, d, dtype)
    k = unit_rows(2000 + c, c, d, dtype)
    labels = None
    if kind == "infonce":
        labels = np.random.default_rng(b).integers(0, c, size=b)
    s_arr, t_arr = jnp.float32(s), jnp.float32(t)
    if kind == "clip":
        fm_loss = lambda q, k, s, t: flatmem_jax.clip_loss(q, k, s)
        plain = lambda q, k, s, t: clip_plain(q, k, s)
    elif kind == "infonce":
        lab = jnp.asarray(labels, jnp.int32)
        fm_loss = lambda q, k, s, t: flatmem_jax.infonce_loss(q, k, s, lab)
        plain = lambda q, k, s, t: infonce_plain(q, k, s, lab)
    else:
        fm_loss = lambda q, k, s, t: flatmem_jax.sigmoid_loss(q, k, s, t)
        plain = sigmoid_plain
    argnums = (0, 1, 2, 3) if kind == "sigmoid" else (0, 1, 2)
    loss, grads = jax.jit(jax.value_and_grad(fm_loss, argnums=argnums))(q, k, s_arr, t_arr)
    plain_loss = float(jax.jit(plain)(q, k, s_arr, t_arr))
    for x in (loss,) + tuple(grads):
        assert next(iter(x.devices())).platform == PLATFORM, f"flatmem's result is not on the {PLATFORM}"

    q64, k64 = widened(q), widened(k)
    ref_loss, G, dq, dk, ds, dt, dG, raw = reference(kind, q64, k64, s, t, labels)
    bf16 = dtype == jnp.bfloat16
    delta = (0.0 if bf16 else 2.0**-10 * s) + (d + 2) * 2.0**-24 * s
    u_op = 2.0**-8 if bf16 else 2.0**-10
    u_out = 2.0**-8 if bf16 else 2.0**-24
    W = delta * dG + u_op * np.abs(G) + (c + b) * 2.0**-24 * np.abs(G)  # per-entry error of G as used
    bounds = {
        "dq": s * W @ np.abs(k64) + u_out * np.abs(dq) + 1e-30,
        "dk": s * W.T @ np.abs(q64) + u_out * np.abs(dk) + 1e-30,
        "ds": float(np.sum(delta * dG * np.abs(raw) + np.abs(G) * delta / s)) + 1e-5 * abs(ds) + 1e-30,
        "dt": float(np.sum(delta * dG)) + 1e-5 * abs(dt) + 1e-30,
    }
    loss_bound = (1.01 * delta * float(np.sum(np.abs(G))) if kind == "sigmoid" else 2.02 * delta) \
        + 1e-6 * abs(ref_loss) + 1e-30
    name = f"{kind} {jnp.dtype(dtype).name} b={b} c={c} d={d}"
    report(f"{name} loss (plain JAX fp32 off by {abs(plain_loss - ref_loss):.1e})",
           abs(float(loss) - ref_loss), loss_bound)
    for label, got, want in zip(("dq", "dk", "ds", "dt"), grads, (dq, dk, ds, dt)):
        if label in ("dq", "dk"):
            assert got.dtype == dtype, (label, got.dtype)
            ratio = np.abs(widened(got) - want) / bounds[label]
            worst = np.unravel_index(np.argmax(ratio), ratio.shape)
            report(f"{name} {label} (worst element)", abs(float(widened(got)[worst]) - want[worst]),
                   float(bounds[label][worst]))
        else:
            report(f"{name} {label}", abs(float(got) - want), bounds[label])


def reversible_case(mode, math_name):
    rng = np.random.default_rng(7)
    depth, batch, tokens, width, heads = 3, 2, 17, 48, 3
    params = reversible_reference.random_parameters(rng, depth, width)
    x1 = jnp.asarray(rng.standard_normal((batch, tokens, width)), jnp.float32)
    x2 = jnp.asarray(rng.standard_normal((batch, tokens, width)), jnp.float32)
    cot1 = jnp.asarray(rng.standard_normal(x1.shape), jnp.float32)
    cot2 = jnp.asarray(rng.standard_normal(x1.shape), jnp.float32)

    def objective(f):
        def loss(x1, x2, params):
            y1, y2 = f(x1, x2, params)
            return jnp.sum(y1 * cot1) + jnp.sum(y2 * cot2), (y1, y2)
        return jax.jit(jax.grad(loss, argnums=(0, 1, 2), has_aux=True))

    fm = objective(lambda a, b_, p: flatmem_jax.reversible_transformer(a, b_, p, heads=heads, mode=mode,
                                                                       math=math_name))
    ref = objective(lambda a, b_, p: reversible_reference.reversible_transformer(a, b_, p, heads))
    (g_fm, y_fm), (g_ref, y_ref) = fm(x1, x2, params), ref(x1, x2, params)
    frac = 1e-4 if math_name == "fp32" else 3e-2
    name = f"reversible {mode} {math_name} depth {depth} (batch {batch}, {tokens} tokens, width {width})"
    for label, got, want in (("y1", y_fm[0], y_ref[0]), ("y2", y_fm[1], y_ref[1]),
                             ("dx1", g_fm[0], g_ref[0]), ("dx2", g_fm[1], g_ref[1])):
        assert next(iter(got.devices())).platform == PLATFORM
        report(f"{name} {label}", max_err(got, want), frac * scale_of(want))
    worst, worst_bound = 0.0, 0.0
    for got, want in zip(jax.tree_util.tree_leaves(g_fm[2]), jax.tree_util.tree_leaves(g_ref[2])):
        err, bound = max_err(got, want), frac * scale_of(want) + 1e-6
        if err / bound > worst / max(worst_bound, 1e-300):
            worst, worst_bound = err, bound
    report(f"{name} parameter grads (worst of {len(jax.tree_util.tree_leaves(g_ref[2]))})", worst, worst_bound)


def main():
    devices = jax.devices()
    print(f"jax {jax.__version__}; devices {devices}; flatmem_jax {flatmem_jax.library_path}, "
          f"CUDA handlers: {flatmem_jax.has_cuda}", flush=True)
    if PLATFORM == "gpu" and (devices[0].platform != "gpu" or not flatmem_jax.has_cuda):
        print("gpu_check: needs a CUDA jaxlib with a GPU and libflatmem_jax.so built with its CUDA handlers")
        return 1
    if PLATFORM == "cpu":
        jax.config.update("jax_platforms", "cpu")
    print("contrastive losses, jax.jit(jax.value_and_grad), flatmem on XLA:CUDA vs plain JAX on the GPU:")
    for dtype in (jnp.float32, jnp.bfloat16):
        for b, d in ((1, 1), (7, 33), (97, 64), (300, 130), (1024, 768)):
            contrastive_case("clip", dtype, b, b, d)
        contrastive_case("infonce", dtype, 97, 131, 64)
        contrastive_case("infonce", dtype, 300, 257, 130)
        for b, c, d in ((1, 1, 1), (97, 131, 64), (300, 300, 130)):
            contrastive_case("sigmoid", dtype, b, c, d)
    print("reversible_transformer, jax.jit(jax.grad), flatmem on XLA:CUDA vs plain JAX on the GPU:")
    for math_name in ("fp32", "tf32"):
        for mode in ("vanilla", "overlapped", "auto"):
            reversible_case(mode, math_name)
    print(f"gpu_check: {len(failures)} comparison(s) failed" + (": " + ", ".join(failures) if failures else ""))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
