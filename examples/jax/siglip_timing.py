"""A quick timing of flatmem_jax.sigmoid_loss against plain JAX, one process:

    python examples/jax/siglip_timing.py [b] [d] [reps]     (default 4096 512 3)

Both as jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3))) on fp32 unit
rows q, k (b, d), s = 10, t = -10, timed after one compiling call; the plain
JAX loss materialises the b x b logits:
    logits = s q k^T + t,  L = -mean over rows of sum_j log_sigmoid(z * logits).
Prints each time (best and median of reps), the ratio, and the difference of
the two losses. A measurement on a shared machine: run it when it is quiet
(note `uptime`), and compare ratios, not absolute times."""
import statistics
import sys
import time

import jax
import jax.numpy as jnp

import flatmem_jax


def plain_sigmoid_loss(q, k, s, t):
    logits = s * q @ k.T + t
    z = 2.0 * jnp.eye(q.shape[0], k.shape[0], dtype=logits.dtype) - 1.0
    return -jnp.mean(jnp.sum(jax.nn.log_sigmoid(z * logits), axis=1))


def timed(f, args, reps):
    jax.block_until_ready(f(*args))  # compile and warm up
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        out = jax.block_until_ready(f(*args))
        times.append(time.perf_counter() - start)
    return out, times


def main():
    b, d, reps = (int(a) for a in (sys.argv[1:] + ["4096", "512", "3"][len(sys.argv) - 1:])[:3])
    kq, kk = jax.random.split(jax.random.key(0))
    q = jax.random.normal(kq, (b, d), jnp.float32)
    k = q + 0.5 * jax.random.normal(kk, (b, d), jnp.float32)
    q, k = (x / jnp.linalg.norm(x, axis=1, keepdims=True) for x in (q, k))
    args = (q, k, jnp.float32(10.0), jnp.float32(-10.0))
    results = {}
    for name, loss in (("flatmem", flatmem_jax.sigmoid_loss), ("plain JAX", plain_sigmoid_loss)):
        f = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3)))
        (value, _), times = timed(f, args, reps)
        results[name] = (float(value), min(times), statistics.median(times))
        print(f"{name:>9}: loss {float(value):.6f}  best {min(times):.3f} s  median "
              f"{statistics.median(times):.3f} s  ({reps} reps after compile)")
    ratio = results["flatmem"][1] / results["plain JAX"][1]
    print(f"b = c = {b}, d = {d}, fp32: flatmem / plain JAX (best) = {ratio:.2f}; "
          f"|loss difference| = {abs(results['flatmem'][0] - results['plain JAX'][0]):.2e}")


if __name__ == "__main__":
    main()
