"""The plain-JAX reversible transformer the tests compare flatmem with: the
formulas of include/flatmem/reversible.h written in jax.numpy (pre-LN
multi-head self-attention as F, pre-LN exact-GELU MLP as G), differentiated
by jax.grad (ordinary backprop, every activation kept). float32 throughout,
matmuls at Precision.HIGHEST."""
import math

import jax
import jax.numpy as jnp
import numpy as np

HIGHEST = jax.lax.Precision.HIGHEST


def matmul(a, b):
    return jnp.matmul(a, b, precision=HIGHEST)


def layer_norm(x, weight, bias, eps):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + eps) * weight + bias


def attention(x, p, heads, eps):
    """x (batch, tokens, width)."""
    ln_w, ln_b, w_qkv, b_qkv, w_proj, b_proj = p
    batch, tokens, width = x.shape
    d = width // heads
    qkv = matmul(layer_norm(x, ln_w, ln_b, eps), w_qkv) + b_qkv

    def split(part):  # (batch, heads, tokens, d)
        m = qkv[..., part * width:(part + 1) * width]
        return m.reshape(batch, tokens, heads, d).transpose(0, 2, 1, 3)

    q, k, v = split(0), split(1), split(2)
    probs = jax.nn.softmax(matmul(q, k.transpose(0, 1, 3, 2)) / math.sqrt(d), axis=-1)
    a = matmul(probs, v).transpose(0, 2, 1, 3).reshape(batch, tokens, width)
    return matmul(a, w_proj) + b_proj


def mlp(x, p, eps):
    ln_w, ln_b, w1, b1, w2, b2 = p
    u = matmul(layer_norm(x, ln_w, ln_b, eps), w1) + b1
    return matmul(jax.nn.gelu(u, approximate=False), w2) + b2


def reversible_transformer(x1, x2, params, heads, eps=1e-6):
    """Same signature and result as flatmem_jax.reversible_transformer."""
    two_d = x1.ndim == 2
    if two_d:
        x1, x2 = x1[None], x2[None]
    for pa, pm in params:
        x1 = x1 + attention(x2, pa, heads, eps)
        x2 = x2 + mlp(x1, pm, eps)
    return (x1[0], x2[0]) if two_d else (x1, x2)


def random_parameters(rng, depth, width, hidden=0, scale=0.3):
    """[(attention 6, mlp 6), ...] as float32 jax arrays; LayerNorm weights near 1."""
    hidden = hidden or 4 * width
    shapes = ([(width,), (width,), (width, 3 * width), (3 * width,), (width, width), (width,)],
              [(width,), (width,), (width, hidden), (hidden,), (hidden, width), (width,)])
    layers = []
    for _ in range(depth):
        pair = []
        for part in shapes:
            arrays = []
            for i, shape in enumerate(part):
                a = rng.standard_normal(shape) * scale + (1.0 if i == 0 else 0.0)
                arrays.append(jnp.asarray(a.astype(np.float32)))
            pair.append(arrays)
        layers.append(tuple(pair))
    return layers
