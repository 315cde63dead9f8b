"""An independent float64 NumPy reference of flatmem's contrastive loss, by the
formulas of include/flatmem/flatmem.h (materialised b x c logits), and the
error bounds the tests hold the library to."""
import numpy as np

U32 = 2.0**-24  # fp32 unit roundoff


def logsumexp(x, axis):
    m = np.max(x, axis=axis, keepdims=True)
    return np.squeeze(m, axis) + np.log(np.sum(np.exp(x - m), axis=axis))


def contrastive_reference(q, k, s, labels=None, symmetric=True):
    """(loss, dq, dk, ds, row_lse, col_lse) in float64, for dloss = 1.

    x_ij = s <q_i, k_j>;  P = exp(x - row_lse), Q = exp(x - col_lse)
    symmetric: L = 1/2 (mean_i [row_lse_i - x_ii] + mean_j [col_lse_j - x_jj]),
               G = (P + Q - 2 I) / (2 b)
    InfoNCE:   L = mean_i [row_lse_i - x_{i, y_i}],  G = (P - onehot(y)) / b
    dq = s G k,  dk = s G^T q,  ds = sum_ij G_ij <q_i, k_j>.
    """
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    b, c = q.shape[0], k.shape[0]
    dot = q @ k.T
    x = s * dot
    row_lse = logsumexp(x, axis=1)
    P = np.exp(x - row_lse[:, None])
    if symmetric:
        assert b == c and labels is None
        col_lse = logsumexp(x, axis=0)
        Q = np.exp(x - col_lse[None, :])
        diag = np.diag(x)
        loss = 0.5 * (np.mean(row_lse - diag) + np.mean(col_lse - diag))
        G = (P + Q - 2.0 * np.eye(b)) / (2.0 * b)
    else:
        y = np.arange(b) if labels is None else np.asarray(labels)
        col_lse = None
        loss = np.mean(row_lse - x[np.arange(b), y])
        onehot = np.zeros((b, c))
        onehot[np.arange(b), y] = 1.0
        G = (P - onehot) / b
    dq = s * G @ k
    dk = s * G.T @ q
    ds = np.sum(G * dot)
    return loss, dq, dk, ds, row_lse, col_lse


# Error bounds, first order, as derived in tests/support/tolerance.hpp (the C
# suite). Notation: u = 2^-24 (fp32 unit roundoff), gamma_n = n u / (1 - n u),
# R_ij = sum_t |q_it k_jt|, A = max R, N = 2b (symmetric) or b (InfoNCE),
# g = dloss. 16-bit inputs are widened exactly, so the same bounds hold for
# them against the reference evaluated on the same (rounded) values.
#  1. every fp32 logit is within dx = s gamma_{d+1} A;
#  2. a log-sum-exp over n terms within tau_lse = dx + (2n + 8) u + 2u |lse|;
#     the loss within dx + (2 max(b, c) + 8) u + 2u |L|;
#  3. every P (and Q) carries a relative error eps_G = dx + tau_lse + 8u, so
#     G_ij errs by W_ij eps_G + 2u |g| / N + 3u |G_ij| with
#     W = |g| / N (P + Q + 2 [positive]) (InfoNCE: P + [positive]);
#  4. dq_it = s sum_j G_ij k_jt, an fp32 sum of c products:
#       tau_dq = s [eps_G sum_j W_ij |k_jt| + 2u |g|/N sum_j |k_jt|
#                   + (gamma_c + 3u) sum_j |G_ij| |k_jt|],
#     dk likewise with q (gamma_b); ds = sum_ij G_ij raw_ij with R_ij in
#     place of |k_jt| and gamma_d + gamma_{c+1} for the logits and row sums;
#  5. a 16-bit gradient is the fp32 one rounded once (RNE): half an ulp,
#     2^-8 relative for bfloat16 and 2^-11 for float16, + 2^-25 absolute for
#     float16 subnormals.
# SLACK = 2 covers second-order terms. These are worst-case bounds: observed
# errors are 10-100x smaller, while a real defect (a dropped tile or column, a
# wrong scale) moves results by O(1/n), far above them at the sizes tested.
SLACK = 2.0


def gamma(n):
    return n * U32 / (1 - n * U32)


def forward_tolerance(q, k, s, loss_ref=0.0):
    """Bound on |loss - loss_ref| (2.)."""
    qa = np.abs(np.asarray(q, np.float64))
    ka = np.abs(np.asarray(k, np.float64))
    dx = s * gamma(qa.shape[1] + 1) * np.max(qa @ ka.T)
    n = max(qa.shape[0], ka.shape[0])
    return SLACK * (dx + (2 * n + 8) * U32 + 2 * U32 * abs(loss_ref))


def lse_tolerance(q, k, s, lse_ref, n):
    """Bound on each |lse - lse_ref| of a log-sum-exp over n terms (2.)."""
    qa = np.abs(np.asarray(q, np.float64))
    ka = np.abs(np.asarray(k, np.float64))
    dx = s * gamma(qa.shape[1] + 1) * np.max(qa @ ka.T)
    return SLACK * (dx + (2 * n + 8) * U32 + 2 * U32 * np.abs(lse_ref))


def _round_bound(fp32_bound, ref, dtype):
    """Adds the final rounding to dtype (5.) to an fp32 bound."""
    dtype = np.dtype(dtype)
    if dtype == np.float16:
        return fp32_bound + 2.0**-11 * (np.abs(ref) + fp32_bound) + 2.0**-25
    if dtype.itemsize == 2:  # bfloat16
        return fp32_bound + 2.0**-8 * (np.abs(ref) + fp32_bound)
    return fp32_bound + U32 * np.abs(ref)


def magnitudes(q, k):
    """(q64, k64, |q|, |k|, R) in float64, R_ij = sum_t |q_it k_jt|: what
    the bounds are made of."""
    q64 = np.asarray(q, np.float64)
    k64 = np.asarray(k, np.float64)
    qa, ka = np.abs(q64), np.abs(k64)
    return q64, k64, qa, ka, qa @ ka.T


def gradient_tolerances(q, k, s, labels=None, symmetric=True, g=1.0, dtype=np.float32):
    """Element-wise bounds (tau_dq, tau_dk, tau_ds) on the gradients of
    g * L computed in fp32, dq and dk stored in dtype (3. to 5.)."""
    q64, k64, qa, ka, R = magnitudes(q, k)
    b, d = q64.shape
    c = k64.shape[0]
    dx = s * gamma(d + 1) * np.max(R)
    x = s * (q64 @ k64.T)
    row_lse = logsumexp(x, axis=1)
    P = np.exp(x - row_lse[:, None])
    positive = np.zeros((b, c))
    if symmetric:
        col_lse = logsumexp(x, axis=0)
        Q = np.exp(x - col_lse[None, :])
        positive[np.arange(b), np.arange(b)] = 1.0
        N = 2.0 * b
        W = abs(g) / N * (P + Q + 2 * positive)
        G = g / N * (P + Q - 2 * positive)
        tau_lse = max(np.max(lse_tolerance(q, k, s, row_lse, c)), np.max(lse_tolerance(q, k, s, col_lse, b)))
    else:
        y = np.arange(b) if labels is None else np.asarray(labels)
        positive[np.arange(b), y] = 1.0
        N = float(b)
        W = abs(g) / N * (P + positive)
        G = g / N * (P - positive)
        tau_lse = np.max(lse_tolerance(q, k, s, row_lse, c))
    eps_g = dx + tau_lse / SLACK + 8 * U32
    G_abs = np.abs(G)
    floor = 2 * U32 * abs(g) / N
    tau_dq = s * (eps_g * (W @ ka) + floor * ka.sum(axis=0)[None, :] + (gamma(c) + 3 * U32) * (G_abs @ ka))
    tau_dk = s * (eps_g * (W.T @ qa) + floor * qa.sum(axis=0)[None, :] + (gamma(b) + 3 * U32) * (G_abs.T @ qa))
    tau_ds = (eps_g * np.sum(W * R) + floor * np.sum(R)
              + (gamma(d) + gamma(c + 1) + 3 * U32) * np.sum(G_abs * R))
    _, ref_dq, ref_dk, _, _, _ = contrastive_reference(q, k, s, labels, symmetric)
    return (_round_bound(SLACK * tau_dq, g * ref_dq, dtype),
            _round_bound(SLACK * tau_dk, g * ref_dk, dtype),
            SLACK * tau_ds)
