"""flatmem.torch's losses on CPU tensors against the float64 torch reference (torch_reference.py),
within the bounds the library's arithmetic allows (python_reference.py), over awkward shapes; the
autograd wiring (a learned log-scale, an upstream gradient, grad_scale, gradients not requested);
layouts; errors. The operators' own checks (opcheck, torch.compile) are in test_torch_ops.py, the
open_clip modules in test_torch_open_clip.py."""
import numpy as np
import pytest
import torch

import flatmem
import flatmem.torch as fmt
import torch_reference as ref
from python_reference import forward_tolerance, gradient_tolerances
from python_sigmoid_reference import sigmoid_tolerances

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def unit_rows(seed, rows, d, dtype=torch.float32):
    """Unit-norm random rows (as CLIP features are), rounded to dtype."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, d, generator=g, dtype=torch.float64)
    return (x / x.norm(dim=1, keepdim=True)).to(dtype)


def bound_dtype(dtype):
    """The NumPy stand-in python_reference's rounding bound keys on (itemsize 2, not float16: bf16)."""
    return {torch.float32: np.float32, torch.float16: np.float16, torch.bfloat16: np.dtype("u2")}[dtype]


def leaves(q, k, *scalars):
    out = [q.clone().requires_grad_(), k.clone().requires_grad_()]
    return out + [torch.tensor(float(v), requires_grad=True) for v in scalars]


def check_close(name, got, want, tau):
    got = got.detach().to(torch.float64).numpy() if isinstance(got, torch.Tensor) else np.asarray(got)
    err = np.abs(got - want)
    if np.ndim(err):
        worst = np.unravel_index(np.argmax(err / tau), err.shape)
        assert np.all(err <= tau), f"{name}: worst at {worst}: {got[worst]!r} vs {want[worst]!r}, bound {tau[worst]:.3g}"
    else:
        assert err <= tau, f"{name}: {float(got)!r} vs {float(want)!r}, bound {float(tau):.3g}"


# (b, c, d): one row, primes, sizes that are not multiples of the CPU's 512-wide tiles, c > b
SOFTMAX_SHAPES = [(1, 1, 1), (7, 7, 33), (97, 97, 64), (300, 300, 130), (600, 600, 17)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("b,c,d", SOFTMAX_SHAPES)
@pytest.mark.parametrize("s", [10.0, 100.0])
def test_clip_loss_and_gradients_match_the_float64_reference(dtype, b, c, d, s):
    dt = DTYPES[dtype]
    q, k = unit_rows(b, b, d, dt), unit_rows(1000 + c, c, d, dt)
    q_, k_, s_ = leaves(q, k, s)
    loss = fmt.clip_loss(q_, k_, s_)
    loss.backward()
    want = ref.clip(q, k, s)
    q64, k64 = ref.widened(q), ref.widened(k)
    assert loss.dtype == torch.float32 and loss.shape == ()
    check_close("loss", loss, want[0], forward_tolerance(q64, k64, np.float32(s), want[0]))
    tau_dq, tau_dk, tau_ds = gradient_tolerances(q64, k64, np.float32(s), None, True, 1.0, bound_dtype(dt))
    assert q_.grad.dtype == dt and k_.grad.dtype == dt
    check_close("dq", q_.grad, want[1], tau_dq)
    check_close("dk", k_.grad, want[2], tau_dk)
    check_close("ds", s_.grad, want[3], tau_ds)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("b,c,d", [(1, 5, 3), (97, 131, 64), (300, 257, 130)])
def test_infonce_with_labels_and_more_columns_matches_the_reference(dtype, b, c, d):
    dt = DTYPES[dtype]
    q, k = unit_rows(b, b, d, dt), unit_rows(2000 + c, c, d, dt)
    labels = torch.as_tensor(np.random.default_rng(b).integers(0, c, size=b))
    q_, k_, s_ = leaves(q, k, 14.3)
    g = 0.75
    loss = fmt.infonce_loss(q_, k_, s_, labels)
    (g * loss).backward()
    want = ref.infonce(q, k, 14.3, labels.numpy(), g)
    q64, k64 = ref.widened(q), ref.widened(k)
    check_close("loss", loss, want[0], forward_tolerance(q64, k64, np.float32(14.3), want[0]))
    tau_dq, tau_dk, tau_ds = gradient_tolerances(q64, k64, np.float32(14.3), labels.numpy(), False, g,
                                                 bound_dtype(dt))
    check_close("dq", q_.grad, want[1], tau_dq)
    check_close("dk", k_.grad, want[2], tau_dk)
    check_close("ds", s_.grad, want[3], tau_ds)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("b,c,d,labelled", [(1, 1, 1, False), (7, 7, 33, False), (97, 131, 64, True),
                                            (300, 300, 130, False)])
@pytest.mark.parametrize("recompute", [False, True])
def test_sigmoid_loss_matches_the_reference(dtype, b, c, d, labelled, recompute):
    dt = DTYPES[dtype]
    q, k = unit_rows(b, b, d, dt), unit_rows(3000 + c, c, d, dt)
    labels = torch.as_tensor(np.random.default_rng(c).integers(0, c, size=b)) if labelled else None
    q_, k_, s_, t_ = leaves(q, k, 10.0, -10.0)
    loss = fmt.sigmoid_loss(q_, k_, s_, t_, labels, recompute=recompute)
    loss.backward()
    lab = None if labels is None else labels.numpy()
    want = ref.sigmoid(q, k, 10.0, -10.0, lab)
    tau = sigmoid_tolerances(ref.widened(q), ref.widened(k), np.float32(10.0), np.float32(-10.0), lab, 1.0,
                             bound_dtype(dt))
    check_close("loss", loss, want[0], tau["loss"])
    check_close("dq", q_.grad, want[1], tau["dq"])
    check_close("dk", k_.grad, want[2], tau["dk"])
    check_close("ds", s_.grad, want[3], tau["ds"])
    check_close("dt", t_.grad, want[4], tau["dt"])


def test_the_two_sigmoid_paths_give_the_same_bits():
    q, k = unit_rows(1, 45, 19), unit_rows(2, 45, 19)
    out = []
    for recompute in (False, True):
        q_, k_, s_, t_ = leaves(q, k, 10.0, -10.0)
        loss = fmt.sigmoid_loss(q_, k_, s_, t_, recompute=recompute)
        loss.backward()
        out.append([loss, q_.grad, k_.grad, s_.grad, t_.grad])
    for a, b in zip(*out):
        assert torch.equal(a, b)


def test_a_learned_log_scale_gets_its_gradient_through_autograd():
    q, k = unit_rows(3, 40, 16), unit_rows(4, 40, 16)
    log_s = torch.tensor(np.log(20.0), dtype=torch.float32, requires_grad=True)
    loss = fmt.clip_loss(q, k, log_s.exp())
    loss.backward()
    s = float(torch.exp(torch.tensor(np.log(20.0), dtype=torch.float32)))
    want = ref.clip(q, k, s)
    _, _, tau_ds = gradient_tolerances(ref.widened(q), ref.widened(k), np.float32(s))
    # d/dlog s = s dL/ds; the product adds an fp32 rounding
    check_close("dlog_s", log_s.grad, s * want[3], s * tau_ds + 2.0**-23 * abs(s * want[3]))
    assert q.grad is None and k.grad is None  # not leaves that ask for gradients


def test_gradients_not_requested_are_not_computed_and_grad_scale_multiplies():
    q, k = unit_rows(5, 33, 8), unit_rows(6, 33, 8)
    k_ = k.clone().requires_grad_()
    loss = fmt.clip_loss(q, k_, 5.0, grad_scale=4.0)
    loss.backward()
    want = ref.clip(q, k, 5.0)
    _, tau_dk, _ = gradient_tolerances(ref.widened(q), ref.widened(k), np.float32(5.0), g=4.0)
    check_close("dk", k_.grad, 4.0 * want[2], tau_dk)
    check_close("loss (not scaled)", loss, want[0], forward_tolerance(ref.widened(q), ref.widened(k), 5.0, want[0]))
    with torch.no_grad():
        assert fmt.sigmoid_loss(q, k, 3.0, -1.0).grad_fn is None


def test_the_logit_cache_gives_the_same_bits():
    q, k = unit_rows(7, 130, 40), unit_rows(8, 130, 40)
    out = []
    for cache in (0, 1 << 20):
        q_, k_, s_ = leaves(q, k, 10.0)
        loss = fmt.clip_loss(q_, k_, s_, logit_cache_bytes=cache)
        loss.backward()
        out.append([loss, q_.grad, k_.grad, s_.grad])
    for a, b in zip(*out):
        assert torch.equal(a, b)


def test_row_strided_views_are_read_in_place_and_other_layouts_copied():
    base = unit_rows(9, 50, 24)
    wide = torch.zeros(50, 40)
    wide[:, :24] = base
    view = wide[:, :24]                       # rows 40 apart: the library reads it in place
    transposed = base.T.contiguous().T        # column-major: made contiguous once
    k = unit_rows(10, 50, 24)
    want = fmt.clip_loss(base, k, 7.0)
    for q in (view, transposed):
        q_ = q.clone() if q is transposed else q
        got = fmt.clip_loss(q_, k, 7.0)
        assert torch.equal(got, want)
    q_ = wide.clone().requires_grad_()
    fmt.clip_loss(q_[:, :24], k, 7.0).backward()
    assert torch.all(q_.grad[:, 24:] == 0) and q_.grad.shape == (50, 40)


def test_errors_name_the_argument_and_touch_nothing():
    q, k = unit_rows(11, 8, 4), unit_rows(12, 8, 4)
    with pytest.raises(flatmem.InvalidArgumentError, match="k"):
        fmt.clip_loss(q, unit_rows(13, 8, 5), 10.0)
    with pytest.raises(flatmem.Error, match="q"):
        fmt.clip_loss(q.to(torch.float64), k.to(torch.float64), 10.0)
    with pytest.raises(flatmem.InvalidArgumentError, match="labels"):
        fmt.infonce_loss(q, k, 10.0, torch.tensor([0, 1, 2, 3, 4, 5, 6, 99]))
    with pytest.raises(TypeError, match="labels"):
        fmt.infonce_loss(q, k, 10.0, torch.zeros(8))
    with pytest.raises(ValueError, match="logit_scale"):
        fmt.clip_loss(q, k, torch.ones(2))
    with pytest.raises(ValueError, match="nonfinite"):
        fmt.clip_loss(q, k, 10.0, nonfinite="maybe")
    with pytest.raises(TypeError, match="q"):
        fmt.clip_loss(q.numpy(), k, 10.0)
    bad = q.clone()
    bad[3, 1] = float("nan")
    with pytest.raises(flatmem.NonFiniteError, match="q"):
        fmt.clip_loss(bad, k, 10.0, nonfinite="error")
    assert torch.isnan(fmt.clip_loss(bad, k, 10.0))  # the default propagates, as torch does


def test_import_flatmem_works_without_torch_and_flatmem_torch_says_what_is_missing():
    import subprocess
    import sys

    code = ("import sys\n"
            "class Hide:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name == 'torch' or name.startswith('torch.'):\n"
            "            raise ImportError('No module named ' + repr(name))\n"
            "sys.meta_path.insert(0, Hide())\n"
            "import flatmem\n"
            "flatmem.contrastive_loss\n"
            "try:\n"
            "    import flatmem.torch\n"
            "except ImportError as e:\n"
            "    print('refused:', e)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "refused: flatmem.torch needs PyTorch (pip install torch)" in done.stdout
