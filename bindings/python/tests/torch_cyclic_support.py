"""What the flatmem.torch cyclic tests share: a small MLP as an nn.Sequential, the data of every
(step, micro-batch), the ranks of a world as threads of this process over an in-process
communicator group (flatmem.Communicator.create_local), and the reference: one torch process
training the whole model on the concatenated batch, step s using parameter version
max(0, s - delay) (version v: the parameters after the updates of steps 0 .. v-1), in float64
where asked (the independent reference) or in the model's dtype."""
from __future__ import annotations

import threading

import torch
from torch import nn

import flatmem
import flatmem.torch as fmt

WIDTH_IN, WIDTH_OUT = 6, 4


def mlp(seed, hidden=(16, 16), dtype=torch.float32):
    """Linear -> Tanh -> ... -> Linear, made from `seed` (the same weights every time)."""
    g = torch.Generator().manual_seed(seed)
    widths = [WIDTH_IN, *hidden, WIDTH_OUT]
    layers = []
    for i, (a, b) in enumerate(zip(widths, widths[1:])):
        lin = nn.Linear(a, b, dtype=dtype)
        with torch.no_grad():
            lin.weight.copy_(torch.randn(b, a, generator=g, dtype=dtype) / a**0.5)
            lin.bias.copy_(torch.randn(b, generator=g, dtype=dtype) * 0.1)
        layers.append(lin)
        if i + 2 < len(widths):
            layers.append(nn.Tanh())
    return nn.Sequential(*layers)


def data(step, micro_batch, rows=5, dtype=torch.float32):
    """(inputs, target) of one micro-batch."""
    g = torch.Generator().manual_seed(1000 * step + micro_batch)
    return (torch.randn(rows, WIDTH_IN, generator=g, dtype=torch.float64).to(dtype),
            torch.randn(rows, WIDTH_OUT, generator=g, dtype=torch.float64).to(dtype))


def loss_fn(y, target):
    return nn.functional.mse_loss(y, target)


def in_threads(world, body):
    """body(rank) on `world` threads; returns the results; re-raises the first exception."""
    out, errors = [None] * world, [None] * world

    def run(r):
        try:
            out[r] = body(r)
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            errors[r] = e

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
        assert not t.is_alive(), "a rank thread did not finish within 300 s"
    return out, errors


def sgd(lr):
    return lambda params: torch.optim.SGD(params, lr=lr)


def adam(lr):
    return lambda params: torch.optim.Adam(params, lr=lr)


def train_data_parallel(world, stages, steps, rule, make_optimizer, *, parameters="replicated", model=mlp,
                        hidden=(16, 16), dtype=torch.float32, rows=5, shared_optimizer=False):
    """CyclicDataParallel on `world` ranks (rank r trains on micro-batch r of every step). Per rank:
    {"losses": [...], "flat": [stage's flat parameters] (replicated) or "shards": {...},
    "trace": activation_trace(), "peak": activation_peak_bytes, "summary": summary()}."""
    comms = flatmem.Communicator.create_local(world)
    models = [model(0, hidden, dtype) for _ in range(world)]  # made here: torch's RNG is global

    def rank(r):
        split = fmt.split_sequential(models[r], stages)
        optimizer = make_optimizer(list(models[r].parameters())) if shared_optimizer else make_optimizer
        with fmt.CyclicDataParallel(split, optimizer, loss_fn, comms[r], steps=steps, rule=rule,
                                    parameters=parameters) as cdp:
            losses = [cdp.step(*data(s, r, rows, dtype)) for s in range(steps)]
            cdp.finish()
            result = {"losses": losses, "trace": cdp.activation_trace(), "peak": cdp.activation_peak_bytes,
                      "summary": cdp.summary()}
            if parameters == "relayed":
                result["shards"] = cdp.shards()
                result["relay"] = cdp.relay_summary()
            else:
                result["flat"] = [cdp.flat_parameters(j) for j in range(stages)]
        return result

    out, errors = in_threads(world, rank)
    for e in errors:
        if e is not None:
            raise e
    return out


def train_stage_parallel(micro_batches, stages, steps, rule, make_optimizer, *, hidden=(16, 16),
                         dtype=torch.float32, rows=5):
    """CyclicStageParallel on `stages` ranks over the same micro-batches. Per stage: {"losses":
    [{micro-batch: loss}] per step (last stage), "flat": the stage's flat parameters, "trace"}."""
    comms = flatmem.Communicator.create_local(stages)
    models = [mlp(0, hidden, dtype) for _ in range(stages)]

    def rank(j):
        split = fmt.split_sequential(models[j], stages)
        shapes = [(rows, _boundary_width(split, b)) for b in range(stages - 1)]
        with fmt.CyclicStageParallel(split[j], make_optimizer, loss_fn, comms[j], micro_batches=micro_batches,
                                     steps=steps, rule=rule, boundary_shapes=shapes) as sp:
            losses = [sp.step([data(s, m, rows, dtype) for m in range(micro_batches)]) for s in range(steps)]
            sp.finish()
            return {"losses": losses, "flat": sp.flat.flat(), "trace": sp.activation_trace(),
                    "peak": sp.activation_peak_bytes}

    out, errors = in_threads(stages, rank)
    for e in errors:
        if e is not None:
            raise e
    return out


def _boundary_width(split, boundary):
    """The output width of stage `boundary` (its last Linear's out_features)."""
    return [m for m in split[boundary] if isinstance(m, nn.Linear)][-1].out_features


def reference(world, steps, delay, make_optimizer, *, hidden=(16, 16), dtype=torch.float32, rows=5):
    """One process, the whole model, the concatenated batch of `world` micro-batches (the mean
    loss over all rows = the mean of the micro-batch losses: equal sizes), step s with version
    max(0, s - delay). Returns (losses per step (the mean of the micro-batch losses), the final
    flat parameters)."""
    from torch.nn.utils import parameters_to_vector, vector_to_parameters

    m = mlp(0, hidden, dtype)
    params = list(m.parameters())
    opt = make_optimizer(params)
    versions = [parameters_to_vector(params).detach().clone()]
    losses = []
    for s in range(steps):
        current = parameters_to_vector(params).detach().clone()
        vector_to_parameters(versions[max(0, s - delay)], params)
        batches = [data(s, r, rows, dtype) for r in range(world)]
        x = torch.cat([b[0] for b in batches])
        t = torch.cat([b[1] for b in batches])
        for p in params:
            p.grad = None
        loss = loss_fn(m(x), t)
        loss.backward()
        losses.append(float(loss.detach()))
        grads = [p.grad.clone() for p in params]
        vector_to_parameters(current, params)  # the optimizer steps the newest version
        for p, g in zip(params, grads):
            p.grad = g
        opt.step()
        versions.append(parameters_to_vector(params).detach().clone())
    return losses, versions[-1]
