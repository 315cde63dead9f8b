"""An independent float64 NumPy reference of flatmem's sigmoid (SigLIP) loss,
by the formulas of include/flatmem/flatmem.h ("Sigmoid (SigLIP) loss"), with
the whole b x c logit matrix materialised, and the error bounds of flatmem's
fp32 computation against it.

The bounds are those derived in tests/contrastive/sigmoid_reference.hpp (the C
suite), term for term (u = 2^-24, gamma_n = n u / (1 - n u), first order, times
SLACK = 2):
 1. every logit x = fl(fl(s fl(<q_i, k_j>)) + t) is within
    dx = s gamma_{d+2} A + u |t|  (R_ij = sum_t |q_it k_jt|, A = max R);
 2. the loss within dx sum_ij |G_ij| + 4u c + 2u |L|  (G for g = 1);
 3. each s G_ij within s |G_ij| eps_G, eps_G = dx + 10u, plus s |g| / b 2^-125
    where exp(-|v|) underflows; dq_it = sum_j s G_ij k_jt, an fp32 sum of c
    terms:  tau_dq = s [(eps_G + gamma_c) sum_j |G_ij k_jt| + |g|/b 2^-125 sum_j |k_jt|]
    (dk likewise over the b rows); ds = sum G_ij raw_ij within
    (eps_G + gamma_d) sum |G| R, dt = sum G_ij within eps_G sum |G|, both
    rounded to fp32 (2u |value|);
 4. 16-bit gradients: the fp32 value rounded once (half an ulp: 2^-8 relative
    for bfloat16, 2^-11 + 2^-25 absolute for float16), as python_reference.py.
16-bit inputs are widened exactly, so the reference is evaluated on the same
rounded values. These are worst-case bounds; a wiring defect (dq and dk
swapped, the cotangent dropped, t ignored, a wrong sign of z) moves results by
O(1/b) or more, orders of magnitude above them at the sizes tested."""
import numpy as np

from python_reference import SLACK, U32, _round_bound, gamma


def _softplus(v):
    return np.maximum(v, 0.0) + np.log1p(np.exp(-np.abs(v)))


def _sigmoid(v):
    e = np.exp(-np.abs(v))
    return np.where(v >= 0.0, 1.0 / (1.0 + e), e / (1.0 + e))


def _positives(b, c, labels):
    """z: +1 at (i, y_i), -1 elsewhere."""
    y = np.arange(b) if labels is None else np.asarray(labels, np.int64)
    z = -np.ones((b, c))
    z[np.arange(b), y] = 1.0
    return z


def sigmoid_reference(q, k, s, t, labels=None, g=1.0):
    """(loss, dq, dk, ds, dt, G) in float64: the loss and the gradients of g L.

    x_ij = s <q_i, k_j> + t, v_ij = -z_ij x_ij, L = (1/b) sum_ij softplus(v_ij),
    G_ij = g (-z_ij) sigmoid(v_ij) / b, dq = s G k, dk = s G^T q,
    ds = sum_ij G_ij <q_i, k_j>, dt = sum_ij G_ij."""
    q = np.asarray(q, np.float64)
    k = np.asarray(k, np.float64)
    b, c = q.shape[0], k.shape[0]
    dot = q @ k.T
    z = _positives(b, c, labels)
    v = -z * (s * dot + t)
    loss = np.sum(_softplus(v)) / b
    G = g * -z * _sigmoid(v) / b
    return loss, s * G @ k, s * G.T @ q, np.sum(G * dot), np.sum(G), G


def sigmoid_tolerances(q, k, s, t, labels=None, dtype=np.float32):
    """Bounds (loss, tau_dq, tau_dk, ds, dt) on flatmem's loss and gradients
    of L (g = 1), dq and dk stored in dtype (1. to 4. above)."""
    q64, k64 = np.asarray(q, np.float64), np.asarray(k, np.float64)
    qa, ka = np.abs(q64), np.abs(k64)
    (b, d), c = q64.shape, k64.shape[0]
    loss, dq, dk, ds, dt, G = sigmoid_reference(q64, k64, s, t, labels)
    R = qa @ ka.T
    A = np.max(R)
    dx = s * gamma(d + 2) * A + U32 * abs(t)
    G_abs = np.abs(G)
    eps_g = dx + 10 * U32
    underflow = 2.0**-125 / b
    tau_loss = SLACK * (dx * np.sum(G_abs) + 4 * U32 * c + 2 * U32 * abs(loss))
    tau_dq = SLACK * s * ((eps_g + gamma(c)) * (G_abs @ ka) + underflow * ka.sum(axis=0)[None, :])
    tau_dk = SLACK * s * ((eps_g + gamma(b)) * (G_abs.T @ qa) + underflow * qa.sum(axis=0)[None, :])
    tau_ds = SLACK * ((eps_g + gamma(d)) * np.sum(G_abs * R) + underflow * b * c * A) + 2 * U32 * abs(ds)
    tau_dt = SLACK * (eps_g * np.sum(G_abs) + underflow * b * c) + 2 * U32 * abs(dt)
    return (tau_loss, _round_bound(tau_dq, dq, dtype), _round_bound(tau_dk, dk, dtype), tau_ds,
            tau_dt)


def scaled_tolerance(tau, ref, g, dtype=np.float32):
    """The bound on g x, x a gradient of L within tau of the reference ref
    (of L): |g| tau, plus the fp32 product by g and, for a 16-bit x, one more
    rounding to dtype (flatmem_jax scales saved gradients by the cotangent;
    flatmem's own backward multiplies G by g inside, which this covers too)."""
    tau, ref = np.asarray(tau, np.float64), np.abs(g * np.asarray(ref, np.float64))
    scaled = abs(g) * tau
    if g == 1.0:
        return scaled
    return _round_bound(scaled + U32 * (ref + scaled), ref, dtype)
