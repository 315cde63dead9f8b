#!/usr/bin/env python3
"""torch_cdp_bench -- cyclic data parallelism (flatmem.torch) against PyTorch's DDP and FSDP on one
transformer, N = 4 processes under torchrun, measured in one run.

What is compared: N = 4 ranks (torchrun, gloo process group, CPU, OMP_NUM_THREADS=1 and
torch.set_num_threads(1) per rank) train the same pre-LN transformer (an nn.Sequential: token +
position embedding, 4 blocks of causal self-attention (F.scaled_dot_product_attention) and a 4x MLP,
final LayerNorm and vocabulary head; width 128, 4 heads, vocabulary 256, 64 tokens, 8 sequences per
rank, float32, no dropout), cut into L = 4 stages by flatmem.torch.split_sequential (by parameter
count: [embedding + block 0], [block 1], [block 2], [block 3 + head]), with AdamW (lr 3e-3, weight
decay 0.01), next-token cross-entropy, for --steps steps (default 24). Every configuration starts
from the same weights (torch.manual_seed before the model is built, on every rank) and sees the
same data: rank r of step s (micro-batch r of step s for stage-parallel) gets sequences drawn from a
fixed random Markov chain over the vocabulary with a generator seeded by (s, r). One torchrun launch
per configuration, so no state leaks between them:

  DDP               torch DistributedDataParallel over the whole model (default buckets: 25 MiB,
                    the first 1 MiB), allreduce_hook (average), loss.backward()
  FSDP              torch.distributed.fsdp.fully_shard per stage and on the root, CPU device mesh
                    over gloo (reshard after forward); where PyTorch refuses, the table says so with
                    its error instead of numbers
  CDP sync          flatmem.torch.CyclicDataParallel(rule="sync", parameters="replicated"): no
                    stagger, point-to-point reduce chains (plain data parallelism)
  CDP replicated    CyclicDataParallel(rule="delay1", parameters="replicated")
  CDP relayed       CyclicDataParallel(rule="delay1", parameters="relayed") (ZeRO relay)
  stage-parallel    flatmem.torch.CyclicStageParallel(rule="delay1"): L = 4 ranks, one stage each,
                    N = 4 micro-batches per step -- the same global batch (4 x 8 sequences) and the
                    same number of processes as the 4 data-parallel ranks: equal work per step

Per configuration (rank 0 gathers every rank's measurements and writes JSON; this script, the
launcher, prints the table with ratios to DDP measured in the same run and writes the CSVs):

- Activation memory, measured, the same way everywhere: flatmem.torch's SavedBytes meter (the
  distinct storages autograd saves for backward, parameters excluded, plus each stage's output kept
  for the next stage), keyed per stage. CDP / stage-parallel: the wrappers' own meter
  (activation_trace(): bytes held after each action, per global time step). DDP / FSDP: run as users
  run them -- one forward of the whole model, loss.backward() -- with the meter entered around each
  stage's forward by forward pre/post hooks (the loss under the last stage's key, each stage's output
  added to its key as cyclic.py does), and a stage released when its backward is over (a gradient
  hook on the stage's output tensor fires once the next stage's backward is done; stage 0 at the end
  of loss.backward()); FSDP's unsharded parameters, which autograd saves too, are excluded as
  parameters. Time steps are the schedule's: a step is 2L phases, forward of stage j is phase j,
  backward of stage j phase 2L-1-j, global time step = 2L s + phase (DDP / FSDP ranks run in
  lockstep). Per rank: the peak. Summed over ranks: per global time step the sum over ranks of what
  each holds then, and the maximum over time steps (a rank without an action in a time step holds what
  it held after its last one), in two readings of "holds in a time step": "during" -- the most a rank
  held at any moment of it, max(held before it, held after each of its actions): a backward releases
  its stage only once it is over, so that stage counts in its time step, as the schedule counts it
  (the paper's (N+1)/(2N) = 0.625 at N = 4, L = 4 for stages of equal size) -- and "after actions"
  (held once the time step's actions are done: the schedule gives 0.5 at N = L = 4 with equal stages).
  The target is checked on "during". Stage-parallel: the sum over its L stage ranks likewise (several
  actions may share a time step there; "during" takes the most after any of them); a boundary
  activation is counted on both ranks that hold it (the sender keeps its output, the receiver its
  copy). The parameter versions a stage rank keeps are excluded by its meter, as CyclicDataParallel's
  parameters are by its own.
- Parameter memory per rank (parameters only; gradients and optimizer state are not counted):
  DDP, CDP sync / replicated: every parameter. FSDP: this rank's shards plus the most unsharded
  parameter bytes (FSDP's all-gather outputs still allocated) seen at the stage hooks. CDP relayed:
  relay_summary().peak_parameter_bytes (the library's measured shards + staging buffers) plus the
  largest stage (the full copy the torch side holds during a forward or backward). Stage-parallel:
  its stage's parameters plus the older versions it keeps for delay1 (measured, the most at once).
- Bytes sent per time step, per global time step summed over ranks, max / mean over the steady window:
  from the second step of the last rank to start (DDP rebuilds its buckets after step 0, whose single
  bucket would otherwise be the maximum) to the last backward of the first rank to finish.
  CDP: stats() bytes_scheduled (the protocol's assignment to time steps) and bytes_sent (as posted by
  the runtime's threads, headers included); relayed adds relay_stats() relay_bytes_sent (full stages
  passed on). Stage-parallel: stats() bytes_sent (boundary activations and their gradients).
  DDP: a comm hook (register_comm_hook wrapping default_hooks.allreduce_hook) records each bucket's
  bytes in the phase it fires in, converted to bytes sent per rank by the ring all-reduce formula
  2(N-1)/N x bucket bytes (this model's 3.3 MiB: two buckets after step 0, 1.1 MiB during the
  backward of stage 2 and 2.2 MiB during that of stage 0, so DDP's ratio is 8 x 2.2 / 3.3). FSDP:
  the all-gathers and reduce-scatters it issues (torch.distributed.all_gather_single /
  reduce_scatter_single wrapped) in the phase they are issued, (N-1)/N x the gathered / scattered
  bytes per rank (ring). All bytes in one phase give 2L = 8.
- Step throughput: per rank, the time between the ends of consecutive step() calls (DDP / FSDP:
  forward + backward + optimizer step), median over the steps after --warmup (default 4); the slowest
  rank's median; steps/s = 1 / that, and its ratio to DDP's.
- Loss curve: the mean over the ranks of each step's loss (stage-parallel: over the step's N
  micro-batches); bench/torch_cdp_losses.csv.

Targets (the CDP paper's claims, against real DDP), printed MET / MISSED: summed peak activations
<= 0.65x DDP's at N = 4 (the schedule's (N+1)/(2N) = 0.625); bytes per time step max/mean <= 1.2
(DDP's all-reduce is one or two bursts a step); relayed parameter memory per rank <= DDP's / N plus
one (the largest) stage; throughput within 10 % of DDP's (>= 0.9x).

    PYTHONPATH=... build/wheel-venv/bin/python bench/torch_cdp_bench.py            # the full run
    PYTHONPATH=... build/wheel-venv/bin/python bench/torch_cdp_bench.py --quick    # smoke: 6 steps, small

Writes bench/torch_cdp_bench.csv (one row per configuration), bench/torch_cdp_losses.csv (loss per
step), bench/torch_cdp_timeline.csv (summed activation bytes and bytes sent per global time step) and
bench/torch_cdp.png (loss curves and summed activations against time step) when matplotlib is
importable here or by /usr/bin/python3 (the plot needs only the CSVs: --plot redraws it); --quick
writes into the temporary directory. The full run takes about 2.5 minutes on this machine (2 cores,
4 ranks: 2x oversubscribed, so throughput ratios carry the scheduler's noise).

Needs torch (with torch.distributed, gloo), numpy and flatmem with flatmem.torch.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch_bench_support as sup  # noqa: E402  (stdlib only at import)
from torch_bench_support import div, ratio, seconds, size, verdict  # noqa: E402

CONFIGS = {
    "ddp": "DDP",
    "fsdp": "FSDP (fully_shard)",
    "cdp-sync": "CDP sync",
    "cdp-replicated": "CDP replicated",
    "cdp-relayed": "CDP relayed",
    "stage-parallel": "stage-parallel",
}
TARGET_ACT = 0.65
TARGET_BURST = 1.2
TARGET_SPEED = 0.9


# ---------------------------------------------------------------------------
# Worker: one rank of one configuration
# ---------------------------------------------------------------------------


def build_model(o):
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Embed(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(o.vocab, o.width)
            self.pos = nn.Parameter(0.02 * torch.randn(o.seq, o.width))

        def forward(self, ids):
            return self.tok(ids) + self.pos

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(o.width), nn.LayerNorm(o.width)
            self.qkv, self.proj = nn.Linear(o.width, 3 * o.width), nn.Linear(o.width, o.width)
            self.fc, self.out = nn.Linear(o.width, 4 * o.width), nn.Linear(4 * o.width, o.width)

        def forward(self, x):
            b, t, w = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, o.heads, w // o.heads).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(b, t, w))
            return x + self.out(F.gelu(self.fc(self.ln2(x))))

    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln, self.lin = nn.LayerNorm(o.width), nn.Linear(o.width, o.vocab)

        def forward(self, x):
            return self.lin(self.ln(x))

    torch.manual_seed(o.seed)
    return nn.Sequential(Embed(), *[Block() for _ in range(o.depth)], Head())


def loss_fn(out, target):
    import torch.nn.functional as F

    return F.cross_entropy(out.reshape(-1, out.shape[-1]), target.reshape(-1))


class Data:
    """Sequences of a fixed random Markov chain (each token has 4 likely successors), per (step, rank)."""

    def __init__(self, o):
        import torch

        g = torch.Generator().manual_seed(o.seed + 1000)
        logits = torch.randn(o.vocab, o.vocab, generator=g)
        top = torch.randint(0, o.vocab, (o.vocab, 4), generator=g)
        logits.scatter_add_(1, top, torch.full((o.vocab, 4), 4.0))
        self.p = torch.softmax(logits, 1)
        self.o = o

    def batch(self, step, rank):
        import torch

        o = self.o
        g = torch.Generator().manual_seed(o.seed * 1000003 + step * 4099 + rank)
        seq = torch.empty(o.batch, o.seq + 1, dtype=torch.long)
        seq[:, 0] = torch.randint(0, o.vocab, (o.batch,), generator=g)
        for t in range(o.seq):
            seq[:, t + 1] = torch.multinomial(self.p[seq[:, t]], 1, generator=g)[:, 0]
        return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


def param_bytes(module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


class Phases:
    """DDP / FSDP: the meter around each stage's forward (hooks), stage releases as the backward
    passes, the trace per phase, and the bytes each phase sends."""

    def __init__(self, stages, L, meter):
        self.L, self.meter, self.stages = L, meter, stages
        self.step = 0
        self.phase = 0
        self.trace = []  # (global time step, held)
        self.sent = {}  # global time step -> bytes this rank sends
        self.ctx = None
        self.param_ptrs = None  # callable: stage -> storages to exclude (FSDP's unsharded params)
        self.probe = None  # callable: called at every hook (FSDP's unsharded bytes)
        for j, st in enumerate(stages):
            st.register_forward_pre_hook(self._pre(j))
            st.register_forward_hook(self._post(j))

    def t(self):
        return 2 * self.L * self.step + self.phase

    def add_bytes(self, n):
        self.sent[self.t()] = self.sent.get(self.t(), 0) + n

    def _pre(self, j):
        def hook(module, args):
            if self.param_ptrs is not None:
                self.meter.exclude = self.param_ptrs(j)
            if self.probe:
                self.probe()
            self.ctx = self.meter.record(j)
            self.ctx.__enter__()
        return hook

    def _post(self, j):
        def hook(module, args, out):
            self.ctx.__exit__(None, None, None)
            self.ctx = None
            if self.probe:
                self.probe()
            if j < self.L - 1:
                self.meter.add(j, out)
                self.trace.append((self.t(), self.meter.held))
                self.phase = j + 1
                out.register_hook(self._released(j + 1))
        return hook

    def _released(self, j):
        def hook(grad):
            if self.probe:
                self.probe()
            self.meter.release(j)
            self.trace.append((self.t(), self.meter.held))  # the backward of stage j is over
            self.phase += 1
        return hook

    def run_step(self, model, x, y):
        self.phase = 0
        out = model(x)
        with self.meter.record(self.L - 1):  # the loss's saved tensors belong to the last stage
            loss = loss_fn(out, y)
        self.trace.append((self.t(), self.meter.held))
        self.phase = self.L
        loss.backward()
        if self.probe:
            self.probe()
        self.meter.release(0)
        self.trace.append((self.t(), self.meter.held))
        return loss.detach()


def run_torch(o, kind, rank, N, model, stages, data):
    """DDP or FSDP: returns this rank's measurements."""
    import torch
    import torch.distributed as dist
    from flatmem.torch._stages import SavedBytes

    from torch import nn

    L = len(stages)
    meter = SavedBytes()
    model = nn.Sequential(*stages)  # the same layers, run stage by stage (the hooks are on the stages)
    all_params = param_bytes(model)
    out = {"param_bytes": all_params}
    if kind == "ddp":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        from torch.nn.parallel import DistributedDataParallel as DDP

        meter.exclude = {p.untyped_storage().data_ptr() for p in model.parameters()}
        phases = Phases(stages, L, meter)
        net = DDP(model)
        factor = 2.0 * (N - 1) / N
        buckets = []

        def hook(state, bucket):
            n = bucket.buffer().numel() * bucket.buffer().element_size()
            buckets.append((phases.step, phases.phase, bucket.index(), n))
            phases.add_bytes(factor * n)
            return default_hooks.allreduce_hook(None, bucket)

        net.register_comm_hook(None, hook)
        opt = torch.optim.AdamW(net.parameters(), lr=o.lr, weight_decay=0.01)
        out["note"] = ""
    else:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (N,))
        for st in stages:
            fully_shard(st, mesh=mesh)
        fully_shard(model, mesh=mesh)
        net = model
        phases = Phases(stages, L, meter)
        states = [st._get_fsdp_state() for st in stages]

        def fsdp_params(j=None):
            for i, s in enumerate(states):
                if j is None or i == j:
                    for g in s._fsdp_param_groups:
                        yield from g.fsdp_params

        def unsharded_ptrs(j):
            ptrs = {p.untyped_storage().data_ptr() for p in stages[j].parameters()}
            for fp in fsdp_params(j):
                for t in fp.all_gather_outputs:
                    ptrs.add(t.untyped_storage().data_ptr())
            return ptrs

        peak_unsharded = [0]

        def probe():
            seen, total = set(), 0
            for fp in fsdp_params():
                for t in fp.all_gather_outputs:
                    s = t.untyped_storage()
                    if s.nbytes() and s.data_ptr() not in seen:
                        seen.add(s.data_ptr())
                        total += s.nbytes()
            peak_unsharded[0] = max(peak_unsharded[0], total)

        phases.param_ptrs = unsharded_ptrs
        phases.probe = probe
        gather_f = (N - 1) / N
        wrapped = {}
        for name, which in (("all_gather_single", "output_tensor"), ("all_gather_into_tensor", "output_tensor"),
                            ("reduce_scatter_single", "input"), ("reduce_scatter_tensor", "input"),
                            ("all_reduce", "tensor")):
            fn = getattr(dist, name, None)
            if fn is None:
                continue

            def make(fn, name, which):
                def call(*args, **kwargs):
                    if phases.counting:
                        t = kwargs.get(which)
                        if t is None:
                            positional = 0 if which in ("output_tensor", "tensor") else 1
                            t = args[positional] if len(args) > positional else None
                        if t is not None:
                            f = 2 * gather_f if name == "all_reduce" else gather_f
                            phases.add_bytes(f * t.numel() * t.element_size())
                            phases.calls[name] = phases.calls.get(name, 0) + 1
                    return fn(*args, **kwargs)
                return call

            wrapped[name] = fn
            setattr(dist, name, make(fn, name, which))
        phases.calls = {}
        opt = torch.optim.AdamW(net.parameters(), lr=o.lr, weight_decay=0.01)
        out["shard_bytes"] = sum(p.to_local().numel() * p.element_size() for p in model.parameters())
    phases.counting = False
    batches = [data.batch(s, rank) for s in range(o.steps)]
    losses, ends = {}, []
    dist.barrier()
    start = time.perf_counter()
    for s in range(o.steps):
        x, y = batches[s]
        phases.step = s
        phases.counting = True
        loss = phases.run_step(net, x, y)
        opt.step()
        opt.zero_grad(set_to_none=True)
        phases.counting = False
        losses[s] = float(loss)
        ends.append(time.perf_counter())
    out.update(losses=losses, start=start, ends=ends, trace=phases.trace, peak=meter.peak,
               sent={t: b for t, b in phases.sent.items()}, scheduled=None,
               first=0, last=2 * L * o.steps - 1)
    if kind == "ddp":
        last = [b for b in buckets if b[0] == o.steps - 1]
        out["note"] = (f"{len(buckets)} buckets in {o.steps} steps; the last step's: "
                       + ", ".join(f"{size(n)} in phase {ph}" for _, ph, _, n in last))
    else:
        out["param_bytes"] = out["shard_bytes"] + peak_unsharded[0]
        out["note"] = (f"shards {size(out['shard_bytes'])} + unsharded peak {size(peak_unsharded[0])}; "
                       f"collectives per step: " + ", ".join(f"{k} {v // o.steps}" for k, v in phases.calls.items()))
        for name, fn in wrapped.items():
            setattr(dist, name, fn)
    return out


def run_cdp(o, kind, rank, N, model, stages, data):
    import torch
    import flatmem.torch as fmt

    comm = fmt.communicator()
    L = len(stages)
    stage_bytes = [param_bytes(s) for s in stages]
    rule = "sync" if kind == "cdp-sync" else "delay1"
    parameters = "relayed" if kind == "cdp-relayed" else "replicated"
    cdp = fmt.CyclicDataParallel(stages, lambda ps: torch.optim.AdamW(ps, lr=o.lr, weight_decay=0.01), loss_fn,
                                 comm, steps=o.steps, rule=rule, parameters=parameters)
    import torch.distributed as dist

    batches = [data.batch(s, rank) for s in range(o.steps)]
    losses, ends = {}, []
    dist.barrier()
    start = time.perf_counter()
    for s in range(o.steps):
        x, y = batches[s]
        losses[s] = float(cdp.step(x, y))
        ends.append(time.perf_counter())
    cdp.finish()
    out = {"losses": losses, "start": start, "ends": ends, "trace": cdp.activation_trace(),
           "peak": cdp.activation_peak_bytes}
    stats = cdp.stats()
    sent, scheduled = {}, {}
    for st in stats:
        sent[st.time_step] = sent.get(st.time_step, 0) + st.bytes_sent
        scheduled[st.time_step] = scheduled.get(st.time_step, 0) + st.bytes_scheduled
    active = [st.time_step for st in stats if st.kind in ("forward", "backward")]
    out.update(first=min(active), last=max(active))
    summ = cdp.summary()
    out["summary"] = summ._asdict()
    if parameters == "relayed":
        for rs in cdp.relay_stats():
            sent[rs.time_step] = sent.get(rs.time_step, 0) + rs.relay_bytes_sent
            scheduled[rs.time_step] = scheduled.get(rs.time_step, 0) + rs.relay_bytes_sent
        r = cdp.relay_summary()
        out["relay"] = r._asdict()
        out["param_bytes"] = r.peak_parameter_bytes + max(stage_bytes)
        out["note"] = (f"relay: shards {size(r.shard_bytes)}, staging {r.staging_buffers} x = {size(r.staging_bytes)}, "
                       f"peak {size(r.peak_parameter_bytes)} + largest stage {size(max(stage_bytes))}")
    else:
        out["param_bytes"] = sum(stage_bytes)
        out["note"] = ""
    out.update(sent=sent, scheduled=scheduled)
    cdp.close()
    comm.close()
    return out


def run_stages(o, rank, N, model, stages, data):
    import torch
    import torch.distributed as dist
    import flatmem.torch as fmt

    comm = fmt.communicator()
    L = len(stages)
    if comm.world_size != L:
        raise SystemExit(f"stage-parallel: {comm.world_size} ranks for {L} stages")
    stage = stages[rank]
    micro = o.ranks  # the data-parallel ranks' batches as micro-batches: the same global batch
    sp = fmt.CyclicStageParallel(stage, lambda ps: torch.optim.AdamW(ps, lr=o.lr, weight_decay=0.01), loss_fn, comm,
                                 micro_batches=micro, steps=o.steps,
                                 boundary_shapes=[(o.batch, o.seq, o.width)] * (L - 1), rule="delay1")
    own = param_bytes(stage)
    versions_peak = 0
    batches = [[data.batch(s, m) for m in range(micro)] for s in range(o.steps)]
    losses, ends = {}, []
    dist.barrier()
    start = time.perf_counter()

    def versions():
        return sum(t.numel() * t.element_size() for v in sp._versions.values() for t in v)

    for s in range(o.steps):
        got = sp.step(batches[s])
        versions_peak = max(versions_peak, versions())
        for s2, d in ([(s, got)] if got else []):
            losses[s2] = [float(v) for _, v in sorted(d.items())]
        ends.append(time.perf_counter())
    for s2, d in sp.finish().items():
        losses[s2] = [float(v) for _, v in sorted(d.items())]
    sent = {}
    for st in sp.stats():
        sent[st.time_step] = sent.get(st.time_step, 0) + st.bytes_sent
    active = [st.time_step for st in sp.stats() if st.actions > 0]
    out = {"losses": losses, "start": start, "ends": ends, "trace": sp.activation_trace(),
           "peak": sp.activation_peak_bytes, "sent": sent, "scheduled": None,
           "first": min(active), "last": max(active), "param_bytes": own + versions_peak,
           "note": f"stage {size(own)} + kept versions {size(versions_peak)}",
           "summary": sp.summary()._asdict()}
    sp.close()
    comm.close()
    return out


def held_per_time_step(trace, end):
    """One rank's activation bytes per global time step 0..end-1, from its trace [(time step, bytes held
    after an action)]: (after, during). after[t]: held after the time step's last action (carried
    forward over time steps without one); during[t]: the most held at any moment of the time step,
    max(after[t-1], every action's value in t) -- a backward releases its stage only when it is over,
    so its stage's activations count in its time step, as the schedule counts them."""
    by_t = {}
    for t, b in trace:
        by_t.setdefault(t, []).append(b)
    after, during, held = [0] * end, [0] * end, 0
    for t in range(end):
        values = by_t.get(t, [])
        during[t] = max([held] + values)
        if values:
            held = values[-1]
        after[t] = held
    return after, during


def aggregate(o, kind, gathered, L):
    N = len(gathered)
    end = max(max(t for t, _ in r["trace"]) for r in gathered) + 1
    per_rank = [held_per_time_step(r["trace"], end) for r in gathered]
    acts_after = [sum(a[t] for a, _ in per_rank) for t in range(end)]
    acts = [sum(d[t] for _, d in per_rank) for t in range(end)]
    # steady window: from the second step of the last rank to start (every rank past its first step:
    # DDP builds its buckets anew after step 0) to the last backward of the first rank to finish
    first = max(r["first"] for r in gathered) + 2 * L
    last = min(r["last"] for r in gathered)
    window = range(first, last + 1)

    def burst(key):
        if any(r.get(key) is None for r in gathered):
            return math.nan, math.nan, math.nan, []
        per_t = [sum(r[key].get(t, 0) for r in gathered) for t in range(end)]
        w = [per_t[t] for t in window]
        mean = statistics.fmean(w) if w else math.nan
        return max(w) if w else math.nan, mean, div(max(w), mean) if w else math.nan, per_t

    bmax, bmean, bratio, sent_t = burst("sent")
    smax, smean, sratio, _ = burst("scheduled")
    # step times: per rank the gaps between consecutive step ends after the warm-up
    medians, totals = [], []
    for r in gathered:
        ends = [r["start"]] + r["ends"]
        gaps = [ends[i + 1] - ends[i] for i in range(len(ends) - 1)]
        medians.append(statistics.median(gaps[o.warmup:]) if len(gaps) > o.warmup else math.nan)
        totals.append(ends[-1] - ends[0])
    if kind == "stage-parallel":
        loss_rank = gathered[L - 1]["losses"]
        curve = [statistics.fmean(loss_rank[s]) if s in loss_rank else math.nan for s in range(o.steps)]
    else:
        curve = [statistics.fmean(r["losses"][s] for r in gathered) for s in range(o.steps)]
    return {
        "ranks": N, "act_peak_rank": max(r["peak"] for r in gathered), "act_peak_sum": max(acts),
        "act_mean_sum": statistics.fmean(acts[t] for t in window) if window else math.nan,
        "act_peak_sum_after": max(acts_after),
        "param_bytes": max(r["param_bytes"] for r in gathered),
        "bytes_max": bmax, "bytes_mean": bmean, "bytes_ratio": bratio,
        "sched_max": smax, "sched_mean": smean, "sched_ratio": sratio,
        "window": f"{first}..{last}", "step_s": max(medians), "steps_per_s": div(1.0, max(medians)),
        "total_s": max(totals), "losses": curve, "final_loss": curve[-1], "acts": acts, "acts_after": acts_after,
        "sent_t": sent_t,
        "note": max(gathered, key=lambda r: r["param_bytes"]).get("note", ""),
        "rank_peaks": [r["peak"] for r in gathered], "rank_params": [r["param_bytes"] for r in gathered],
    }


def worker(o):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(o.threads)
    dist.init_process_group("gloo")
    rank, N = dist.get_rank(), dist.get_world_size()
    from flatmem.torch import split_sequential

    model = build_model(o)
    stages = split_sequential(model, o.stages)
    data = Data(o)
    info = {"torch": torch.__version__, "stage_params": [param_bytes(s) for s in stages],
            "model_params": param_bytes(model), "stage_layers": [len(s) for s in stages]}
    try:
        if o.worker in ("ddp", "fsdp"):
            mine = run_torch(o, o.worker, rank, N, model, stages, data)
        elif o.worker == "stage-parallel":
            mine = run_stages(o, rank, N, model, stages, data)
        else:
            mine = run_cdp(o, o.worker, rank, N, model, stages, data)
        mine["error"] = None
    except Exception as e:  # FSDP refused on CPU / gloo: reported, not a crash
        if o.worker != "fsdp":
            raise
        import traceback

        traceback.print_exc()
        mine = {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
    gathered = [None] * N
    dist.all_gather_object(gathered, mine)
    if rank == 0:
        errors = [r["error"] for r in gathered if r["error"]]
        if errors:
            result = {"status": "unsupported", "note": errors[0], **info}
        else:
            result = {"status": "ok", **info, **aggregate(o, o.worker, gathered, len(stages))}
        with open(o.result, "w") as f:
            json.dump(result, f)
        if result["status"] == "ok":
            print(f"rank 0: {o.worker}: summed peak activations {size(result['act_peak_sum'])}, step "
                  f"{seconds(result['step_s'])}, final loss {result['final_loss']:.4f}", flush=True)
        else:
            print(f"rank 0: {o.worker}: {result['note']}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


# ---------------------------------------------------------------------------
# Launcher
# ---------------------------------------------------------------------------


def launch(o, kind) -> dict:
    args = ["--worker", kind]
    for k in ("steps", "warmup", "stages", "depth", "width", "heads", "vocab", "seq", "batch", "threads", "seed"):
        args += [f"--{k}", str(getattr(o, k))]
    args += ["--lr", repr(o.lr), "--ranks", str(o.ranks)]
    row = sup.torchrun(__file__, o.ranks, args, threads=o.threads, timeout=o.timeout, echo=o.verbose)
    return {"config": kind, "name": CONFIGS[kind], **row}


def progress(row):
    if row["status"] != "ok":
        print(f"  {row['name']:<18} {row['status']}: {row.get('note', '')}", flush=True)
        return
    print(f"  {row['name']:<18} act sum {size(row['act_peak_sum']):>10}  per rank {size(row['act_peak_rank']):>10}  "
          f"params/rank {size(row['param_bytes']):>10}  bytes/time step max/mean {row['bytes_ratio']:.2f}  "
          f"step {seconds(row['step_s'])}  loss {row['losses'][0]:.3f} -> {row['final_loss']:.3f}  "
          f"[{seconds(row['wall_s'])} wall]", flush=True)


def value(r, key) -> float:
    return sup.number(r.get(key)) if r is not None and r["status"] == "ok" else math.nan


def speed_verdict(s: float) -> str:
    return "not measured" if not math.isfinite(s) else "MET" if s >= TARGET_SPEED else "MISSED"


def print_tables(rows, o):
    base = next((r for r in rows if r["config"] == "ddp"), None)
    ok = next((r for r in rows if r["status"] == "ok"), None)
    stage_params = ok["stage_params"] if ok else []
    print(f"\n### {o.ranks} ranks (gloo, CPU, {o.threads} thread each), transformer width {o.width}, depth {o.depth}, "
          f"L = {o.stages} stages ({', '.join(size(b) for b in stage_params)} of parameters), "
          f"{o.batch} x {o.seq} tokens per rank, {o.steps} steps\n")

    def cell(r, key, fmt):
        if r["status"] == "unsupported":
            return "not supported on CPU/gloo" if key == "act_peak_sum" else "-"
        if r["status"] != "ok":
            return "failed"
        return fmt(value(r, key))

    body = []
    for r in rows:
        body.append([r["name"], cell(r, "act_peak_sum", size),
                     ratio(div(value(r, "act_peak_sum"), value(base, "act_peak_sum"))),
                     cell(r, "act_peak_sum_after", size),
                     ratio(div(value(r, "act_peak_sum_after"), value(base, "act_peak_sum_after"))),
                     cell(r, "act_peak_rank", size), cell(r, "param_bytes", size),
                     ratio(div(value(r, "param_bytes"), value(base, "param_bytes"))),
                     cell(r, "bytes_max", size), cell(r, "bytes_mean", size),
                     cell(r, "bytes_ratio", lambda v: f"{v:.2f}"),
                     cell(r, "sched_ratio", lambda v: f"{v:.2f}" if math.isfinite(v) else "-"),
                     cell(r, "steps_per_s", lambda v: f"{v:.2f}"),
                     ratio(div(value(r, "steps_per_s"), value(base, "steps_per_s"))),
                     cell(r, "final_loss", lambda v: f"{v:.4f}")])
    print(sup.table(["configuration", "peak activations summed over ranks (during time steps)", "vs DDP",
                     "(after actions)", "vs DDP", "peak activations per rank",
                     "parameters per rank", "vs DDP", "bytes/time step max", "mean", "max/mean (as sent)",
                     "max/mean (protocol)", "steps/s", "vs DDP", f"loss at step {o.steps - 1}"], body))
    print("\nActivations: SavedBytes (distinct saved storages, parameters excluded), per global time step summed over "
          "ranks, the max; during: the most a rank held within the time step (a backward's stage counted until it is "
          "over); after actions: what it held after them; per rank: the largest peak. Bytes: sent per global time step "
          "summed over ranks, steady window "
          "(DDP: buckets x 2(N-1)/N; FSDP: all-gathers and reduce-scatters x (N-1)/N). Steps/s: 1 / the slowest rank's "
          f"median step after {o.warmup} warm-up steps.")
    for r in rows:
        if r.get("note"):
            print(f"  {r['name']}: {r['note']}")
    print("\nloss curves (mean over ranks / micro-batches per step):")
    for r in rows:
        if r["status"] == "ok":
            print(f"  {r['name']:<18} " + " ".join(f"{v:.3f}" for v in r["losses"]))
    print("\n### Targets (against DDP measured in this run)\n")
    L = o.stages
    for r in rows:
        if r["config"] in ("cdp-replicated", "cdp-relayed", "stage-parallel", "cdp-sync"):
            a = div(value(r, "act_peak_sum"), value(base, "act_peak_sum"))
            b = value(r, "bytes_ratio")
            s = div(value(r, "steps_per_s"), value(base, "steps_per_s"))
            sched = value(r, "sched_ratio")
            extra = f" (protocol {sched:.2f} -> {verdict(sched, TARGET_BURST)})" if math.isfinite(sched) else ""
            print(f"- {r['name']}: summed peak activations {ratio(a)} of DDP's (<= {TARGET_ACT}) -> "
                  f"{verdict(a, TARGET_ACT)}; bytes per time step max/mean as sent {b:.2f} (<= {TARGET_BURST}) -> "
                  f"{verdict(b, TARGET_BURST)}{extra}; throughput {ratio(s)} of DDP's (>= {TARGET_SPEED}) -> "
                  f"{speed_verdict(s)}")
    rel = next((r for r in rows if r["config"] == "cdp-relayed"), None)
    if rel is not None and stage_params:
        limit = value(base, "param_bytes") / o.ranks + max(stage_params)
        got = value(rel, "param_bytes")
        print(f"- CDP relayed parameter memory per rank {size(got)} <= DDP's / N + the largest stage = "
              f"{size(value(base, 'param_bytes'))} / {o.ranks} + {size(max(stage_params))} = {size(limit)} -> "
              f"{verdict(got / limit if math.isfinite(got) else math.nan, 1.0)}")
    print(f"- DDP's own bytes per time step max/mean: {value(base, 'bytes_ratio'):.2f} "
          f"(one burst a step would be 2L = {2 * L})")


FIELDS = ["config", "name", "status", "ranks", "act_peak_sum", "act_peak_sum_after", "act_mean_sum", "act_peak_rank",
          "param_bytes",
          "bytes_max", "bytes_mean", "bytes_ratio", "sched_max", "sched_mean", "sched_ratio", "window", "step_s",
          "steps_per_s", "total_s", "final_loss", "rank_peaks", "rank_params", "model_params", "stage_params",
          "torch", "wall_s", "note"]


def write_outputs(rows, o):
    flat = []
    for r in rows:
        f = dict(r)
        for key in ("rank_peaks", "rank_params", "stage_params"):
            if isinstance(f.get(key), list):
                f[key] = " ".join(str(int(x)) for x in f[key])
        flat.append(f)
    sup.write_csv(o.csv, FIELDS, flat)
    with open(o.losses_csv, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["config", "step", "loss"])
        for r in rows:
            for s, v in enumerate(r.get("losses") or []):
                w.writerow([r["config"], s, f"{v:.6f}" if math.isfinite(v) else ""])
    with open(o.timeline_csv, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["config", "time_step", "activation_bytes_summed", "activation_bytes_summed_after_actions",
                    "bytes_sent_summed"])
        for r in rows:
            acts, after, sent = r.get("acts") or [], r.get("acts_after") or [], r.get("sent_t") or []
            for t, a in enumerate(acts):
                w.writerow([r["config"], t, a, after[t] if t < len(after) else "",
                            f"{sent[t]:.0f}" if t < len(sent) else ""])
    print(f"\nwrote {o.csv}, {o.losses_csv}, {o.timeline_csv}")


def plot(losses_csv, timeline_csv, png) -> bool:
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def load(path):
        with open(path) as f:
            return list(csv.DictReader(f))

    losses, timeline = load(losses_csv), load(timeline_csv)
    names = list(dict.fromkeys(r["config"] for r in losses + timeline))
    fig, (a1, a2, a3) = plt.subplots(1, 3, figsize=(18, 4.8))
    styles = ["-", "--", ":", "-.", (0, (5, 1)), (0, (1, 1))]
    steps = max((int(r["step"]) for r in losses), default=0) + 1
    lo, hi = 2 * 8 * (steps // 4), 2 * 8 * (steps // 4) + 4 * 8  # four steps in the middle (2L = 8 time steps each)
    for i, n in enumerate(names):
        style = dict(label=CONFIGS.get(n, n), linestyle=styles[i % len(styles)], linewidth=1.6)
        pts = [(int(r["step"]), float(r["loss"])) for r in losses if r["config"] == n and r["loss"]]
        if pts:
            a1.plot(*zip(*pts), marker=".", **style)
        rows = [r for r in timeline if r["config"] == n and lo <= int(r["time_step"]) < hi]
        pts = [(int(r["time_step"]), float(r["activation_bytes_summed"]) / 2**20) for r in rows]
        if pts:
            a2.step(*zip(*pts), where="post", **style)
        pts = [(int(r["time_step"]), float(r["bytes_sent_summed"]) / 2**20) for r in rows if r["bytes_sent_summed"]]
        if pts:
            a3.step(*zip(*pts), where="post", **style)
    a1.set(xlabel="step", ylabel="loss (mean over ranks)", title="loss curves (same weights, same data)")
    a2.set(xlabel=f"global time step (2L = 8 per step; {lo} to {hi - 1} shown)", ylabel="MiB",
           title="activations held during the time step, summed over ranks")
    a3.set(xlabel=f"global time step ({lo} to {hi - 1})", ylabel="MiB",
           title="bytes sent per time step, summed over ranks")
    for a in (a1, a2, a3):
        a.grid(alpha=0.3)
        a.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    return True


def draw(o):
    if plot(o.losses_csv, o.timeline_csv, o.png):
        print(f"wrote {o.png}")
        return
    other = "/usr/bin/python3"  # Debian's python3-matplotlib, where the venv has none
    if os.path.exists(other):
        rc = subprocess.run([other, os.path.abspath(__file__), "--plot", "--losses-csv", o.losses_csv,
                             "--timeline-csv", o.timeline_csv, "--png", o.png]).returncode
        if rc == 0:
            return
    print("no matplotlib here nor in /usr/bin/python3: no plot")


def launcher(o) -> int:
    print(f"torch_cdp_bench: {o.ranks} ranks (torchrun, gloo, CPU), transformer width {o.width}, {o.heads} heads, "
          f"depth {o.depth}, vocabulary {o.vocab}, {o.seq} tokens, {o.batch} sequences per rank, L = {o.stages}, "
          f"AdamW lr {o.lr}, {o.steps} steps ({o.warmup} warm-up)")
    print(f"machine: {sup.cpu_model()}, {os.cpu_count()} hardware threads, {size(sup.machine_ram())} RAM; "
          f"load average at start: {sup.load_average()}")
    print(f"python: {sys.executable}; OMP_NUM_THREADS={o.threads} per rank")
    rows, started = [], time.monotonic()
    for kind in o.configs:
        row = launch(o, kind)
        rows.append(row)
        progress(row)
    print_tables(rows, o)
    write_outputs(rows, o)
    draw(o)
    print(f"load average at end: {sup.load_average()}; total wall time: {seconds(time.monotonic() - started)}")
    return 1 if any(r["status"] == "failed" for r in rows) else 0


def parse_args(argv):
    p = argparse.ArgumentParser(description="flatmem.torch cyclic data parallelism vs DDP / FSDP under torchrun "
                                            "(CPU, gloo), every configuration in its own launch.")
    p.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated subset of " + ", ".join(CONFIGS))
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--stages", type=int, default=4)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--batch", type=int, default=8, help="sequences per rank (stage-parallel: per micro-batch)")
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--warmup", type=int, default=4, help="steps left out of the step time")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--csv", help="default bench/torch_cdp_bench.csv (--quick: the temporary directory)")
    p.add_argument("--losses-csv")
    p.add_argument("--timeline-csv")
    p.add_argument("--png")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per launch")
    p.add_argument("--verbose", action="store_true", help="echo torchrun's output")
    p.add_argument("--quick", action="store_true", help="6 steps, width 64, 32 tokens: a smoke run")
    p.add_argument("--plot", action="store_true", help="only redraw --png from --losses-csv and --timeline-csv")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    o = p.parse_args(argv)
    out = HERE
    if o.quick:
        o.steps, o.warmup, o.width, o.seq, o.batch = 6, 2, 64, 32, 4
        out = tempfile.gettempdir()
    o.csv = o.csv or os.path.join(out, "torch_cdp_bench_quick.csv" if o.quick else "torch_cdp_bench.csv")
    o.losses_csv = o.losses_csv or os.path.join(out, "torch_cdp_losses_quick.csv" if o.quick
                                                else "torch_cdp_losses.csv")
    o.timeline_csv = o.timeline_csv or os.path.join(out, "torch_cdp_timeline_quick.csv" if o.quick
                                                    else "torch_cdp_timeline.csv")
    o.png = o.png or os.path.join(out, "torch_cdp_quick.png" if o.quick else "torch_cdp.png")
    o.configs = [x.strip() for x in o.configs.split(",") if x.strip()]
    unknown = [x for x in o.configs if x not in CONFIGS]
    if unknown:
        p.error(f"--configs: unknown {', '.join(unknown)}")
    return o


def main(argv=None) -> int:
    o = parse_args(sys.argv[1:] if argv is None else argv)
    if o.plot:
        if plot(o.losses_csv, o.timeline_csv, o.png):
            print(f"wrote {o.png}")
            return 0
        return 1
    if o.worker:
        return worker(o)
    return launcher(o)


if __name__ == "__main__":
    sys.exit(main())
