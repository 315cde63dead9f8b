"""The losses of flatmem.torch written in plain torch, float64, materialised (every b x c logit), and
differentiated by torch's autograd: the independent reference the torch tests compare with. The
error bounds are the Python binding's (python_reference.py, python_sigmoid_reference.py): they
bound flatmem's arithmetic, whoever computes the exact value."""
import numpy as np
import torch

F64 = torch.float64


def widened(x):
    """The values flatmem computes with (16-bit inputs widen exactly), as float64 NumPy."""
    return x.detach().to(torch.float32).to(F64).cpu().numpy()


def _leaves(q, k, *scalars):
    out = [torch.as_tensor(widened(q)).requires_grad_(), torch.as_tensor(widened(k)).requires_grad_()]
    out += [torch.tensor(float(v), dtype=F64, requires_grad=True) for v in scalars]
    return out


def _grads(loss, leaves, g):
    (g * loss).backward()
    return [leaf.grad.numpy() if leaf.grad.dim() else float(leaf.grad) for leaf in leaves]


def clip(q, k, s, g=1.0):
    """(loss, dq, dk, ds) of the symmetric CLIP loss, the gradients those of g * L."""
    q64, k64, s64 = _leaves(q, k, s)
    x = s64 * q64 @ k64.T
    diag = torch.diagonal(x)
    loss = 0.5 * ((torch.logsumexp(x, 1) - diag).mean() + (torch.logsumexp(x, 0) - diag).mean())
    return (loss.item(), *_grads(loss, [q64, k64, s64], g))


def infonce(q, k, s, labels=None, g=1.0):
    """(loss, dq, dk, ds) of InfoNCE rows -> columns (labels None: y_i = i)."""
    q64, k64, s64 = _leaves(q, k, s)
    b = q64.shape[0]
    y = torch.arange(b) if labels is None else torch.as_tensor(np.asarray(labels))
    x = s64 * q64 @ k64.T
    loss = (torch.logsumexp(x, 1) - x[torch.arange(b), y]).mean()
    return (loss.item(), *_grads(loss, [q64, k64, s64], g))


def sigmoid(q, k, s, t, labels=None, g=1.0):
    """(loss, dq, dk, ds, dt) of the sigmoid loss -(1/b) sum_ij log sigmoid(z_ij x_ij)."""
    q64, k64, s64, t64 = _leaves(q, k, s, t)
    b, c = q64.shape[0], k64.shape[0]
    y = torch.arange(b) if labels is None else torch.as_tensor(np.asarray(labels))
    z = -torch.ones(b, c, dtype=F64)
    z[torch.arange(b), y] = 1.0
    x = s64 * q64 @ k64.T + t64
    loss = -torch.nn.functional.logsigmoid(z * x).sum() / b
    return (loss.item(), *_grads(loss, [q64, k64, s64, t64], g))
