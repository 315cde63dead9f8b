"""What the cyclic wrappers (flatmem.torch.cyclic) share: a model's stages, a stage's parameters as
one flat vector, the optimizers, and the measured activation bytes.

* ``split_sequential(model, stages)`` cuts an nn.Sequential into L contiguous nn.Sequentials with
  parameter counts as even as the layer boundaries allow.
* ``FlatStage``: the parameters of one stage module that require gradients, in registration order,
  laid end to end (the vector flatmem reduces, shards and relays): offsets, views of a flat vector
  as a {name: tensor} dict for ``torch.func.functional_call``, and the flat gradient.
* ``StageOptimizers``: one optimizer per stage, or one over every parameter stepped once per stage
  update with only that stage's gradients set (torch's optimizers skip parameters whose .grad is
  None, so a per-parameter optimizer -- SGD, Adam, AdamW, ... -- steps as it would per stage).
* ``SavedBytes``: the bytes autograd keeps for the backward of each stage in flight, measured by
  ``torch.autograd.graph.saved_tensors_hooks`` (distinct storages, parameters excluded).
* ``CyclicRunner``: the state both wrappers keep around their runtime handle (failed / done /
  closed, the meter and its trace, the CUDA stream) and the queries they pass through.
"""
from __future__ import annotations

import torch
from torch import nn


def split_sequential(model: nn.Sequential, stages: int) -> list[nn.Sequential]:
    """`model`'s layers in `stages` contiguous nn.Sequentials (sharing the layers, not copies) whose
    largest parameter count is as small as the layer boundaries allow. A layer without parameters
    (an activation) stays with the layer before it, so every stage has parameters. ValueError when
    the model has fewer layers with parameters than `stages`."""
    if not isinstance(model, nn.Sequential):
        raise TypeError(f"split_sequential: model must be an nn.Sequential, not {type(model).__name__}")
    layers = list(model)
    counts = [sum(p.numel() for p in layer.parameters() if p.requires_grad) for layer in layers]
    groups = []  # [first layer, end layer, parameters]: a layer with parameters and the ones after it without
    for i, c in enumerate(counts):
        if c > 0 or not groups:
            groups.append([i, i + 1, c])
        else:
            groups[-1][1], groups[-1][2] = i + 1, groups[-1][2] + c
    if groups and groups[0][2] == 0 and len(groups) > 1:  # leading layers without parameters join the next
        first = groups.pop(0)
        groups[0][0] = first[0]
    if not 1 <= stages <= sum(1 for g in groups if g[2] > 0):
        raise ValueError(f"split_sequential: stages: {stages}; expected 1 .. "
                         f"{sum(1 for g in groups if g[2] > 0)} (the model's layers with parameters)")
    # best[k][i]: the smallest largest stage cutting groups[:i] into k stages; linear partition
    G = len(groups)
    prefix = [0]
    for g in groups:
        prefix.append(prefix[-1] + g[2])
    inf = float("inf")
    best = [[inf] * (G + 1) for _ in range(stages + 1)]
    cut = [[0] * (G + 1) for _ in range(stages + 1)]
    best[0][0] = 0
    for k in range(1, stages + 1):
        for i in range(k, G + 1):
            for m in range(k - 1, i):
                cost = max(best[k - 1][m], prefix[i] - prefix[m])
                if cost < best[k][i]:
                    best[k][i], cut[k][i] = cost, m
    bounds, i = [G], G
    for k in range(stages, 0, -1):
        i = cut[k][i]
        bounds.append(i)
    bounds.reverse()
    return [nn.Sequential(*layers[groups[a][0]:groups[b - 1][1]]) for a, b in zip(bounds, bounds[1:])]


class FlatStage:
    """The trainable parameters of `module` as one flat vector of `numel` elements."""

    def __init__(self, module: nn.Module, name: str):
        if not isinstance(module, nn.Module):
            raise TypeError(f"{name}: must be an nn.Module, not {type(module).__name__}")
        self.module = module
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        self.names = [n for n, _ in named]
        self.params = [p for _, p in named]
        self.shapes = [p.shape for p in self.params]
        self.sizes = [p.numel() for p in self.params]
        self.numel = sum(self.sizes)
        if not self.params:
            raise ValueError(f"{name}: has no parameter that requires gradients")
        dtypes = {p.dtype for p in self.params}
        devices = {p.device for p in self.params}
        if len(dtypes) != 1 or len(devices) != 1:
            raise TypeError(f"{name}: parameters of one dtype on one device expected, got {sorted(map(str, dtypes))} "
                            f"on {sorted(map(str, devices))}")
        self.dtype, self.device = dtypes.pop(), devices.pop()
        if self.dtype not in (torch.float32, torch.float64):
            raise TypeError(f"{name}: parameters are {self.dtype}; flatmem reduces float32 or float64 gradients")

    def flat(self) -> torch.Tensor:
        """The parameters' values end to end (a new tensor)."""
        return torch.cat([p.detach().reshape(-1) for p in self.params])

    def views(self, flat: torch.Tensor) -> dict:
        """{name: the parameter's shape viewed in `flat`} for torch.func.functional_call."""
        out, at = {}, 0
        for n, shape, size in zip(self.names, self.shapes, self.sizes):
            out[n] = flat[at:at + size].view(shape)
            at += size
        return out

    def flat_grad(self, tensors=None) -> torch.Tensor:
        """The .grad of `tensors` (default: the module's parameters) end to end, zeros where a
        parameter got none (a new contiguous tensor)."""
        tensors = self.params if tensors is None else tensors
        return torch.cat([(t.grad if t.grad is not None else torch.zeros_like(t)).reshape(-1) for t in tensors])

    def set_grads(self, tensors, flat: torch.Tensor):
        """tensors[i].grad = its slice of `flat` (views, no copy)."""
        at = 0
        for t, shape, size in zip(tensors, self.shapes, self.sizes):
            t.grad = flat[at:at + size].view(shape)
            at += size


class StageOptimizers:
    """`optimizer` as the wrappers take it: a torch.optim.Optimizer over the parameters of every
    stage, a list with one per stage, or a callable that makes one from a list of parameters
    (called once per stage with that stage's parameters)."""

    def __init__(self, optimizer, per_stage_params):
        L = len(per_stage_params)
        if isinstance(optimizer, torch.optim.Optimizer):
            owned = {id(p) for g in optimizer.param_groups for p in g["params"]}
            for j, params in enumerate(per_stage_params):
                missing = [i for i, p in enumerate(params) if id(p) not in owned]
                if missing:
                    raise ValueError(f"optimizer: does not hold parameter {missing[0]} of stage {j}; give it every "
                                     "stage's parameters, one optimizer per stage, or a factory")
            self._all = [optimizer] * L
        elif isinstance(optimizer, (list, tuple)):
            if len(optimizer) != L or not all(isinstance(o, torch.optim.Optimizer) for o in optimizer):
                raise ValueError(f"optimizer: a list of {L} torch.optim.Optimizers expected (one per stage)")
            self._all = list(optimizer)
        elif callable(optimizer):
            self._all = [optimizer(list(params)) for params in per_stage_params]
        else:
            raise TypeError("optimizer: a torch.optim.Optimizer, a list of one per stage, or a callable "
                            f"params -> Optimizer expected, not {type(optimizer).__name__}")
        self._params = per_stage_params

    def step(self, stage: int):
        """One optimizer step of `stage`, whose parameters' .grad the caller set; the .grad of every
        other stage is None meanwhile (so a shared optimizer leaves them alone), and afterwards
        of this one too."""
        try:
            self._all[stage].step()
        finally:
            for p in self._params[stage]:
                p.grad = None

    def __getitem__(self, stage: int):
        return self._all[stage]


class SavedBytes:
    """Bytes of the tensors autograd saves for backward, per stage in flight: enter ``record(key)``
    around a stage's forward, ``release(key)`` once its backward ran. A storage is counted once
    however many stages keep it (a boundary activation is one stage's output and the next one's
    input); those in `exclude` (parameters) are not activations. ``held`` is what is kept now,
    ``peak`` the most ever."""

    def __init__(self):
        self._keys: dict = {}  # key -> {storage pointer}
        self._storages: dict = {}  # storage pointer -> [bytes, keys holding it]
        self.held = 0
        self.peak = 0
        self.exclude: set[int] = set()

    def _count(self, key, t: torch.Tensor):
        s = t.untyped_storage()
        ptr = s.data_ptr()
        mine = self._keys.setdefault(key, set())
        if ptr in self.exclude or ptr in mine:
            return
        mine.add(ptr)
        entry = self._storages.get(ptr)
        if entry is None:
            self._storages[ptr] = [s.nbytes(), 1]
            self.held += s.nbytes()
            self.peak = max(self.peak, self.held)
        else:
            entry[1] += 1

    def record(self, key, stand_in=None):
        """The saved-tensor hooks of a stage's forward. `stand_in` (the relayed parameters) may
        replace a saved tensor by a marker of its own (stand_in.pack(t) not None; such tensors are
        parameters, not counted) that stand_in.unpack(marker) turns back into a tensor in backward."""

        def pack(t):
            if stand_in is not None:
                marker = stand_in.pack(t)
                if marker is not None:
                    return marker
            self._count(key, t)
            return t

        def unpack(x):
            return stand_in.unpack(x) if stand_in is not None and not isinstance(x, torch.Tensor) else x

        return torch.autograd.graph.saved_tensors_hooks(pack, unpack)

    def add(self, key, tensor: torch.Tensor):
        """Count a tensor kept outside autograd (a boundary activation) under `key`."""
        self._count(key, tensor)

    def release(self, key):
        for ptr in self._keys.pop(key, ()):
            entry = self._storages[ptr]
            entry[1] -= 1
            if entry[1] == 0:
                del self._storages[ptr]
                self.held -= entry[0]


class CyclicRunner:
    """The part of a cyclic wrapper around its flatmem runtime handle `_runtime` (flatmem.Cyclic or
    flatmem.CyclicStages): a failure is kept and raised again by every later call, the meter and
    its per-action trace, the stream device work is handed over on, and the pass-through queries.
    Subclasses call _start(...) in their constructor and drop what they hold in flight in _drop()."""

    def _start(self, runtime, device):
        self._runtime = runtime
        self.device = device
        self.meter = SavedBytes()
        self._trace: list[tuple[int, int]] = []  # (global time step, activation bytes held) per action
        self._done = False
        self._error = None

    def _drop(self):
        """Forget what is in flight (kept graphs, held gradients)."""

    def _stream(self):
        """The cudaStream_t device tensors are handed over on (torch's current stream); None on the CPU."""
        return torch.cuda.current_stream(self.device).cuda_stream if self.device.type == "cuda" else None

    def _traced(self, time_step):
        self._trace.append((time_step, self.meter.held))

    def _guarded(self, run):
        """run(); any exception fails the wrapper for good (kept, raised again by later calls)."""
        try:
            return run()
        except BaseException as e:
            if self._error is None:
                self._error = e
            self._drop()
            raise

    def _check_usable(self):
        name = type(self).__name__
        if self._error is not None:
            raise RuntimeError(f"{name} failed earlier: {type(self._error).__name__}: {self._error}") from self._error
        if self._runtime.closed:
            raise RuntimeError(f"{name}: closed")
        if self._done:
            raise RuntimeError(f"{name}: finish() ran; the schedule is done")

    @property
    def schedule(self):
        """The runtime's schedule (flatmem.CyclicSchedule / CyclicStagesSchedule)."""
        return self._runtime.schedule

    @property
    def activation_peak_bytes(self):
        """The most activation bytes this rank held at once (measured)."""
        return self.meter.peak

    def activation_trace(self):
        """[(global time step, activation bytes held after each action)] for this rank."""
        return list(self._trace)

    def summary(self):
        """The runtime's totals since creation (bytes and messages sent, the busiest time step, waits)."""
        return self._runtime.summary()

    def stats(self, first=0, count=None):
        """The runtime's per-time-step statistics still kept (bytes sent, waits), from time step `first` on."""
        return self._runtime.stats(first, count)

    def close(self):
        """Release the runtime (before the schedule ends this poisons the communicator: the peers fail
        naming this rank)."""
        self._drop()
        self._runtime.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
