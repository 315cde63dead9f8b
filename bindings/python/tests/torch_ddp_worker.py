"""One rank of the DDP training test (test_torch_ddp_training.py), launched by torchrun:

    python -m torch.distributed.run --nproc-per-node N torch_ddp_worker.py MODE [WATCHDOG_S]

A small two-tower model (an image and a text tower, L2-normalised float32 features, a LEARNED
logit_scale -- a log-scale, as open_clip's -- and for SigLIP a learned logit_bias) trains for
STEPS SGD steps on a fresh global batch each step (every rank draws the whole global batch from
one fixed generator and keeps its own rows), in copies with the same initial weights:

  ring       DistributedDataParallel, flatmem's ring loss over the ranks as a training script
             writes it: fmt.ClipLoss(rank=r, world_size=N), fmt.infonce_loss(q, k, s, comm=comm,
             grad_scale=N), fmt.SigLipLoss(rank=r, world_size=N)
  single     no DDP, in this process: the same model on the concatenated global batch with the
             non-ring flatmem loss (fmt.clip_loss(q_all, k_all, s), ...): what the ring must train
  open_clip  DistributedDataParallel with open_clip's own losses (ClipLoss(local_loss=False,
             gather_with_grad=True, rank, world_size), SigLipLoss(rank, world_size))

After EVERY step every parameter (both towers, logit_scale, logit_bias) of the ring run must equal
the single-process run's, and so must the step's loss; open_clip's likewise against both; all
within TOLERANCE (below).

Cases, KIND[-VARIANT], KIND clip | infonce | siglip; VARIANT:
  open_clip   also open_clip's loss under DDP (equal shards: its all_gather / neighbour exchange
              need them)
  compiled    the loss module under torch.compile (graph breaks allowed), its communicator passed in
  uneven      UNEVEN rows per rank (DDP still averages the ranks equally: each rank's feature
              gradient is N times the global loss's for its rows, whatever their number)
  fullgraph   torch.compile(module, fullgraph=True), its communicator passed in
  lazy        torch.compile(module, fullgraph=True) of ClipLoss(rank, world_size), whose
              communicator the module makes itself (when it is constructed: the group exists)

MODE
  train       CASES; prints "rank R: ddp CASE ok (...)" per case; stops at the first failure
  fullgraph   FULLGRAPH_CASES (prints the same lines)
  lazy        LAZY_CASES (the same)
  buggy       the scale / bias gradients of the ring made N times too large again, as before
              commit 94538a7 (reintroduce_the_bug); every case of BUGGY_CASES must FAIL the
              comparison; prints "rank R: buggy CASE caught (...)" per case
"""
import faulthandler
import math
import os
import re
import sys
import time
import traceback

import torch
import torch.distributed as dist
import torch.nn.functional as F

import flatmem.torch as fmt
from torch_ring_worker import say

STEPS = 20
ROWS = 8               # rows per rank (equal shards; the "uneven" cases take UNEVEN instead)
UNEVEN = [3, 5, 1, 4]  # rows of ranks 0..3 (the first world_size of them)
D_IMAGE, D_TEXT, HIDDEN, D = 24, 20, 32, 16
# Plain SGD with momentum, one learning rate for every parameter. Not Adam: Adam divides each
# parameter's update by the root of its mean squared gradient, so a scale gradient N times too
# large (the bug this test is for) would change Adam's updates hardly at all. lr 0.02: the
# largest at which SigLIP's log-scale does not collapse towards 0 from open_clip's init
# (log 10, bias -10) on these small batches; the scalars still move by tenths (printed).
LR, MOMENTUM = 0.02, 0.9
LOG_SCALE0 = math.log(10.0)  # open_clip's SigLIP init (its CLIP init is log(1 / 0.07))
BIAS0 = -10.0                # open_clip's SigLIP init

# The comparisons: after each step, max |a - b| over a parameter tensor <= TOLERANCE * max |b|,
# and |loss_a - loss_b| <= TOLERANCE * |loss_b|. Why 1e-4: the runs compute in float32 with the
# same formulas in different summation orders -- the ring walks the columns block by block as
# they arrive and merges log-sum-exps across blocks, one process walks them in one go, open_clip
# materialises the logits and all_gathers the features; DDP adds the N ranks' tower gradients in
# gloo's order where one process sums all rows in autograd's. Each step's gradients therefore
# agree to a few float32 ulps of their size (~1e-6 relative); 20 SGD steps with momentum 0.9 add
# at most 20 / (1 - 0.9) = 200 such perturbations of an update lr * g, i.e. a few 1e-4 of the
# distance a parameter moved, and that distance is a fraction of its magnitude. Measured: at most
# a few 1e-6 (printed per case). The bug is not rounding: N times the scale / bias gradient moves
# them N times as far each step, a relative error of 1e-2 or more within a few steps; the "buggy"
# mode shows 1e-4 sees it.
TOLERANCE = 1e-4
# The scalars must really train, or a frozen logit_scale would pass every comparison: each must
# at some step be MIN_MOVE * TOLERANCE * |value| or more from its initial value, i.e. its
# excursion is at least 100 times the band the comparison allows it.
MIN_MOVE = 100
WATCHDOG_S = 200  # a rank still running after this prints its stack and exits (the launcher waits 240 s)


class TwoTower(torch.nn.Module):
    """Image and text towers, L2-normalised features, a learned log-scale (and bias), float32.
    forward returns what open_clip's CLIP.forward returns: (image_features, text_features,
    logit_scale.exp(), logit_bias or None)."""

    def __init__(self, bias):
        super().__init__()
        torch.manual_seed(0)  # identical initial weights in every copy and on every rank
        self.image = torch.nn.Sequential(torch.nn.Linear(D_IMAGE, HIDDEN), torch.nn.GELU(),
                                         torch.nn.Linear(HIDDEN, D))
        self.text = torch.nn.Sequential(torch.nn.Linear(D_TEXT, HIDDEN), torch.nn.GELU(), torch.nn.Linear(HIDDEN, D))
        self.logit_scale = torch.nn.Parameter(torch.tensor(LOG_SCALE0))
        self.logit_bias = torch.nn.Parameter(torch.tensor(BIAS0)) if bias else None

    def forward(self, x, y):
        return (F.normalize(self.image(x), dim=-1), F.normalize(self.text(y), dim=-1), self.logit_scale.exp(),
                self.logit_bias)


def global_batches(total):
    """STEPS global batches (x (total, D_IMAGE), y (total, D_TEXT)) of paired rows: both
    modalities are noisy linear views of one latent, so the towers have something to learn."""
    g = torch.Generator().manual_seed(1234)
    a, b = torch.randn(8, D_IMAGE, generator=g), torch.randn(8, D_TEXT, generator=g)
    out = []
    for _ in range(STEPS):
        z = torch.randn(total, 8, generator=g)
        out.append((z @ a + 0.5 * torch.randn(total, D_IMAGE, generator=g),
                    z @ b + 0.5 * torch.randn(total, D_TEXT, generator=g)))
    return out


def train(bias, loss_of, batches, rows=slice(None), ddp=False):
    """STEPS SGD steps of a new TwoTower (wrapped in DDP when ddp) on rows `rows` of each global
    batch; loss_of(q, k, scale, bias) is the loss. Returns the trajectory: per step, the loss
    value and a copy of every parameter after the step."""
    model = TwoTower(bias)
    run = torch.nn.parallel.DistributedDataParallel(model) if ddp else model
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    trajectory = []
    for x, y in batches:
        opt.zero_grad(set_to_none=True)
        loss = loss_of(*run(x[rows], y[rows]))
        loss.backward()
        opt.step()
        trajectory.append((loss.detach().clone(), {n: p.detach().clone() for n, p in model.named_parameters()}))
    return trajectory


def compare(what, got, want):
    """The largest relative error (TOLERANCE's comment) over the steps of every parameter and of
    the loss; beyond TOLERANCE, raises AssertionError naming the first step and quantity past it,
    the worst, and the scalars there. Returns the largest error."""
    first, worst = None, (0.0, None, None)
    for step, ((loss_a, params_a), (loss_b, params_b)) in enumerate(zip(got, want), 1):
        assert params_a.keys() == params_b.keys()
        errors = {name: ((params_a[name] - b).abs().max() / b.abs().max()).item() for name, b in params_b.items()}
        errors["loss"] = ((loss_a - loss_b).abs() / loss_b.abs()).item()
        for name, error in errors.items():
            if not error <= worst[0]:  # (a NaN is the worst)
                worst = (error, name, step)
            if first is None and not error <= TOLERANCE:
                first = (error, name, step)
    if first is not None:
        def scalars(step):
            return ", ".join(f"{n} {got[step - 1][1][n].item():.6g} vs {want[step - 1][1][n].item():.6g}"
                             for n in ("logit_scale", "logit_bias") if n in want[step - 1][1])
        raise AssertionError(f"{what}: first beyond tolerance {TOLERANCE:g}: {first[1]} off by {first[0]:.3g} "
                             f"relative after step {first[2]} ({scalars(first[2])}); worst: {worst[1]} off by "
                             f"{worst[0]:.3g} after step {worst[2]}")
    return worst[0]


def siglip_global_mean(loss):
    """open_clip's SigLipLoss returns THIS rank's term -sum_{i mine} sum_{j all} log sigmoid(z_ij
    x_ij) / b_mine (its own images against every rank's texts, divided by its own image count);
    flatmem's SigLipLoss returns the global mean over all B images. With equal shards (b_mine =
    B / N) the mean of the N ranks' terms is flatmem's value. The gradients need no conversion:
    the sum of the N terms is N times the global mean, each rank's text features get their
    gradient back through open_clip's neighbour exchange, so the tower gradients of the N ranks
    add up to N times the global mean's and the scale / bias gradients (each rank's own term's) do
    too; DDP's average divides by N -- the global mean's gradient, what flatmem's ring trains.
    (With uneven shards the conventions would part: open_clip weighs each rank's images by
    1 / b_mine; its all_gather and exchange need equal shards anyway.)"""
    total = loss.detach().clone()
    dist.all_reduce(total)
    return total / dist.get_world_size()


def ring_criterion(kind, variant, rank, world, comm):
    """The ring loss of `kind` as a training script writes it: (loss_of(q, k, s, t), the module
    or None, the compiled callable or None)."""
    if kind == "infonce":  # the functional form: the caller passes comm and grad_scale itself
        return (lambda q, k, s, t: fmt.infonce_loss(q, k, s, comm=comm, grad_scale=world)), None, None
    module = fmt.ClipLoss if kind == "clip" else fmt.SigLipLoss
    if variant in ("compiled", "fullgraph"):
        # the communicator made beforehand: nothing collective left for the first compiled call
        criterion = module(rank=rank, world_size=world, comm=comm)
        compiled = torch.compile(criterion, fullgraph=variant == "fullgraph")
    else:
        # as open_clip's: rank and world_size only, the communicator made by the module from the
        # default process group
        criterion = module(rank=rank, world_size=world)
        compiled = torch.compile(criterion, fullgraph=True) if variant == "lazy" else None
    call = compiled if compiled is not None else criterion
    if kind == "clip":
        return (lambda q, k, s, t: call(q, k, s)), criterion, compiled
    return call, criterion, compiled


def graph_breaks():
    """What dynamo broke the graph at since the counters were cleared, shortened."""
    from torch._dynamo.utils import counters
    reasons = []
    for reason in counters["graph_break"]:
        builtin = re.search(r"builtin `([^`]+?)\.?`", reason)
        manager = re.search(r"enter a `(\w+)` context manager", reason)
        reasons.append(builtin.group(1) if builtin else f"`with <{manager.group(1)}>`" if manager
                       else reason.splitlines()[0])
    return sorted(set(reasons))


def excursion(trajectory, name, start):
    return max(abs(params[name].item() - start) for _, params in trajectory)


def run_case(case, rank, world, comm):
    """Trains the copies of `case` (module docstring) and compares them; returns the line to print."""
    kind, _, variant = case.partition("-")
    shards = UNEVEN[:world] if variant == "uneven" else [ROWS] * world
    start = sum(shards[:rank])
    mine = slice(start, start + shards[rank])
    batches = global_batches(sum(shards))
    bias = kind == "siglip"

    # one process on the whole global batch, the non-ring loss
    single_loss = {"clip": lambda q, k, s, t: fmt.clip_loss(q, k, s),
                   "infonce": lambda q, k, s, t: fmt.infonce_loss(q, k, s),
                   "siglip": lambda q, k, s, t: fmt.sigmoid_loss(q, k, s, t)}[kind]
    single = train(bias, single_loss, batches)

    # the ring under DDP
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    ring_loss, criterion, compiled = ring_criterion(kind, variant, rank, world, comm)
    ring = train(bias, ring_loss, batches, mine, ddp=True)
    if criterion is not None and criterion.comm is not None and criterion.comm is not comm:
        criterion.comm.close()  # the one ClipLoss / SigLipLoss made
    err = compare(f"{case}: ring under DDP against one process", ring, single)

    final = ring[-1][1]
    line = f"max rel err {err:.2g} vs one process"
    if compiled is not None:
        breaks = graph_breaks()
        line += f"; compiled, graph breaks at: {', '.join(breaks) if breaks else 'none'}"
    line += f"; log scale {LOG_SCALE0:.3f} -> {final['logit_scale'].item():.3f}"
    line += f" (max move {excursion(ring, 'logit_scale', LOG_SCALE0):.3f})"
    if bias:
        line += f", bias {BIAS0:.2f} -> {final['logit_bias'].item():.2f}"
        line += f" (max move {excursion(ring, 'logit_bias', BIAS0):.3f})"
    line += f"; loss {ring[0][0].item():.4f} -> {ring[-1][0].item():.4f}"
    for name, start_value in (("logit_scale", LOG_SCALE0), ("logit_bias", BIAS0))[:2 if bias else 1]:
        if not excursion(single, name, start_value) >= MIN_MOVE * TOLERANCE * abs(start_value):
            raise AssertionError(f"{case}: {name} barely trained ({line}): the comparison proves little")

    if variant == "open_clip":
        import open_clip.loss as oc
        if kind == "clip":
            theirs = oc.ClipLoss(local_loss=False, gather_with_grad=True, rank=rank, world_size=world)
            oc_loss = lambda q, k, s, t: theirs(q, k, s)  # noqa: E731
            value = lambda loss: loss  # noqa: E731  (every rank: the global loss)
        else:
            oc_loss = oc.SigLipLoss(rank=rank, world_size=world)
            value = siglip_global_mean
        theirs_run = [(value(loss), params) for loss, params in train(bias, oc_loss, batches, mine, ddp=True)]
        err_ring = compare(f"{case}: open_clip under DDP against flatmem's ring", theirs_run, ring)
        err_single = compare(f"{case}: open_clip under DDP against one process", theirs_run, single)
        line += f"; open_clip vs ring {err_ring:.2g}, open_clip vs one process {err_single:.2g}"
    return line


CASES = ["clip-open_clip", "infonce", "siglip-open_clip", "clip-compiled", "siglip-compiled", "clip-uneven",
         "infonce-uneven", "siglip-uneven"]
FULLGRAPH_CASES = ["clip-fullgraph", "siglip-fullgraph"]
LAZY_CASES = ["clip-lazy"]
BUGGY_CASES = ["clip", "infonce", "siglip"]


def reintroduce_the_bug():
    """The autograd formulas of flatmem's operators as they were before commit 94538a7: the scale
    and bias gradients came out of the C call that took dloss * grad_scale and were handed on as
    they were -- N times the global dL/ds, dL/dt on every rank, which DDP's average keeps."""
    from flatmem.torch import _ops

    # the softmax losses (contrastive_backward) and the recomputing sigmoid loss: no division
    _ops._scalar_gradient = lambda d, grad_scale, shape: d.reshape(shape)

    # the sigmoid loss with saved gradients (SigLipLoss's default): the old _saved_grad, with g
    # (grad_scale included) for the scalars too
    def old_saved_grad(ctx, dloss, *_unused):
        dq, dk, ds, dt = ctx.saved_tensors
        want = ctx.needs_input_grad
        g = _ops._incoming(dloss, ctx.grad_scale)
        s_shape, t_shape = ctx.shapes
        return ((dq * g).to(dq.dtype) if want[0] else None, (dk * g).to(dk.dtype) if want[1] else None,
                (ds * g).reshape(s_shape) if want[2] else None, (dt * g).reshape(t_shape) if want[3] else None,
                None, None, None, None, None)

    torch.library.register_autograd("flatmem::sigmoid_value_and_grad", old_saved_grad,
                                    setup_context=_ops._saved_setup)


def main():
    mode = sys.argv[1]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # A rank that hangs prints where and exits before the launcher's deadline, instead of
    # staying behind as an orphan when the launcher is killed.
    faulthandler.dump_traceback_later(float(sys.argv[2]) if len(sys.argv) > 2 else WATCHDOG_S, exit=True)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    comm = fmt.communicator(timeout_ms=60000)
    if mode == "buggy":
        reintroduce_the_bug()
        missed = False
        for case in BUGGY_CASES:
            try:
                line = run_case(case, rank, world, comm)
            except AssertionError as e:  # the comparisons come after training: every rank is here
                say(f"rank {rank}: buggy {case} caught ({e})")
                continue
            missed = True
            say(f"rank {rank}: buggy {case} NOT caught: {line}")
        if missed:
            sys.exit(1)
    else:
        cases = {"train": CASES, "fullgraph": FULLGRAPH_CASES, "lazy": LAZY_CASES}[mode]
        for case in cases:
            start = time.monotonic()
            try:
                line = run_case(case, rank, world, comm)
            except Exception as e:
                # stop here: a case that failed on some ranks only leaves the others in a
                # collective; torchrun ends them when this rank exits
                detail = "".join(traceback.format_exception_only(e)).strip()
                say(f"rank {rank}: ddp {case} FAILED: {detail}")
                sys.stdout.flush()
                os._exit(1)
            say(f"rank {rank}: ddp {case} ok ({line}; {time.monotonic() - start:.1f} s)")
    comm.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
