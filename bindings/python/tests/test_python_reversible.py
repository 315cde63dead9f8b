"""flatmem.ReversibleSegment, flatmem.Block and Python functions as F/G.

The built-in blocks are checked against python_reversible_reference.py, an
independent float64 NumPy implementation of the same pre-LN attention and MLP
blocks (itself checked by finite differences below); Python functions against
a hand-written tanh-linear reference.

Tolerances: each is a formula of the shapes and the dtype, and bounds the
largest error of an array relative to its largest reference entry (close()).
The reference computes in float64 on the same (rounded) inputs and
parameters, so the difference is flatmem's rounding alone; whatever the CPU
instruction set (FLATMEM_CPU_ISA), BLAS or thread count does, it changes only
the order of the sums, which the bounds do not depend on. Two kinds:

  * built-in blocks (builtin_tol), reusing tests/support/block_case.hpp: one
    fp32 block evaluation is within c u sqrt(K) max|output| of the exact
    value (u = 2^-24, c = 16, K = max(3 width, hidden, tokens), plus rows for
    a parameter gradient, which sums over the batch * tokens rows). A segment
    chains evaluations whose errors carry on with Jacobians of order one
    (residual streams, LayerNorm), so the bound is that times the number of
    evaluations the result depends on: 2 depth for the forward (F and G of
    every layer); 4 depth for the backward: the VJP of a block sees its
    input with the forward error of the blocks below and the rebuild error
    of the blocks above (2 depth evaluations' worth together -- see
    test_return_inputs_and_rebuild_error), then 2 depth VJPs add their own.
  * Python tanh-linear functions (toy_tol), reusing
    tests/reversible/test_segment_values.cpp: one F or G adds at most
    (width + 8) u relative (a width-term dot product, tanh, the residual
    add), carried on with Jacobians of order one, over the 2 depth blocks:
    2 depth (width + 8) u, u = 2^-24 or 2^-53 for float32 or float64 states,
    for the outputs, the rebuilt inputs and the gradients alike (the rebuild
    and the VJPs are the same kind of arithmetic).

Measured worst error / tolerance, under avx512, avx2 and baseline, over
these tests and 12 further seeds: 0.03 (forward), 0.04 (dx), 0.055
(parameter gradients), 0.02 (rebuilt input), 0.06 (tanh-linear float32 and
float64).

A real defect -- a wrong head split, a missing LayerNorm term, a stale
parameter, a wrong sign -- is an O(1e-1) relative error, >= 10^3 times these
bounds. FLATMEM_TEST_VERBOSE=1 (pytest -s) prints every error / tolerance.
Where the header promises the same bits (OVERLAPPED = VANILLA, TF32 = FP32 on
the CPU, y1 = x1 + F(x2) with a plain Python F) the tests assert equality.
"""
import gc
import math
import os
import sys
import threading
import weakref

import numpy as np
import pytest
import python_reversible_reference as ref
from python_support import assert_main_thread_runs_during, raises_flatmem, run_readme_block

import flatmem

MODES = ["standard", "vanilla", "overlapped", "auto"]
EPS = 1e-6


U32, U64 = 2.0**-24, 2.0**-53  # unit roundoff of float32, float64
C_BLOCK = 16  # tests/support/block_case.hpp: fp32_tolerance_factor


def builtin_tol(evaluations, width, hidden, tokens, rows=0):
    """Relative bound for a result of `evaluations` chained fp32 built-in
    block evaluations: c u sqrt(K) each (block_case.hpp), K = max(3 width,
    hidden, tokens), + rows for a parameter gradient."""
    return evaluations * C_BLOCK * U32 * math.sqrt(max(3 * width, hidden, tokens) + rows)


def toy_tol(depth, width, u):
    """Relative bound for a segment of `depth` tanh-linear layers of `width`
    in states of unit roundoff u (test_segment_values.cpp)."""
    return 2 * depth * (width + 8) * u


def close(actual, expected, tol):
    """max |actual - expected| <= tol max |expected|; returns the relative error."""
    expected = np.asarray(expected, np.float64)
    scale = max(np.abs(expected).max(), 1e-30)
    err = np.abs(np.asarray(actual, np.float64) - expected).max() / scale
    if os.environ.get("FLATMEM_TEST_VERBOSE"):
        test = os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0]
        print(f"\nerror/tolerance {err / tol:.3g} (error {err:.3g}, tolerance {tol:.3g}) {test}")
    assert err <= tol, f"relative error {err:.3g} > {tol:.3g}"
    return err


class Transformer:
    """A segment of built-in blocks with its parameters, gradients and the
    reference's view of them."""

    def __init__(self, depth, width, heads, hidden=0, *, mode="auto", num_threads=2, seed=0,
                 math="fp32"):
        rng = np.random.default_rng(seed)
        self.heads, self.width = heads, width
        self.hidden = hidden or 4 * width
        self.layers, self.blocks, self.grads = [], [], []
        for _ in range(depth):
            att = flatmem.Block("attention", width, heads=heads, eps=EPS, math=math)
            mlp = flatmem.Block("mlp", width, hidden=self.hidden, eps=EPS, math=math)
            pa = ref.random_parameters(rng, ref.attention_shapes(width))
            pm = ref.random_parameters(rng, ref.mlp_shapes(width, self.hidden))
            ga = [np.zeros_like(p) for p in pa]
            gm = [np.zeros_like(p) for p in pm]
            att.set_parameters(pa, ga)
            mlp.set_parameters(pm, gm)
            self.layers.append((pa, pm))
            self.blocks.append((att, mlp))
            self.grads.append((ga, gm))
        self.segment = flatmem.ReversibleSegment(self.blocks, mode=mode, num_threads=num_threads)

    def zero_grads(self):
        for att, mlp in self.blocks:
            att.zero_grads()
            mlp.zero_grads()


def states(shape, seed=1, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape).astype(dtype), rng.standard_normal(shape).astype(dtype))


# ---------------------------------------------------------------------------
# The reference itself
# ---------------------------------------------------------------------------


def test_reference_gradients_match_finite_differences():
    """The hand-written backward of the reference against central differences
    of its forward (float64, h = 1e-6: truncation and roundoff ~1e-8)."""
    rng = np.random.default_rng(5)
    width, heads, hidden = 6, 2, 10
    layers = [(ref.random_parameters(rng, ref.attention_shapes(width)),
               ref.random_parameters(rng, ref.mlp_shapes(width, hidden))) for _ in range(2)]
    layers = [([p.astype(np.float64) for p in pa], [p.astype(np.float64) for p in pm]) for pa, pm in layers]
    x1, x2 = (rng.standard_normal((2, 3, width)) for _ in range(2))
    w1, w2 = (rng.standard_normal((2, 3, width)) for _ in range(2))

    def loss():
        y1, y2, _ = ref.segment_forward(x1, x2, layers, heads)
        return float((w1 * y1).sum() + (w2 * y2).sum())

    _, _, tape = ref.segment_forward(x1, x2, layers, heads)
    dx1, dx2, grads = ref.segment_backward(w1, w2, layers, heads, tape)
    probes = [(x1, dx1), (x2, dx2), (layers[0][0][2], grads[0][0][2]), (layers[1][1][0], grads[1][1][0]),
              (layers[1][0][4], grads[1][0][4]), (layers[0][1][3], grads[0][1][3])]
    for array, grad in probes:
        for index in [(0,) * array.ndim, tuple(s - 1 for s in array.shape)]:
            keep = array[index]
            array[index] = keep + 1e-6
            up = loss()
            array[index] = keep - 1e-6
            down = loss()
            array[index] = keep
            assert abs((up - down) / 2e-6 - grad[index]) <= 1e-6 * (1 + abs(grad[index]))


# ---------------------------------------------------------------------------
# Built-in blocks
# ---------------------------------------------------------------------------

SHAPES = [(1, 1, 12), (2, 7, 12), (7, 12), (1, 12)]


@pytest.mark.parametrize("depth", [1, 3])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_builtin_forward_matches_reference(shape, depth):
    t = Transformer(depth, 12, 3)
    x1, x2 = states(shape)
    y1, y2 = t.segment.forward(x1, x2)
    assert y1.shape == y2.shape == shape and y1.dtype == np.float32
    r1, r2, _ = ref.segment_forward(x1, x2, t.layers, t.heads, EPS)
    tol = builtin_tol(2 * depth, t.width, t.hidden, shape[-2])  # F and G of each layer
    close(y1, r1, tol)
    close(y2, r2, tol)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("depth", [1, 3])
@pytest.mark.parametrize("shape", [(2, 7, 12), (7, 12), (1, 1, 12)], ids=lambda s: "x".join(map(str, s)))
def test_builtin_backward_matches_reference(shape, depth, mode):
    t = Transformer(depth, 12, 3, mode=mode)
    x1, x2 = states(shape)
    dy1, dy2 = states(shape, seed=2)
    y1, y2 = t.segment.forward(x1, x2)
    dx1, dx2 = t.segment.backward(y1, y2, dy1, dy2)
    _, _, tape = ref.segment_forward(x1, x2, t.layers, t.heads, EPS)
    r1, r2, rgrads = ref.segment_backward(dy1, dy2, t.layers, t.heads, tape)
    # inputs of the VJPs (2 depth evaluations) + VJPs (2 depth); parameter gradients sum over the rows
    tokens, rows = shape[-2], math.prod(shape[:-1])
    close(dx1, r1, builtin_tol(4 * depth, t.width, t.hidden, tokens))
    close(dx2, r2, builtin_tol(4 * depth, t.width, t.hidden, tokens))
    for (ga, gm), (ra, rm) in zip(t.grads, rgrads):
        for got, want in zip(ga + gm, ra + rm):
            close(got, want, builtin_tol(4 * depth, t.width, t.hidden, tokens, rows))
    assert t.segment.last_mode == mode if mode != "auto" else t.segment.last_mode in ("vanilla", "overlapped")


def test_parameter_gradients_accumulate_and_zero():
    """A second backward on the same inputs adds the same per-call gradient
    again (reversible.h: ACCUMULATED, +=). The bias and LayerNorm gradients
    are added once per call (g += float(sum)), so they double exactly; the
    weight gradients are sgemm's C += A^T B (beta 1): OpenBLAS adds the
    finished product once (exact doubling too, as observed here), but a BLAS
    may add the terms of the row reduction onto C one by one (the reference
    BLAS does for this product), rounding at the size of C. Only that last
    reduction over the rows differs between the calls, so twice = 2 once
    within c u sqrt(rows) of max|2 once| (c = 16 as in block_case.hpp; 3e-6
    here, while a lost or doubled call's contribution is an O(1) error)."""
    t = Transformer(2, 12, 3, mode="vanilla")
    shape = (2, 5, 12)
    x1, x2 = states(shape)
    y1, y2 = t.segment.forward(x1, x2)
    t.segment.backward(y1, y2, x1, x2)
    once = [g.copy() for ga, gm in t.grads for g in ga + gm]
    t.segment.backward(y1, y2, x1, x2)
    twice = [g for ga, gm in t.grads for g in ga + gm]
    rows = shape[0] * shape[1]
    for a, b in zip(once, twice):
        close(b, 2 * a.astype(np.float64), C_BLOCK * U32 * math.sqrt(rows))
    t.zero_grads()
    assert all(not g.any() for g in twice)


@pytest.mark.parametrize("num_threads", [1, 2, 3])
def test_overlapped_is_bitwise_vanilla(num_threads):
    """OVERLAPPED makes the same calls on the same inputs as VANILLA: dx and
    every parameter gradient are bitwise equal, at any thread count (the
    blocks' partition does not depend on it)."""
    results = {}
    for mode in ("vanilla", "overlapped"):
        t = Transformer(3, 12, 3, mode=mode, num_threads=num_threads)
        x1, x2 = states((2, 7, 12))
        dy1, dy2 = states((2, 7, 12), seed=3)
        y1, y2 = t.segment.forward(x1, x2)
        dx1, dx2 = t.segment.backward(y1, y2, dy1, dy2)
        assert t.segment.last_mode == mode
        results[mode] = [dx1, dx2] + [g for ga, gm in t.grads for g in ga + gm]
    for a, b in zip(results["vanilla"], results["overlapped"]):
        assert np.array_equal(a, b)
    if num_threads == 1:
        test_overlapped_is_bitwise_vanilla.single = results["vanilla"]
    elif hasattr(test_overlapped_is_bitwise_vanilla, "single"):
        for a, b in zip(test_overlapped_is_bitwise_vanilla.single, results["vanilla"]):
            assert np.array_equal(a, b)


def test_tf32_math_gives_the_fp32_bits_on_the_cpu():
    """flatmem_block_options.math: the CPU runs FP32 for TF32 too, so a
    segment of TF32 blocks gives the FP32 segment's bits."""
    results = {}
    for block_math in ("fp32", "tf32", flatmem.capi.BLOCK_MATH_TF32):
        t = Transformer(2, 12, 3, mode="vanilla", math=block_math)
        x1, x2 = states((2, 7, 12))
        dy1, dy2 = states((2, 7, 12), seed=3)
        y1, y2 = t.segment.forward(x1, x2)
        dx1, dx2 = t.segment.backward(y1, y2, dy1, dy2)
        results[block_math] = [y1, y2, dx1, dx2] + [g for ga, gm in t.grads for g in ga + gm]
    assert t.blocks[0][0].math == "tf32"
    assert "math='tf32'" in repr(t.blocks[0][0])
    for other in ("tf32", flatmem.capi.BLOCK_MATH_TF32):
        for a, b in zip(results["fp32"], results[other]):
            assert np.array_equal(a, b)
    assert (flatmem.capi.BLOCK_MATH_FP32, flatmem.capi.BLOCK_MATH_TF32) == (0, 1)


def test_math_outside_the_enum_is_refused():
    with pytest.raises(ValueError, match="math: 'fp16' is not one of"):
        flatmem.Block("mlp", 12, math="fp16")
    # a number goes to the library, which names the field
    for bad in (2, -1, 0x7FFFFFFF):
        with raises_flatmem(flatmem.InvalidArgumentError, INVALID, "options.math"):
            flatmem.Block("attention", 12, heads=3, math=bad)


def test_return_inputs_and_rebuild_error():
    t = Transformer(3, 12, 3, mode="overlapped")
    x1, x2 = states((2, 7, 12))
    y1, y2 = t.segment.forward(x1, x2)
    dx1, dx2, r1, r2 = t.segment.backward(y1, y2, x1, x2, return_inputs=True)
    assert r1.shape == x1.shape and r1.dtype == np.float32
    # The rebuild evaluates F and G on the forward's own bits (the blocks are
    # deterministic), so their rounding cancels; what is left is the forward's
    # residual add and the rebuild's subtraction, u |Y| each, carried through
    # the blocks' Jacobians: at most one evaluation's c u sqrt(K) per block.
    tol = builtin_tol(2 * 3, t.width, t.hidden, 7)
    close(r1, x1, tol)
    close(r2, x2, tol)
    errors = t.segment.rebuild_error(x1, x2)
    assert errors.shape == (3,) and errors.dtype == np.float64
    assert np.all(errors >= 0) and np.all(errors <= tol)


def test_workspace_sizes_and_repr():
    t = Transformer(2, 12, 3, mode="vanilla")
    x = np.zeros((2, 7, 12), np.float32)
    assert t.segment.forward_workspace_size(x) >= 0
    assert t.segment.backward_workspace_size(x) > 0
    assert "2 blocks" in repr(t.segment) and "vanilla" in repr(t.segment)
    assert t.segment.last_mode == "auto"  # no backward yet
    assert repr(t.blocks[0][0]) == "flatmem.Block('attention', width=12, heads=3, eps=1e-06)"
    assert t.blocks[0][1].parameter_shapes == ref.mlp_shapes(12, 48)


def test_dlpack_inputs_are_taken_without_copy():
    class OnlyDlpack:
        def __init__(self, a):
            self.a = a

        def __dlpack__(self, *args, **kwargs):
            return self.a.__dlpack__(*args, **kwargs)

        def __dlpack_device__(self):
            return self.a.__dlpack_device__()

    t = Transformer(1, 12, 3, mode="vanilla")
    x1, x2 = states((2, 7, 12))
    y1, y2 = t.segment.forward(OnlyDlpack(x1), OnlyDlpack(x2))
    z1, z2 = t.segment.forward(x1, x2)
    assert np.array_equal(y1, z1) and np.array_equal(y2, z2)


def test_gil_is_released_during_backward():
    """While a worker thread runs a backward of built-in blocks, the main
    thread keeps running Python (counted steps, no clocks; see
    python_support.assert_main_thread_runs_during for the argument)."""
    t = Transformer(4, 64, 4, mode="vanilla", num_threads=1)
    x1, x2 = states((4, 64, 64))
    y1, y2 = t.segment.forward(x1, x2)
    assert_main_thread_runs_during(lambda: t.segment.backward(y1, y2, x1, x2))


# ---------------------------------------------------------------------------
# Python functions as F and G
# ---------------------------------------------------------------------------


class TanhLinear(flatmem.Function):
    """F(x) = tanh(x W), keeping tanh(x W) as its residual."""

    def __init__(self, w):
        self.w = w
        self.calls = []

    def forward(self, x, ctx):
        self.calls.append((ctx.block, ctx.part, ctx.phase, threading.get_ident()))
        y = np.tanh(x @ self.w)
        if ctx.keeps_residuals:
            self.save(ctx, y)
        return y

    def vjp(self, x, dy, ctx):
        self.calls.append((ctx.block, ctx.part, ctx.phase, threading.get_ident()))
        y = self.load(ctx)
        return (dy * (1.0 - y * y)) @ self.w.T


def tanh_weights(depth, width, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((width, width)) * 0.4, rng.standard_normal((width, width)) * 0.4)
            for _ in range(depth)]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_python_functions_match_reference(mode, dtype):
    depth, shape = 3, (3, 5, 8)
    weights = tanh_weights(depth, 8)
    functions = [(TanhLinear(wf.astype(dtype)), TanhLinear(wg.astype(dtype))) for wf, wg in weights]
    seg = flatmem.ReversibleSegment(functions, mode=mode, num_threads=3)
    x1, x2 = states(shape, dtype=dtype)
    dy1, dy2 = states(shape, seed=4, dtype=dtype)
    y1, y2 = seg.forward(x1, x2)
    dx1, dx2 = seg.backward(y1, y2, dy1, dy2)
    assert y1.dtype == dx1.dtype == dtype
    w64 = [(wf.astype(dtype).astype(np.float64), wg.astype(dtype).astype(np.float64)) for wf, wg in weights]
    r = ref.tanh_segment(*(a.astype(np.float64) for a in (x1, x2)), w64, *(a.astype(np.float64) for a in (dy1, dy2)))
    tol = toy_tol(depth, 8, U64 if dtype == np.float64 else U32)
    for got, want in zip((y1, y2, dx1, dx2), r):
        close(got, want, tol)
    # every stored residual was consumed
    assert all(not f.__dict__.get("_flatmem_saved") for pair in functions for f in pair)
    if seg.last_mode == "overlapped":  # the rebuild's forwards ran on the library's thread
        rebuild = {c[3] for pair in functions for f in pair for c in f.calls if c[2] == "rebuild"}
        assert threading.get_ident() not in rebuild


def test_python_overlapped_is_bitwise_vanilla():
    weights = tanh_weights(4, 8, seed=3)
    out = {}
    for mode in ("vanilla", "overlapped"):
        seg = flatmem.ReversibleSegment([(TanhLinear(wf), TanhLinear(wg)) for wf, wg in weights], mode=mode)
        x1, x2 = states((5, 8), dtype=np.float64)
        y1, y2 = seg.forward(x1, x2)
        out[mode] = seg.backward(y1, y2, x2, x1, return_inputs=True)
    for a, b in zip(out["vanilla"], out["overlapped"]):
        assert np.array_equal(a, b)


def test_builtin_and_python_blocks_mixed():
    """F: a built-in attention block; G: a Python tanh-linear (fp32 states)."""
    rng = np.random.default_rng(7)
    width, heads = 12, 3
    att = flatmem.Block("attention", width, heads=heads, eps=EPS)
    pa = ref.random_parameters(rng, ref.attention_shapes(width))
    ga = [np.zeros_like(p) for p in pa]
    att.set_parameters(pa, ga)
    w = (rng.standard_normal((width, width)) * 0.4).astype(np.float32)
    seg = flatmem.ReversibleSegment([(att, TanhLinear(w))], mode="overlapped")
    x1, x2 = states((2, 4, width))
    dy1, dy2 = states((2, 4, width), seed=8)
    y1, y2 = seg.forward(x1, x2)
    dx1, dx2 = seg.backward(y1, y2, dy1, dy2)
    # reference: y1 = x1 + F(x2), y2 = x2 + G(y1)
    f, fs = ref.attention(ref.as3d(x2), pa, heads, EPS)
    r1 = x1 + f
    r2 = x2 + ref.tanh_linear(r1, w.astype(np.float64))
    d1 = dy1 + ref.tanh_linear_vjp(r1, w.astype(np.float64), dy2)
    df, gatt = ref.attention_backward(d1, pa, heads, fs)
    # one layer: values depend on 2 block evaluations, gradients on 4 (the
    # tanh-linear's 12-term dot product is within the attention's K = 36)
    for got, want in [(y1, r1), (y2, r2)]:
        close(got, want, builtin_tol(2, width, 0, 4))
    for got, want in [(dx1, d1), (dx2, dy2 + df)]:
        close(got, want, builtin_tol(4, width, 0, 4))
    for got, want in zip(ga, gatt):
        close(got, want, builtin_tol(4, width, 0, 4, rows=8))


class Dropout(flatmem.Function):
    """F(x) = mask * tanh(x W), the mask drawn from (ctx.seed, ctx.offset)."""

    def __init__(self, w):
        self.w = w

    def mask(self, ctx, shape):
        return np.random.default_rng([ctx.seed, ctx.offset]).random(shape) < 0.7

    def forward(self, x, ctx):
        return self.mask(ctx, x.shape) * np.tanh(x @ self.w)

    def vjp(self, x, dy, ctx):
        y = np.tanh(x @ self.w)
        return (self.mask(ctx, x.shape) * dy * (1 - y * y)) @ self.w.T


def test_randomness_replays_in_the_rebuild():
    """Masks drawn from (seed, offset) are the same in the forward, STANDARD's
    recording forward and the rebuild: all modes give the same gradients, and
    another seed gives other ones."""
    weights = tanh_weights(3, 6, seed=9)
    x1, x2 = states((4, 6), dtype=np.float64)
    results = {}
    for mode in ("standard", "vanilla", "overlapped"):
        seg = flatmem.ReversibleSegment([(Dropout(wf), Dropout(wg)) for wf, wg in weights], mode=mode)
        y1, y2 = seg.forward(x1, x2, seed=42, offset=7)
        results[mode] = seg.backward(y1, y2, x1, x2, seed=42, offset=7, return_inputs=True)
        close(results[mode][2], x1, toy_tol(3, 6, U64))
    # STANDARD differentiates at the true inputs, VANILLA at the rebuilt ones:
    # each within toy_tol of the exact gradients, so within twice that of
    # each other; OVERLAPPED makes VANILLA's calls: the same bits.
    for a, b in zip(results["standard"], results["vanilla"]):
        close(b, a, 2 * toy_tol(3, 6, U64))
    for a, b in zip(results["vanilla"], results["overlapped"]):
        assert np.array_equal(a, b)
    seg = flatmem.ReversibleSegment([(Dropout(wf), Dropout(wg)) for wf, wg in weights])
    other = seg.forward(x1, x2, seed=43, offset=7)
    assert not np.allclose(other[0], seg.forward(x1, x2, seed=42, offset=7)[0])


def test_context_values():
    seen = []

    def f(x):
        return np.zeros_like(x)

    class Spy(flatmem.Function):
        def forward(self, x, ctx):
            seen.append((ctx.block, ctx.part, ctx.phase, ctx.seed, ctx.offset, ctx.key, ctx.num_threads))
            return np.zeros_like(x)

        def vjp(self, x, dy, ctx):
            return np.zeros_like(x)

    seg = flatmem.ReversibleSegment([(Spy(), f), (f, Spy())], mode="vanilla", num_threads=1)
    x = np.ones((2, 3))
    seg.forward(x, x, seed=5, offset=11)
    seed0 = flatmem.capi.reversible_block_seed(5, 0, 0)
    seed1 = flatmem.capi.reversible_block_seed(5, 1, 1)
    assert seen == [(0, "F", "forward", seed0, 11, (0, "F"), 1), (1, "G", "forward", seed1, 11, (1, "G"), 1)]


def test_plain_callable_is_forward_only():
    seg = flatmem.ReversibleSegment([(np.tanh, np.sin)])
    x1, x2 = states((3, 4), dtype=np.float64)
    y1, y2 = seg.forward(x1, x2)
    # Y1 = X1 + F(X2), Y2 = X2 + G(Y1) (reversible.h): F's own output plus
    # one correctly rounded float64 addition, the same bits as NumPy's
    assert np.array_equal(y1, x1 + np.tanh(x2))
    assert np.array_equal(y2, x2 + np.sin(y1))
    with pytest.raises(TypeError, match=r"blocks\[0\] F: .* has no vjp"):
        seg.backward(y1, y2, x1, x2)


class MissingKey(KeyError):
    """A KeyError that weak references can follow (the built-in one cannot)."""


class Raising(TanhLinear):
    """Raises in one block / part / phase."""

    def __init__(self, w, when):
        super().__init__(w)
        self.when = when

    def forward(self, x, ctx):
        if (ctx.block, ctx.phase) == self.when:
            raise MissingKey(f"no key in block {ctx.block}")
        return super().forward(x, ctx)

    def vjp(self, x, dy, ctx):
        if (ctx.block, ctx.phase) == self.when:
            raise ZeroDivisionError("vjp failed")
        return super().vjp(x, dy, ctx)


# (mode, (block, phase)) where that phase runs: STANDARD's forward is the
# recording one and it rebuilds nothing; the others record nothing.
RAISING_CASES = [("standard", (2, "record")), ("standard", (1, "gradient"))] + [
    (mode, when) for mode in ("vanilla", "overlapped")
    for when in [(1, "forward"), (0, "rebuild"), (1, "gradient")]]


@pytest.mark.parametrize("mode, when", RAISING_CASES, ids=lambda v: v if isinstance(v, str) else f"{v[1]}{v[0]}")
def test_raising_function_surfaces_with_block_index(mode, when):
    """The function's own exception is re-raised, with a note naming the block
    (flatmem's message), and the segment keeps working."""
    weights = tanh_weights(3, 8)
    raising = Raising(weights[when[0]][1], when)
    functions = [(TanhLinear(wf), raising if k == when[0] else TanhLinear(wg))
                 for k, (wf, wg) in enumerate(weights)]
    seg = flatmem.ReversibleSegment(functions, mode=mode)
    x1, x2 = states((2, 8), dtype=np.float64)
    phase = when[1]
    expected = ZeroDivisionError if phase == "gradient" else KeyError
    if phase in ("forward", "record"):
        with pytest.raises(expected) as info:
            seg.forward(x1, x2)
    else:
        y1, y2 = seg.forward(x1, x2)
        with pytest.raises(expected) as info:
            seg.backward(y1, y2, x1, x2)
    notes = getattr(info.value, "__notes__", [])
    assert any(f"block {when[0]}, G " in n and n.startswith("flatmem: ") for n in notes), notes
    # The segment works again once the function does.
    raising.when = None
    for f in functions:
        for g in f:
            g.__dict__.pop("_flatmem_saved", None)
    y1, y2 = seg.forward(x1, x2)
    dx1, dx2 = seg.backward(y1, y2, x1, x2)
    r = ref.tanh_segment(x1, x2, weights, x1, x2)
    close(dx1, r[2], toy_tol(3, 8, U64))


def test_function_errors_found_by_the_binding():
    def wrong_shape(x):
        return x[:, :1]

    class Keeps(flatmem.Function):
        def forward(self, x, ctx):
            self.x = x  # a view of flatmem's buffer: refused
            return x * 2

    class Integer(flatmem.Function):
        def forward(self, x, ctx):
            return np.ones(x.shape, np.int64)

    x1, x2 = states((2, 3), dtype=np.float64)
    cases = [(wrong_shape, "block 0, F forward: returned y of shape (2, 1); expected (2, 3)"),
             (Keeps(), "block 0, F forward: the function kept a view of x beyond the call"),
             (Integer(), "returned y of dtype int64; expected a floating-point array")]
    for fn, fragment in cases:
        seg = flatmem.ReversibleSegment([(fn, np.tanh)])
        with pytest.raises(flatmem.InvalidArgumentError) as info:
            seg.forward(x1, x2)
        assert fragment in str(info.value)
        assert info.value.status == flatmem.capi.STATUS_INVALID_ARGUMENT


def test_vjp_returning_none_is_an_error():
    class NoReturn(TanhLinear):
        def vjp(self, x, dy, ctx):
            super().vjp(x, dy, ctx)

    seg = flatmem.ReversibleSegment([(NoReturn(np.eye(3)), NoReturn(np.eye(3)))], mode="vanilla")
    x = np.ones((2, 3))
    y1, y2 = seg.forward(x, x)
    with pytest.raises(flatmem.InvalidArgumentError, match="block 0, G vjp: returned None"):
        seg.backward(y1, y2, x, x)


def test_a_function_calling_its_own_segment_is_refused():
    holder = {}

    class Reentrant(flatmem.Function):
        def forward(self, x, ctx):
            holder["segment"].forward(x, x)
            return x * 1

    seg = holder["segment"] = flatmem.ReversibleSegment([(Reentrant(), np.tanh)])
    x = np.ones((2, 3))
    with pytest.raises(RuntimeError, match="called the segment itself"):
        seg.forward(x, x)
    holder.clear()


def test_no_reference_leaks():
    """The segment releases its functions when it goes, and a raised
    exception is not kept anywhere (refcounts and weak references)."""
    fn = TanhLinear(np.eye(4) * 0.5)
    base = sys.getrefcount(fn)
    seg = flatmem.ReversibleSegment([(fn, fn)], mode="overlapped")
    x = np.ones((2, 4))
    for _ in range(20):
        y1, y2 = seg.forward(x, x)
        seg.backward(y1, y2, x, x)
    del seg, y1, y2
    gc.collect()
    assert sys.getrefcount(fn) == base

    raising = Raising(np.eye(4), (0, "forward"))
    seg = flatmem.ReversibleSegment([(raising, raising)])
    refs = []
    for _ in range(5):
        try:
            seg.forward(x, x)
        except KeyError as e:
            refs.append(weakref.ref(e))
    gc.collect()
    assert all(r() is None for r in refs)
    del seg
    gc.collect()
    assert sys.getrefcount(raising) == 2


# ---------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------

INVALID = flatmem.capi.STATUS_INVALID_ARGUMENT


def test_bad_inputs_name_the_argument():
    t = Transformer(1, 12, 3, mode="vanilla")
    x1, x2 = states((2, 7, 12))
    with raises_flatmem(flatmem.InvalidArgumentError, INVALID, "x2"):
        t.segment.forward(x1, np.zeros((2, 6, 12), np.float32))
    with raises_flatmem(flatmem.InvalidArgumentError, INVALID, "x1", "dtype"):
        t.segment.forward(x1.astype(np.float16), x2.astype(np.float16))
    # fp64 states pass the segment; the built-in block refuses them
    with raises_flatmem(flatmem.InvalidArgumentError, INVALID, "block 0, F forward", "float32"):
        t.segment.forward(x1.astype(np.float64), x2.astype(np.float64))
    with raises_flatmem(flatmem.InvalidArgumentError, INVALID, "block 0, F forward", "width 12"):
        t.segment.forward(np.zeros((2, 7, 8), np.float32), np.zeros((2, 7, 8), np.float32))
    y1, y2 = t.segment.forward(x1, x2)
    with raises_flatmem(flatmem.InvalidArgumentError, INVALID, "dy2"):
        t.segment.backward(y1, y2, x1, np.zeros((2, 7, 11), np.float32))
    # the segment still works
    t.segment.backward(y1, y2, x1, x2)


def test_bad_parameters_name_the_parameter():
    att = flatmem.Block("attention", 12, heads=3)
    good = ref.random_parameters(np.random.default_rng(0), ref.attention_shapes(12))
    bad = list(good)
    bad[2] = np.zeros((12, 30), np.float32)
    with raises_flatmem(flatmem.InvalidArgumentError, INVALID, "parameters[2] (qkv_weight)", "(12, 36)"):
        att.set_parameters(bad)
    bad[2] = good[2].astype(np.float64)
    with raises_flatmem(flatmem.InvalidArgumentError, INVALID, "parameters[2]", "dtype"):
        att.set_parameters(bad)
    grads = [np.zeros_like(p) for p in good]
    grads[5] = np.zeros(11, np.float32)
    with raises_flatmem(flatmem.InvalidArgumentError, INVALID, "gradients[5] (proj_bias)"):
        att.set_parameters(good, grads)
    with pytest.raises(ValueError, match="params: 5 arrays"):
        att.set_parameters(good[:5])
    with raises_flatmem(flatmem.InvalidArgumentError, INVALID, "heads"):
        flatmem.Block("attention", 12, heads=5)
    with pytest.raises(ValueError, match="kind: 'conv'"):
        flatmem.Block("conv", 12)
    # a forward-only block refuses a backward, with the block named
    att.set_parameters(good)
    mlp = flatmem.Block("mlp", 12)
    mlp.set_parameters(ref.random_parameters(np.random.default_rng(1), ref.mlp_shapes(12, 48)))
    seg = flatmem.ReversibleSegment([(att, mlp)], mode="vanilla")
    x1, x2 = states((7, 12))
    y1, y2 = seg.forward(x1, x2)
    with raises_flatmem(flatmem.InvalidArgumentError, INVALID, "block 0, G", "gradients not set"):
        seg.backward(y1, y2, x1, x2)


def test_unset_parameters_and_bad_segments():
    seg = flatmem.ReversibleSegment([(flatmem.Block("attention", 12, heads=3), flatmem.Block("mlp", 12))])
    x1, x2 = states((7, 12))
    with raises_flatmem(flatmem.InvalidArgumentError, INVALID, "block 0, F", "parameters not set"):
        seg.forward(x1, x2)
    with pytest.raises(ValueError, match="mode: 'fast'"):
        flatmem.ReversibleSegment([(np.tanh, np.tanh)], mode="fast")
    with pytest.raises(ValueError, match="blocks: empty"):
        flatmem.ReversibleSegment([])
    with pytest.raises(TypeError, match=r"blocks\[0\] G: expected"):
        flatmem.ReversibleSegment([(np.tanh, 3)])
    with raises_flatmem(flatmem.InvalidArgumentError, INVALID, "num_threads"):
        flatmem.ReversibleSegment([(np.tanh, np.tanh)], num_threads=-2)
    seg.close()
    with pytest.raises(ValueError, match="closed"):
        seg.forward(x1, x2)


# ---------------------------------------------------------------------------
# The README's reversible snippet
# ---------------------------------------------------------------------------


def test_readme_reversible_snippet_runs(capsys):
    import pathlib
    import re

    run_readme_block(pathlib.Path(__file__).resolve().parents[1] / "README.md", "ReversibleSegment")
    out = capsys.readouterr().out
    assert re.search(r"^backward ran (vanilla|overlapped); \|dx1\| \d+\.\d+", out, re.M), out
    assert "block 1, F forward" in out, out
