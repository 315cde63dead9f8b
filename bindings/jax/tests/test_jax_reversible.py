"""flatmem_jax.reversible_transformer against the plain-JAX blocks of
jax_reversible_reference.py (values, and gradients from jax.grad of the
reference).

Tolerances: formulas of the shapes, bounding the largest error of an array
relative to its largest reference entry (close()), reusing
tests/support/block_case.hpp: one fp32 block evaluation (LayerNorm, GEMMs,
softmax, GELU) is within c u sqrt(K) max|output| of the exact value, u =
2^-24, c = 16, K = max(3 width, hidden, tokens), plus the batch * tokens rows
a parameter gradient sums over; a chain of them errs by that times the
number of evaluations it depends on (Jacobians of order one carry the
errors on). Both sides compute in float32 with their own rounding (the
CPU instruction set, FLATMEM_CPU_ISA, and XLA's choices change only the
order of sums, which the bound does not depend on), so their difference is
bounded by the sum of their counts:
  * values: flatmem's 2 depth (F and G of every layer) + the reference's
    2 depth = 4 depth;
  * gradients: flatmem's 4 depth (a VJP sees its input with the forward
    error of the blocks below and the rebuild error of the blocks above,
    2 depth together, then the 2 depth VJPs add theirs) + the reference's
    4 depth (its activations carry its forward error, then its VJPs) =
    8 depth;
  * a scalar loss: the values' bound carried through the loss (errors of
    random sign: |sum dy c| <= max|dy| sqrt(sum c^2)) plus both sides'
    rounding of its sum.
A real defect (a wrong head split, a missing LayerNorm term, a stale
parameter) is an O(1e-1) relative error, >= 10^2-10^3 times these bounds.
FLATMEM_TEST_VERBOSE=1 (pytest -s) prints every error / tolerance.
"""
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import flatmem_jax
import jax_reversible_reference as ref
from python_support import run_concurrently, run_readme_block

EPS = 1e-6
MODES = ["auto", "vanilla", "overlapped"]


U32 = 2.0**-24  # float32 unit roundoff
C_BLOCK = 16  # tests/support/block_case.hpp: fp32_tolerance_factor


def builtin_tol(evaluations, width, hidden, tokens, rows=0):
    """Relative bound for a result of `evaluations` chained fp32 block
    evaluations: c u sqrt(K) each, K = max(3 width, hidden, tokens) (+ rows
    for a parameter gradient)."""
    return evaluations * C_BLOCK * U32 * math.sqrt(max(3 * width, hidden, tokens) + rows)


def report(err, tol, what=""):
    if os.environ.get("FLATMEM_TEST_VERBOSE"):
        test = os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0]
        print(f"\nerror/tolerance {err / tol:.3g} (error {err:.3g}, tolerance {tol:.3g}) {test} {what}")
    assert err <= tol, f"relative error {err:.3g} > {tol:.3g}"


def rel_err(actual, expected):
    expected = np.asarray(expected, np.float64)
    return np.abs(np.asarray(actual, np.float64) - expected).max() / max(np.abs(expected).max(), 1e-30)


def close(actual, expected, tol):
    """max |actual - expected| <= tol max |expected|."""
    report(rel_err(actual, expected), tol)


def close_pairing(value, want, r, c, tol_y):
    """value, want: sum_i (y1 c1 + y2 c2) of flatmem's y and of the
    reference's r = (r1, r2), cotangents c = (c1, c2), n terms. Each y_i is
    within tol_y max|r| of r_i; with errors of random sign (as in
    block_case.hpp) sum_i dy_i c_i stays within tol_y max|r| sqrt(sum c^2),
    and each side's fp32 sum of the n products within 16 u sqrt(n)
    sqrt(sum (r c)^2). Reported relative to sum|r c|, the sum's natural scale
    (the value itself can cancel)."""
    r = [np.asarray(a, np.float64).ravel() for a in r]
    c = [np.asarray(a, np.float64).ravel() for a in c]
    r_max = max(np.abs(a).max() for a in r)
    rc, cc = np.concatenate([a * b for a, b in zip(r, c)]), np.concatenate(c)
    bound = tol_y * r_max * np.sqrt(np.square(cc).sum()) + 2 * C_BLOCK * U32 * np.sqrt(rc.size * np.square(rc).sum())
    scale = np.abs(rc).sum()
    report(abs(float(value) - float(want)) / scale, bound / scale, "pairing")


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
    width, hidden, tokens, rows = 12, 48, shape[-2], math.prod(shape[:-1])
    tol_y = builtin_tol(4 * depth, width, hidden, tokens)
    close(y1, r1, tol_y)
    close(y2, r2, tol_y)
    value, grads = make_loss(flatmem_jax.reversible_transformer, heads=3, mode=mode)(x1, x2, params, c1, c2)
    want_value, want = make_loss(ref.reversible_transformer, heads=3)(x1, x2, params, c1, c2)
    close_pairing(value, want_value, (r1, r2), (c1, c2), tol_y)
    dx, dparams = flat(grads)[:2], flat(grads)[2:]
    for got, expected in zip(dx, flat(want)[:2]):
        assert got.shape == expected.shape and got.dtype == jnp.float32
        close(got, expected, builtin_tol(8 * depth, width, hidden, tokens))
    for got, expected in zip(dparams, flat(want)[2:]):
        assert got.shape == expected.shape and got.dtype == jnp.float32
        close(got, expected, builtin_tol(8 * depth, width, hidden, tokens, rows))


def test_eager_grad_and_vjp():
    params = ref.random_parameters(np.random.default_rng(3), 2, 12, hidden=20)
    x1, x2, c1, c2 = inputs((2, 5, 12), seed=4)
    (y1, y2), vjp = jax.vjp(lambda a, b, p: flatmem_jax.reversible_transformer(a, b, p, heads=4), x1, x2, params)
    dx1, dx2, dparams = vjp((c1, c2))
    (r1, r2), rvjp = jax.vjp(lambda a, b, p: ref.reversible_transformer(a, b, p, 4), x1, x2, params)
    want = rvjp((c1, c2))
    depth, width, hidden, tokens, rows = 2, 12, 20, 5, 10
    close(y1, r1, builtin_tol(4 * depth, width, hidden, tokens))
    close(y2, r2, builtin_tol(4 * depth, width, hidden, tokens))
    for got, expected in zip(flat((dx1, dx2)), flat(want)[:2]):
        close(got, expected, builtin_tol(8 * depth, width, hidden, tokens))
    for got, expected in zip(flat(dparams), flat(want)[2:]):
        close(got, expected, builtin_tol(8 * depth, width, hidden, tokens, rows))


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
        # values of a depth-2 segment (width 12, hidden 48, 7 tokens): 4 depth evaluations
        close(y1, ref.reversible_transformer(x1, x2, p, 3, EPS)[0], builtin_tol(4 * 2, 12, 48, 7))


def test_concurrent_calls():
    """Two threads running the compiled function at once borrow two cached
    segments and get the single-threaded results."""
    fn = make_loss(flatmem_jax.reversible_transformer, heads=3, mode="overlapped")
    params = ref.random_parameters(np.random.default_rng(12), 2, 12)
    args = [inputs((2, 7, 12), seed=s) for s in (20, 21)]
    expected = [fn(x1, x2, params, c1, c2) for x1, x2, c1, c2 in args]

    def work(i):
        for _ in range(5):
            x1, x2, c1, c2 = args[i]
            got = jax.block_until_ready(fn(x1, x2, params, c1, c2))
        return got

    for g, e in zip(run_concurrently(work, 2), expected):
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
    with pytest.raises(ValueError, match="mode: 'fast'"):
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
    with pytest.raises(ValueError, match=r"math: 'fp16' is not one of \['fp32', 'tf32'\]"):
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
    namespace = run_readme_block(readme, "reversible_transformer")
    out = capsys.readouterr().out
    assert re.search(r"^loss \d+\.\d{4}, \|d qkv_weight of block 0\| \d+\.\d{4}$", out, re.M), out
    x, params = namespace["x"], namespace["params"]
    y1, y2 = ref.reversible_transformer(x, x, params, namespace["heads"], EPS)
    want = jnp.mean(jnp.square(0.5 * (y1 + y2)))
    # loss = mean z^2 over n elements, z = (y1 + y2) / 2: each z_i within
    # tol_y max|y| of the reference's; with errors of random sign (as in
    # block_case.hpp) d loss = (2/n) sum z dz stays within 2 tol_y max|y|
    # sqrt(sum z^2) / n, i.e. 2 tol_y max|y| / sqrt(sum z^2) relative; plus
    # each side's fp32 mean of n positive terms, c u sqrt(n) relative.
    depth, width, hidden = len(params), namespace["width"], namespace["hidden"]
    tokens, n = x.shape[-2], x.size
    tol_y = builtin_tol(4 * depth, width, hidden, tokens)
    z = 0.5 * (np.asarray(y1, np.float64) + np.asarray(y2, np.float64))
    y_max = max(np.abs(np.asarray(y1)).max(), np.abs(np.asarray(y2)).max())
    tol = 2 * tol_y * y_max / np.sqrt(np.square(z).sum()) + 2 * C_BLOCK * U32 * math.sqrt(n)
    close(namespace["loss"], want, tol)
