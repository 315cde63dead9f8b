"""An independent float64 NumPy reference of flatmem's sigmoid (SigLIP) loss,
by the formulas of include/flatmem/flatmem.h ("Sigmoid (SigLIP) loss",
materialised b x c logits), and the error bounds the tests hold the library
to: the derivation of tests/contrastive/sigmoid_reference.hpp (the C suite),
with python_reference's unit roundoff, gamma_n, SLACK and 16-bit output
rounding."""
import numpy as np
from python_reference import SLACK, U32, _round_bound, gamma, magnitudes

U64 = 2.0**-53  # fp64 unit roundoff
# max_v |softplus'''(v)| = max |sigma (1 - sigma) (1 - 2 sigma)| = 1 / (6 sqrt 3)
SOFTPLUS_D3 = 1.0 / (6.0 * np.sqrt(3.0))


def softplus(v):
    """log(1 + e^v) in the stable form max(v, 0) + log1p(exp(-|v|))."""
    return np.maximum(v, 0.0) + np.log1p(np.exp(-np.abs(v)))


def sigmoid(v):
    """1 / (1 + e^-v) without overflow: e = exp(-|v|), 1/(1+e) or e/(1+e)."""
    e = np.exp(-np.abs(v))
    return np.where(v >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def signs(b, c, labels):
    """z (b, c): +1 at (i, y_i), -1 elsewhere; y_i = labels[i] or i."""
    y = np.arange(b) if labels is None else np.asarray(labels)
    z = -np.ones((b, c))
    z[np.arange(b), y] = 1.0
    return z


def sigmoid_reference(q, k, s, t, labels=None, g=1.0):
    """dict(loss, dq, dk, ds, dt, G) in float64 for the upstream gradient g
    (loss is L itself, the gradients those of g L):

    x_ij = s <q_i, k_j> + t,  v = -z x,  L = (1/b) sum_ij softplus(v_ij)
    G_ij = g (-z_ij) sigmoid(v_ij) / b
    dq = s G k,  dk = s G^T q,  ds = sum_ij G_ij <q_i, k_j>,  dt = sum_ij G_ij.
    """
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    b, c = q.shape[0], k.shape[0]
    dot = q @ k.T
    z = signs(b, c, labels)
    v = -z * (s * dot + t)
    G = g * -z * sigmoid(v) / b
    return {"loss": np.sum(softplus(v)) / b, "dq": s * G @ k, "dk": s * G.T @ q,
            "ds": np.sum(G * dot), "dt": np.sum(G), "G": G}


def sigmoid_tolerances(q, k, s, t, labels=None, g=1.0, dtype=np.float32):
    """dict(loss, dq, dk, ds, dt) of bounds on |library - reference| (dq, dk
    element-wise, in the output dtype), as derived in
    tests/contrastive/sigmoid_reference.hpp:

    1. logits: dx = s gamma_{d+2} A + u |t|, A = max_ij sum_t |q_it k_jt|;
    2. loss: dx sum_ij |G_ij| (g = 1) + 4u c (exp, log1p, the double sums)
       + 2u |L|;
    3. each s G_ij within s |G_ij| eps_G, eps_G = dx + 10u, plus
       s |g| / b 2^-125 where exp(-|v|) underflows; the fp32 GEMMs add
       gamma_c (dq) / gamma_b (dk) relative to sum |G| |k| (|q|);
       ds adds gamma_d to R = sum_t |q_it k_jt|; dt and ds are rounded to fp32;
    4. 16-bit dq / dk are the fp32 values rounded once (python_reference).
    All times SLACK = 2 for second-order terms."""
    q64, k64, qa, ka, R = magnitudes(q, k)
    b, d = q64.shape
    c = k64.shape[0]
    ref = sigmoid_reference(q64, k64, s, t, labels, g)
    G_abs = np.abs(ref["G"])
    dx = s * gamma(d + 2) * np.max(R) + U32 * abs(t)
    sum_g1 = np.sum(np.abs(sigmoid_reference(q64, k64, s, t, labels)["G"]))
    eps_g = dx + 10 * U32
    underflow = abs(g) / b * 2.0**-125
    tau_dq = SLACK * s * ((eps_g + gamma(c)) * (G_abs @ ka) + underflow * ka.sum(axis=0)[None, :])
    tau_dk = SLACK * s * ((eps_g + gamma(b)) * (G_abs.T @ qa) + underflow * qa.sum(axis=0)[None, :])
    return {
        "loss": SLACK * (dx * sum_g1 + 4 * U32 * c + 2 * U32 * abs(ref["loss"])),
        "dq": _round_bound(tau_dq, ref["dq"], dtype),
        "dk": _round_bound(tau_dk, ref["dk"], dtype),
        "ds": SLACK * ((eps_g + gamma(d)) * np.sum(G_abs * R) + underflow * b * c * np.max(R))
        + 2 * U32 * abs(ref["ds"]),
        "dt": SLACK * (eps_g * np.sum(G_abs) + underflow * b * c) + 2 * U32 * abs(ref["dt"]),
    }


def finite_difference(q, k, s, t, labels, wrt, h):
    """(central difference of the float64 reference loss in s or t with step
    h, its error bound). Error: truncation h^2 / 6 max |L'''| on [x - h,
    x + h], where L''' = (1/b) sum_ij (dv_ij/dx)^3 softplus'''(v_ij) and
    dv/dt = -z, dv/ds = -z <q_i, k_j>; plus the rounding of the two float64
    losses (b c terms, each within a few ulp: gamma_{b c + d + 8} sum
    softplus) divided by 2 h."""
    q64 = np.asarray(q, np.float64)
    k64 = np.asarray(k, np.float64)
    b = q64.shape[0]
    dot = q64 @ k64.T

    def loss(scale, bias):
        return sigmoid_reference(q64, k64, scale, bias, labels)["loss"]

    if wrt == "s":
        plus, minus, slope = loss(s + h, t), loss(s - h, t), np.abs(dot)
    else:
        plus, minus, slope = loss(s, t + h), loss(s, t - h), np.ones_like(dot)
    truncation = h * h / 6 * SOFTPLUS_D3 * np.sum(slope**3) / b
    n = dot.size + q64.shape[1] + 8
    rounding = 2 * n * U64 / (1 - n * U64) * max(abs(plus), abs(minus)) / (2 * h)
    return (plus - minus) / (2 * h), truncation + rounding
