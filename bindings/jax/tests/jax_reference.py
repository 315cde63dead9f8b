"""The plain-JAX materialised losses the tests compare flatmem with: the full
b x c logit matrix, jax.nn.logsumexp, and jax.grad for the gradients. Inputs
are widened to float32 first, as flatmem widens bf16/fp16 tiles."""
import jax
import jax.numpy as jnp


def logits(q, k, s):
    q, k = q.astype(jnp.float32), k.astype(jnp.float32)
    return s * jnp.matmul(q, k.T, precision=jax.lax.Precision.HIGHEST)


def clip_loss(q, k, s):
    x = logits(q, k, s)
    diag = jnp.diagonal(x)
    rows = jnp.mean(jax.nn.logsumexp(x, axis=1) - diag)
    cols = jnp.mean(jax.nn.logsumexp(x, axis=0) - diag)
    return 0.5 * (rows + cols)


def infonce_loss(q, k, s, labels=None):
    x = logits(q, k, s)
    y = jnp.arange(q.shape[0]) if labels is None else jnp.asarray(labels)
    positive = jnp.take_along_axis(x, y[:, None], axis=1)[:, 0]
    return jnp.mean(jax.nn.logsumexp(x, axis=1) - positive)


# Jitted loss and gradients in (q, k, s): eager JAX would compile every small op
# of the materialised loss separately, which costs seconds per shape.
clip_value_and_grad = jax.jit(jax.value_and_grad(clip_loss, argnums=(0, 1, 2)))
infonce_value_and_grad = jax.jit(jax.value_and_grad(infonce_loss, argnums=(0, 1, 2)))
