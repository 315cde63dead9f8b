"""flatmem_jax's losses and gradients against the float64 NumPy reference, within
the worst-case error bounds derived in tests/support/tolerance.hpp.

The reference and the bounds are the Python binding's
(bindings/python/tests/python_reference.py, put on sys.path by conftest.py), so
every Python-side test is held to one derivation. The bounds are measured on
each quantity's natural scale -- an element of dq errs by s * eps * sum_j
W_ij |k_jt| (W: the softmax weights), not by a fraction of the largest dq -- so
they hold where the exact gradient is 0 (b = 1, perfectly matched pairs) and
on every CPU instruction set (FLATMEM_CPU_ISA), whose rounding differs.
16-bit inputs are compared with the reference on the same rounded values
(widening to fp32 is exact); 16-bit gradients get half an ulp more."""
import jax.numpy as jnp
import numpy as np

from python_reference import contrastive_reference, forward_tolerance, gradient_tolerances


def unit_rows(seed, rows, d, dtype=jnp.float32):
    """Unit-norm random rows (as CLIP features are), rounded to dtype."""
    x = np.random.default_rng(seed).standard_normal((rows, d))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return jnp.asarray(x, jnp.float32).astype(dtype)


def widened(x):
    """The values flatmem computes with: x widened to fp32, then to float64."""
    return np.asarray(jnp.asarray(x).astype(jnp.float32), np.float64)


def fp32(s):
    """The logit scale as flatmem receives it (one fp32 element)."""
    return float(np.asarray(s, np.float32).reshape(()))


def _problem(q, k, s, labels):
    return widened(q), widened(k), fp32(s), None if labels is None else np.asarray(labels)


def check_loss(got, q, k, s, labels=None, symmetric=True):
    """got: flatmem's loss (fp32 scalar) for features q, k and scale s."""
    assert got.dtype == jnp.float32 and got.shape == ()
    q64, k64, s, labels = _problem(q, k, s, labels)
    want = contrastive_reference(q64, k64, s, labels, symmetric)[0]
    tol = forward_tolerance(q64, k64, s, want)
    assert abs(float(got) - want) <= tol, f"loss {float(got)!r}, reference {want!r}, bound {tol:.3g}"
    assert float(got) >= 0.0, f"loss {float(got)!r} < 0: every term lse_i - x_ii is >= 0"


def check_grads(grads, q, k, s, labels=None, symmetric=True, g=1.0, rows=slice(None),
                cols=slice(None)):
    """grads = (dq, dk[, ds]) of g * L, flatmem's, in q's dtype (ds fp32).
    rows, cols: the rows of dq and dk that grads hold (default all): a rank's
    shard of the global batch q, k in the ring, whose ds is the global one.
    The bounds hold for any order of the fp32 sums (gamma_n bounds every
    order), so they cover the ring's, which merges per-rank blocks as one
    process merges its tiles."""
    q64, k64, s, labels = _problem(q, k, s, labels)
    _, ref_dq, ref_dk, ref_ds, _, _ = contrastive_reference(q64, k64, s, labels, symmetric)
    dtype = np.dtype(jnp.asarray(q).dtype)
    tau_dq, tau_dk, tau_ds = gradient_tolerances(q64, k64, s, labels, symmetric, g, dtype)
    for name, got, want, tau in (("dq", grads[0], (g * ref_dq)[rows], tau_dq[rows]),
                                 ("dk", grads[1], (g * ref_dk)[cols], tau_dk[cols])):
        assert got.shape == want.shape and got.dtype == dtype, (name, got.shape, got.dtype)
        err = np.abs(widened(got) - want)
        worst = np.unravel_index(np.argmax(err / tau), err.shape)
        assert np.all(err <= tau), (f"{name}: worst at {worst}: got {widened(got)[worst]!r}, "
                                    f"reference {want[worst]!r}, bound {tau[worst]:.3g}")
    if len(grads) > 2:
        check_scale_grad(grads[2], q, k, s, labels, symmetric, g)


def scale_grad_reference(q, k, s, labels=None, symmetric=True, g=1.0):
    """(d(g L)/ds of the reference, the bound on flatmem's error in it)."""
    q64, k64, s, labels = _problem(q, k, s, labels)
    want = g * contrastive_reference(q64, k64, s, labels, symmetric)[3]
    return want, gradient_tolerances(q64, k64, s, labels, symmetric, g)[2]


def check_scale_grad(got, q, k, s, labels=None, symmetric=True, g=1.0, factor=1.0):
    """got: d(g L)/ds times `factor` (e.g. s for d/dlog s), fp32."""
    assert jnp.asarray(got).dtype == jnp.float32
    want, tau = scale_grad_reference(q, k, s, labels, symmetric, g)
    want, tau = factor * want, abs(factor) * tau + 2.0**-23 * abs(factor * want)  # + the fp32 product
    got = float(np.asarray(got).reshape(()))
    assert abs(got - want) <= tau, f"ds {got!r}, reference {want!r}, bound {tau:.3g}"


def check_sigmoid(loss, grads, q, k, s, t, labels=None, g=1.0, rows=slice(None), cols=slice(None)):
    """flatmem's sigmoid loss (fp32 scalar, or None to skip) and grads =
    (dq, dk, ds, dt) of g * L (any prefix of them, None to skip one; dq, dk
    in q's dtype)
    against the float64 reference of sigmoid_reference.py, within its bounds.
    rows, cols: the rows of dq and dk that grads hold (a ring rank's shard of
    the global q, k; its ds and dt are the global ones)."""
    from sigmoid_reference import scaled_tolerance, sigmoid_reference, sigmoid_tolerances
    q64, k64, s, labels = _problem(q, k, s, labels)
    t = fp32(t)
    dtype = np.dtype(jnp.asarray(q).dtype)
    want = sigmoid_reference(q64, k64, s, t, labels)[:5]
    tau = sigmoid_tolerances(q64, k64, s, t, labels, dtype)
    if loss is not None:
        assert loss.dtype == jnp.float32 and loss.shape == ()
        assert abs(float(loss) - want[0]) <= tau[0], f"loss {float(loss)!r}, reference {want[0]!r}, bound {tau[0]:.3g}"
    names = ("dq", "dk", "ds", "dt")
    parts = (rows, cols, (), ())
    for name, got, ref, bound, part in zip(names, grads, want[1:], tau[1:], parts):
        if got is None:
            continue
        ref, bound = np.asarray(ref)[part], np.asarray(bound)[part]
        out_dtype = dtype if name in ("dq", "dk") else np.dtype(np.float32)
        bound = scaled_tolerance(bound, ref, g, out_dtype)
        ref = g * ref
        got = jnp.asarray(got)
        assert got.dtype == out_dtype and got.shape == np.shape(ref), (name, got.shape, got.dtype)
        err = np.abs(widened(got) - ref)
        worst = np.unravel_index(np.argmax(err / bound), err.shape) if err.ndim else ()
        assert np.all(err <= bound), (f"{name}: worst at {worst}: got {widened(got)[worst]!r}, "
                                      f"reference {ref[worst]!r}, bound {bound[worst]:.3g}")
