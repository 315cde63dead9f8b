"""A float64 NumPy reference of the reversible transformer of
include/flatmem/reversible.h, written from the header's formulas alone:
pre-LayerNorm multi-head self-attention (F) and pre-LayerNorm GELU MLP (G),
their hand-written backward passes, and the segment by ordinary backprop
(every block's input kept: no rebuild). test_python_reversible.py checks this file
against central finite differences before trusting it."""
import math

import numpy as np

_erf = np.frompyfunc(math.erf, 1, 1)


def erf(u):
    return _erf(u).astype(np.float64)


def attention_shapes(width):
    return [(width,), (width,), (width, 3 * width), (3 * width,), (width, width), (width,)]


def mlp_shapes(width, hidden):
    return [(width,), (width,), (width, hidden), (hidden,), (hidden, width), (width,)]


def random_parameters(rng, shapes, scale=0.3):
    """LayerNorm weights near 1, everything else small; fp32 values."""
    out = []
    for i, shape in enumerate(shapes):
        p = rng.standard_normal(shape) * scale
        if i == 0:
            p = 1.0 + p
        out.append(p.astype(np.float32))
    return out


# ---- LayerNorm over the last axis ------------------------------------------------


def layer_norm(x, weight, bias, eps):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    rstd = 1.0 / np.sqrt(var + eps)
    xhat = (x - mean) * rstd
    return xhat * weight + bias, (xhat, rstd, weight)


def layer_norm_backward(dout, saved):
    xhat, rstd, weight = saved
    dweight = (dout * xhat).reshape(-1, xhat.shape[-1]).sum(0)
    dbias = dout.reshape(-1, xhat.shape[-1]).sum(0)
    dxhat = dout * weight
    dx = rstd * (dxhat - dxhat.mean(-1, keepdims=True) - xhat * (dxhat * xhat).mean(-1, keepdims=True))
    return dx, dweight, dbias


def _rows(a):
    return a.reshape(-1, a.shape[-1])


# ---- F: attention -----------------------------------------------------------------


def attention(x, p, heads, eps):
    """F(x) for x (batch, tokens, width); returns (y, saved)."""
    ln_w, ln_b, w_qkv, b_qkv, w_proj, b_proj = [np.asarray(t, np.float64) for t in p]
    batch, tokens, width = x.shape
    d = width // heads
    h, ln = layer_norm(x, ln_w, ln_b, eps)
    qkv = h @ w_qkv + b_qkv

    def split(part):  # (batch, heads, tokens, d)
        m = qkv[..., part * width:(part + 1) * width]
        return m.reshape(batch, tokens, heads, d).transpose(0, 2, 1, 3)

    q, k, v = split(0), split(1), split(2)
    s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(d)
    s = s - s.max(-1, keepdims=True)
    probs = np.exp(s)
    probs /= probs.sum(-1, keepdims=True)
    a = probs @ v
    concat = a.transpose(0, 2, 1, 3).reshape(batch, tokens, width)
    y = concat @ w_proj + b_proj
    return y, (x, h, ln, q, k, v, probs, concat)


def attention_backward(dy, p, heads, saved):
    """(dx, parameter gradients) of F at the saved input."""
    ln_w, ln_b, w_qkv, b_qkv, w_proj, b_proj = [np.asarray(t, np.float64) for t in p]
    x, h, ln, q, k, v, probs, concat = saved
    batch, tokens, width = x.shape
    d = width // heads
    g_proj = _rows(concat).T @ _rows(dy)
    g_bproj = _rows(dy).sum(0)
    dconcat = dy @ w_proj.T
    da = dconcat.reshape(batch, tokens, heads, d).transpose(0, 2, 1, 3)
    dprobs = da @ v.transpose(0, 1, 3, 2)
    dv = probs.transpose(0, 1, 3, 2) @ da
    ds = probs * (dprobs - (dprobs * probs).sum(-1, keepdims=True)) / math.sqrt(d)
    dq = ds @ k
    dk = ds.transpose(0, 1, 3, 2) @ q

    def merge(m):
        return m.transpose(0, 2, 1, 3).reshape(batch, tokens, width)

    dqkv = np.concatenate([merge(dq), merge(dk), merge(dv)], axis=-1)
    g_qkv = _rows(h).T @ _rows(dqkv)
    g_bqkv = _rows(dqkv).sum(0)
    dh = dqkv @ w_qkv.T
    dx, g_lnw, g_lnb = layer_norm_backward(dh, ln)
    return dx, [g_lnw, g_lnb, g_qkv, g_bqkv, g_proj, g_bproj]


# ---- G: MLP -----------------------------------------------------------------------


def gelu(u):
    return 0.5 * u * (1.0 + erf(u / math.sqrt(2.0)))


def gelu_grad(u):
    return 0.5 * (1.0 + erf(u / math.sqrt(2.0))) + u * np.exp(-0.5 * u * u) / math.sqrt(2.0 * math.pi)


def mlp(x, p, eps):
    ln_w, ln_b, w1, b1, w2, b2 = [np.asarray(t, np.float64) for t in p]
    h, ln = layer_norm(x, ln_w, ln_b, eps)
    u = h @ w1 + b1
    act = gelu(u)
    return act @ w2 + b2, (h, ln, u, act)


def mlp_backward(dy, p, saved):
    ln_w, ln_b, w1, b1, w2, b2 = [np.asarray(t, np.float64) for t in p]
    h, ln, u, act = saved
    g_w2 = _rows(act).T @ _rows(dy)
    g_b2 = _rows(dy).sum(0)
    du = (dy @ w2.T) * gelu_grad(u)
    g_w1 = _rows(h).T @ _rows(du)
    g_b1 = _rows(du).sum(0)
    dh = du @ w1.T
    dx, g_lnw, g_lnb = layer_norm_backward(dh, ln)
    return dx, [g_lnw, g_lnb, g_w1, g_b1, g_w2, g_b2]


# ---- the segment, by ordinary backprop ----------------------------------------------


def as3d(x):
    x = np.asarray(x, np.float64)
    return x[None] if x.ndim == 2 else x


def segment_forward(x1, x2, layers, heads, eps=1e-6):
    """layers: [(attention parameters, mlp parameters), ...]. Returns (y1, y2, tape)."""
    shape = np.shape(x1)
    x1, x2 = as3d(x1), as3d(x2)
    tape = []
    for pa, pm in layers:
        f, fs = attention(x2, pa, heads, eps)
        y1 = x1 + f
        g, gs = mlp(y1, pm, eps)
        y2 = x2 + g
        tape.append((fs, gs))
        x1, x2 = y1, y2
    return x1.reshape(shape), x2.reshape(shape), tape


def segment_backward(dy1, dy2, layers, heads, tape):
    """(dx1, dx2, [(attention grads, mlp grads), ...])."""
    shape = np.shape(dy1)
    dy1, dy2 = as3d(dy1), as3d(dy2)
    grads = [None] * len(layers)
    for k in reversed(range(len(layers))):
        pa, pm = layers[k]
        fs, gs = tape[k]
        dg_in, g_mlp = mlp_backward(dy2, pm, gs)
        dx1 = dy1 + dg_in
        df_in, g_att = attention_backward(dx1, pa, heads, fs)
        dx2 = dy2 + df_in
        grads[k] = (g_att, g_mlp)
        dy1, dy2 = dx1, dx2
    return dy1.reshape(shape), dy2.reshape(shape), grads


# ---- a Python F/G for the callback tests: tanh(x W) over the last axis ---------------


def tanh_linear(x, w):
    return np.tanh(x @ w)


def tanh_linear_vjp(x, w, dy):
    y = np.tanh(x @ w)
    return (dy * (1.0 - y * y)) @ w.T


def tanh_segment(x1, x2, weights, dy1, dy2):
    """Forward and backward of a segment whose F_k, G_k are tanh-linear with
    weights [(wf, wg), ...], by ordinary backprop; returns (y1, y2, dx1, dx2)."""
    states = []
    for wf, wg in weights:
        y1 = x1 + tanh_linear(x2, wf)
        y2 = x2 + tanh_linear(y1, wg)
        states.append((x2, y1))
        x1, x2 = y1, y2
    out = (x1, x2)
    for (wf, wg), (x2k, y1k) in zip(reversed(weights), reversed(states)):
        dx1 = dy1 + tanh_linear_vjp(y1k, wg, dy2)
        dx2 = dy2 + tanh_linear_vjp(x2k, wf, dx1)
        dy1, dy2 = dx1, dx2
    return out[0], out[1], dy1, dy2
