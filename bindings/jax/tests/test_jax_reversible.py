"""flatmem_jax.reversible_transformer against the plain-JAX blocks of
jax_reversible_reference.py (values, and gradients from jax.grad of the
reference).

Tolerances (relative to the largest reference entry of each array). Both
sides compute in float32 (u = 6e-8) and each has its own rounding: GEMMs of
length <= hidden = 48, LayerNorm sums over width = 12, a softmax over <= 7
tokens; the worst-case bound of a length-K dot product is K u (3e-6), the
typical error sqrt(K) u. flatmem's backward also rebuilds each block's input
from its output (relative error ~1e-7 per block, see the SWIG binding's
rebuild_error) and parameter gradients sum over batch * tokens rows.
Measured here: values <= 4e-7, gradients <= 2e-6 (depth 3). Bounds: values
3e-6 * depth, gradients 2e-5 * depth -- 8-20x above what is measured, far below
what any real mistake gives (a wrong head split, a missing LayerNorm term or
a stale parameter are O(1e-1)).
"""
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import flatmem_jax
import jax_reversible_reference as ref

EPS = 1e-6
MODES = ["auto", "vanilla", "overlapped"]


def rel_err(actual, expected):
    expected = np.asarray(expected, np.float64)
    return np.abs(np.asarray(actual, np.float64) - expected).max() / max(np.abs(expected).max(), 1e-30)


def close(actual, expected, tol):
    err = rel_err(actual, expected)
    assert err <= tol, f"relative error {err:.3g} > {tol:.3g}"


def inputs(shape, seed=1):
    rng = np.random.default_rng(seed)
    return tuple(jnp.asarray(rng.standard_normal(shape).astype(np.float32)) for _ in range(4))


def make_loss(fn, **kwargs):
    """A scalar of both outputs, so that both cotangents are non-trivial."""

    def loss(x1, x2, params, c1, c2):
        y1, y2 = fn(x1, x2, params, **kwargs)
        return jnp.sum(y1 * c1) + jnp.sum(y2 * c2)

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))


def flat(tree):
    return jax.tree_util.tree_leaves(tree)


SHAPES = [(1, 1, 12), (1, 7, 12), (2, 7, 12), (7, 12)]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("depth", [1, 3])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_values_and_gradients_match_plain_jax(shape, depth, mode):
    params = ref.random_parameters(np.random.default_rng(depth), depth, 12)
    x1, x2, c1, c2 = inputs(shape)
    y1, y2 = jax.jit(lambda a, b, p: flatmem_jax.reversible_transformer(a, b, p, heads=3, mode=mode))(x1, x2, params)
    r1, r2 = ref.reversible_transformer(x1, x2, params, 3, EPS)
    assert y1.shape == y2.shape == shape and y1.dtype == jnp.float32
    close(y1, r1, 3e-6 * depth)
    close(y2, r2, 3e-6 * depth)
    value, grads = make_loss(flatmem_jax.reversible_transformer, heads=3, mode=mode)(x1, x2, params, c1, c2)
    want_value, want = make_loss(ref.reversible_transformer, heads=3)(x1, x2, params, c1, c2)
    close(value, want_value, 3e-6 * depth)
    for got, expected in zip(flat(grads), flat(want)):
        assert got.shape == expected.shape and got.dtype == jnp.float32
        close(got, expected, 2e-5 * depth)


def test_eager_grad_and_vjp():
    params = ref.random_parameters(np.random.default_rng(3), 2, 12, hidden=20)
    x1, x2, c1, c2 = inputs((2, 5, 12), seed=4)
    (y1, y2), vjp = jax.vjp(lambda a, b, p: flatmem_jax.reversible_transformer(a, b, p, heads=4), x1, x2, params)
    dx1, dx2, dparams = vjp((c1, c2))
    (r1, r2), rvjp = jax.vjp(lambda a, b, p: ref.reversible_transformer(a, b, p, 4), x1, x2, params)
    want = rvjp((c1, c2))
    close(y1, r1, 6e-6)
    for got, expected in zip(flat((dx1, dx2, dparams)), flat(want)):
        close(got, expected, 4e-5)


def test_only_the_outputs_are_saved(capsys):
    """The custom VJP keeps (y1, y2) and the parameters, nothing per block:
    no attention probabilities, no hidden activations."""
    depth, shape = 3, (2, 7, 12)
    params = ref.random_parameters(np.random.default_rng(0), depth, 12)
    x1, x2, _, _ = inputs(shape)

    def loss(x1, x2, params):
        y1, y2 = flatmem_jax.reversible_transformer(x1, x2, params, heads=3)
        return jnp.sum(y1) + jnp.sum(y2)

    from jax._src.ad_checkpoint import saved_residuals  # what print_saved_residuals prints

    saved = saved_residuals(loss, x1, x2, params)
    shapes = [tuple(aval.shape) for aval, _ in saved]
    state_like = [s for s in shapes if s == shape]
    assert len(state_like) <= 4, shapes  # y1, y2 (and the inputs x1, x2)
    parameter_shapes = {tuple(p.shape) for p in flat(params)}
    assert all(s == shape or s in parameter_shapes for s in shapes), shapes
    # the plain-JAX reference, for contrast, keeps activations of every block
    reference = [tuple(a.shape) for a, _ in saved_residuals(
        lambda a, b, p: jnp.sum(sum(ref.reversible_transformer(a, b, p, 3))), x1, x2, params)]
    assert (2, 3, 7, 7) in reference


def test_overlapped_is_bitwise_vanilla():
    params = ref.random_parameters(np.random.default_rng(5), 3, 12)
    x1, x2, c1, c2 = inputs((2, 7, 12), seed=6)
    results = [make_loss(flatmem_jax.reversible_transformer, heads=3, mode=mode, num_threads=3)(
        x1, x2, params, c1, c2) for mode in ("vanilla", "overlapped")]
    for a, b in zip(flat(results[0]), flat(results[1])):
        assert np.array_equal(np.asarray(a), np.asarray(b))


def test_new_parameters_every_call():
    """The cached flatmem blocks are pointed at each call's buffers: no stale
    parameters when they change between calls of one compiled function."""
    fn = jax.jit(lambda a, b, p: flatmem_jax.reversible_transformer(a, b, p, heads=3))
    x1, x2, _, _ = inputs((2, 7, 12))
    pa = ref.random_parameters(np.random.default_rng(10), 2, 12)
    pb = ref.random_parameters(np.random.default_rng(11), 2, 12)
    for p in (pa, pb, pa):
        y1, _ = fn(x1, x2, p)
        close(y1, ref.reversible_transformer(x1, x2, p, 3, EPS)[0], 6e-6)


def test_concurrent_calls():
    """Two threads running the compiled function at once borrow two cached
    segments and get the single-threaded results."""
    fn = make_loss(flatmem_jax.reversible_transformer, heads=3, mode="overlapped")
    params = ref.random_parameters(np.random.default_rng(12), 2, 12)
    args = [inputs((2, 7, 12), seed=s) for s in (20, 21)]
    expected = [fn(x1, x2, params, c1, c2) for x1, x2, c1, c2 in args]
    got = [None, None]

    def work(i):
        for _ in range(5):
            x1, x2, c1, c2 = args[i]
            got[i] = jax.block_until_ready(fn(x1, x2, params, c1, c2))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for g, e in zip(got, expected):
        for a, b in zip(flat(g), flat(e)):
            assert np.array_equal(np.asarray(a), np.asarray(b))


def test_vmap_is_a_loop_of_calls():
    params = ref.random_parameters(np.random.default_rng(13), 1, 12)
    xs = inputs((3, 5, 12), seed=14)[:2]
    batched = jax.vmap(lambda a, b: flatmem_jax.reversible_transformer(a, b, params, heads=3))(*xs)
    for i in range(3):
        single = flatmem_jax.reversible_transformer(xs[0][i], xs[1][i], params, heads=3)
        assert np.array_equal(np.asarray(batched[0][i]), np.asarray(single[0]))


def test_refused_arguments():
    params = ref.random_parameters(np.random.default_rng(0), 1, 12)
    x1, x2, _, _ = inputs((2, 7, 12))
    f = flatmem_jax.reversible_transformer
    with pytest.raises(ValueError, match="mode 'standard' is not offered"):
        f(x1, x2, params, heads=3, mode="standard")
    with pytest.raises(ValueError, match="mode 'fast'"):
        f(x1, x2, params, heads=3, mode="fast")
    # STANDARD's number is refused by the handler library too (trace time)
    with pytest.raises(flatmem_jax.FlatmemError, match="FLATMEM_REVERSIBLE_STANDARD keeps the activations"):
        f(x1, x2, params, heads=3, mode=1)
    with pytest.raises(ValueError, match=r"x2 has shape \(2, 6, 12\)"):
        f(x1, x2[:, :6], params, heads=3)
    with pytest.raises(TypeError, match="x1: dtype bfloat16"):
        f(x1.astype(jnp.bfloat16), x2, params, heads=3)
    bad = [([*params[0][0][:2], jnp.zeros((12, 30), jnp.float32), *params[0][0][3:]], params[0][1])]
    with pytest.raises(ValueError, match=r"params\[0\]\[0\]\[2\] \(attention qkv_weight\): shape \(12, 30\), expected \(12, 36\)"):
        f(x1, x2, bad, heads=3)
    with pytest.raises(ValueError, match=r"params\[0\]\[1\] has 5 arrays"):
        f(x1, x2, [(params[0][0], params[0][1][:5])], heads=3)
    # what flatmem itself refuses shows at trace time, with its message
    with pytest.raises(flatmem_jax.FlatmemError, match="heads") as info:
        f(x1, x2, params, heads=5)
    assert info.value.status == "FLATMEM_STATUS_INVALID_ARGUMENT"
    with pytest.raises(flatmem_jax.FlatmemError, match="num_threads"):
        f(x1, x2, params, heads=3, num_threads=-3)


def test_tf32_math_gives_the_fp32_bits_on_the_cpu():
    """math reaches flatmem_block_options.math; the CPU blocks compute FP32 for
    TF32 too, so values and gradients are the FP32 bits."""
    params = ref.random_parameters(np.random.default_rng(7), 2, 12)
    x1, x2, c1, c2 = inputs((2, 7, 12), seed=8)
    results = [make_loss(flatmem_jax.reversible_transformer, heads=3, mode="vanilla", math=math)(
        x1, x2, params, c1, c2) for math in ("fp32", "tf32", "TF32", 1)]
    for other in results[1:]:
        for a, b in zip(flat(results[0]), flat(other)):
            assert np.array_equal(np.asarray(a), np.asarray(b))


def test_math_outside_the_enum_is_refused():
    params = ref.random_parameters(np.random.default_rng(0), 1, 12)
    x1, x2, _, _ = inputs((2, 7, 12))
    f = flatmem_jax.reversible_transformer
    with pytest.raises(ValueError, match=r"math 'fp16' is not one of \['fp32', 'tf32'\]"):
        f(x1, x2, params, heads=3, math="fp16")
    # a number goes to flatmem, which refuses it when the segment is made (trace time)
    for bad in (2, -1):
        with pytest.raises(flatmem_jax.FlatmemError, match="options.math") as info:
            f(x1, x2, params, heads=3, math=bad)
        assert info.value.status == "FLATMEM_STATUS_INVALID_ARGUMENT"


def test_readme_reversible_snippet_runs(capsys):
    """The README's reversible snippet runs as written, and its loss is the
    plain-JAX one."""
    import pathlib
    import re

    pytest.importorskip("flatmem", reason="the SWIG package flatmem (bindings/python) is not installed")
    readme = pathlib.Path(__file__).resolve().parents[1] / "README.md"
    blocks = [b for b in re.findall(r"^```python\n(.*?)^```", readme.read_text(), re.M | re.S)
              if "reversible_transformer" in b]
    assert len(blocks) == 1
    namespace = {"__name__": "readme"}
    exec(compile(blocks[0], str(readme), "exec"), namespace)
    out = capsys.readouterr().out
    assert re.search(r"^loss \d+\.\d{4}, \|d qkv_weight of block 0\| \d+\.\d{4}$", out, re.M), out
    x, params = namespace["x"], namespace["params"]
    y1, y2 = ref.reversible_transformer(x, x, params, namespace["heads"], EPS)
    want = jnp.mean(jnp.square(0.5 * (y1 + y2)))
    close(namespace["loss"], want, 1e-5 * 6)
