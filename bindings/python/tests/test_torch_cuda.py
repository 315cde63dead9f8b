"""flatmem.torch on CUDA tensors (skipped without a GPU: CI has none; scripts/gpu-check.sh's machines
have one). The CUDA kernels themselves are held to the float64 reference by the C++ suite
(ctest -L gpu); here the torch path: DLPack of device tensors, torch's current stream (including a
side stream), the workspace from torch's allocator, results on the device, autograd, compile.

Tolerances: the device computes fp32 inputs with TF32 products (flatmem's CUDA default: each logit
off by up to 2^-10 s sum_t |q_t k_t| <= 2^-10 s for unit rows), so the loss may differ from the
CPU's by 2.02 * 2^-10 s and a gradient element by (4 * 2^-10 s + 2^-9) of the largest; bf16 inputs
multiply exactly, and bf16 gradients round to 2^-8: 3 * 2^-8 of the largest."""
import contextlib

import pytest
import torch

import flatmem.torch as fmt
from test_torch_losses import unit_rows

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="skipped: no CUDA device")


def leaves(q, k, device, *scalars):
    return [q.to(device).requires_grad_(), k.to(device).requires_grad_()] + [
        torch.tensor(v, device=device, requires_grad=True) for v in scalars]


def bounds(dtype, s):
    delta = 2.0**-10 * s if dtype == torch.float32 else 0.0
    return 2.02 * delta + 1e-5, (4 * delta + 2.0**-9 if dtype == torch.float32 else 3 * 2.0**-8)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", ["clip", "infonce", "sigmoid"])
@pytest.mark.parametrize("b,c,d", [(1, 1, 1), (97, 131, 64), (600, 600, 130)])
@pytest.mark.parametrize("side_stream", [False, True])
def test_cuda_results_match_the_cpu_on_the_current_stream(dtype, kind, b, c, d, side_stream):
    if kind == "clip":
        c = b
    q, k = unit_rows(b, b, d, dtype), unit_rows(1000 + c, c, d, dtype)
    labels = torch.arange(b) % c
    out = {}
    for device in ("cpu", "cuda"):
        q_, k_, s_, t_ = leaves(q, k, device, 10.0, -10.0)
        stream = torch.cuda.Stream() if device == "cuda" and side_stream else None
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            if kind == "clip":
                loss = fmt.clip_loss(q_, k_, s_)
            elif kind == "infonce":
                loss = fmt.infonce_loss(q_, k_, s_, labels.to(device))
            else:
                loss = fmt.sigmoid_loss(q_, k_, s_, t_)
            loss.backward()
        if stream is not None:
            torch.cuda.current_stream().wait_stream(stream)
        assert loss.device.type == device and q_.grad.device.type == device and q_.grad.dtype == dtype
        out[device] = [loss.detach().cpu(), q_.grad.cpu(), k_.grad.cpu(), s_.grad.cpu()]
    loss_bound, grad_fraction = bounds(dtype, 10.0)
    if kind == "sigmoid":
        loss_bound *= c  # a sum over c columns per row
    assert abs(out["cuda"][0].item() - out["cpu"][0].item()) <= loss_bound
    for got, want in zip(out["cuda"][1:3], out["cpu"][1:3]):
        scale = want.float().abs().max().item()
        assert (got.float() - want.float()).abs().max().item() <= grad_fraction * scale + 1e-7


def test_the_builtin_transformer_on_cuda_matches_the_cpu():
    torch.manual_seed(0)
    model = fmt.ReversibleTransformer(64, 4, 3, mode="overlapped")
    x1, x2 = torch.randn(2, 17, 64), torch.randn(2, 17, 64)
    results = {}
    for device in ("cpu", "cuda"):
        m = model.to(device)
        a, b = x1.to(device).requires_grad_(), x2.to(device).requires_grad_()
        for p in m.parameters():
            p.grad = None
        y1, y2 = m(a, b)
        (y1.square().mean() + y2.mean()).backward()
        results[device] = [y1.detach().cpu(), a.grad.cpu()] + [p.grad.cpu() for p in m.parameters()]
    for got, want in zip(results["cuda"], results["cpu"]):
        scale = want.abs().max().item()
        assert (got - want).abs().max().item() <= 1e-4 * scale + 1e-7


def test_a_compiled_cuda_model():
    model = torch.nn.Linear(32, 16).cuda()
    step = torch.compile(lambda x, y: fmt.clip_loss(torch.nn.functional.normalize(model(x), dim=-1),
                                                    torch.nn.functional.normalize(model(y), dim=-1), 10.0),
                         fullgraph=True)
    x, y = torch.randn(50, 32, device="cuda"), torch.randn(50, 32, device="cuda")
    loss = step(x, y)
    loss.backward()
    assert loss.device.type == "cuda" and model.weight.grad is not None


@pytest.fixture(scope="module")
def device_ring():
    """A one-rank communicator with its NCCL transport on the current GPU: the ring on CUDA
    tensors, whose one-rank result is the single-device loss bit for bit (flatmem.h)."""
    import flatmem
    comm = flatmem.Communicator.create_local(1)[0]
    comm.init_device(torch.cuda.current_device())
    yield comm
    comm.close()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", ["clip", "infonce", "sigmoid"])
def test_cuda_ring_of_one_rank_is_the_single_device_loss_bitwise(device_ring, dtype, kind):
    b, c, d = 97, (97 if kind == "clip" else 131), 64
    q, k = unit_rows(7, b, d, dtype), unit_rows(8, c, d, dtype)
    labels = (torch.arange(b) * 5 % c).cuda()
    out = []
    for comm in (None, device_ring):
        x = leaves(q, k, "cuda", 10.0, -5.0)
        if kind == "clip":
            loss = fmt.clip_loss(x[0], x[1], x[2], comm=comm)
        elif kind == "infonce":
            loss = fmt.infonce_loss(x[0], x[1], x[2], labels, comm=comm)
        else:
            loss = fmt.sigmoid_loss(x[0], x[1], x[2], x[3], labels, comm=comm)
        loss.backward()
        out.append([loss.detach()] + [t.grad for t in x[:3]])
    for single, ring in zip(*out):
        assert torch.equal(single, ring)
