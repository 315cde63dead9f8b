"""The float64 reference of flatmem's sigmoid (SigLIP) loss and its error
bounds as the JAX tests take them (tuples; the reference itself is the Python
binding's tests/python_sigmoid_reference.py: the formulas of
include/flatmem/flatmem.h, "Sigmoid (SigLIP) loss", with the whole b x c logit
matrix materialised), plus the bound of a gradient scaled by a cotangent.

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

import python_sigmoid_reference as _python
from python_reference import U32, _round_bound


def sigmoid_reference(q, k, s, t, labels=None, g=1.0):
    """(loss, dq, dk, ds, dt, G) in float64: the loss and the gradients of g L
    (python_sigmoid_reference.sigmoid_reference, as a tuple)."""
    r = _python.sigmoid_reference(q, k, s, t, labels, g)
    return r["loss"], r["dq"], r["dk"], r["ds"], r["dt"], r["G"]


def sigmoid_tolerances(q, k, s, t, labels=None, dtype=np.float32):
    """Bounds (loss, tau_dq, tau_dk, ds, dt) on flatmem's loss and gradients
    of L (g = 1), dq and dk stored in dtype (1. to 4. above;
    python_sigmoid_reference.sigmoid_tolerances, as a tuple)."""
    tol = _python.sigmoid_tolerances(q, k, s, t, labels, 1.0, dtype)
    return tol["loss"], tol["dq"], tol["dk"], tol["ds"], tol["dt"]


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
