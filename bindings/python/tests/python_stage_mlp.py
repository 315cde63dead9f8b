"""An L-stage NumPy MLP trained three ways, for the stage-parallel tests:

* stage-parallel, one rank per stage, through flatmem.CyclicStages
  (train_stage: the loop a framework would write: K parameter slots,
  activations kept per micro-batch, boundary tensors through the handle);
* data-parallel on N ranks through flatmem.Cyclic, rank m training on
  micro-batch m's rows (train_data_parallel);
* a single-process NumPy simulation of the schedule's math without flatmem
  (simulate): step s of micro-batch m at stage j uses parameter version
  max(0, s - delay(m, j)), the step's average is ((g_0 + g_1) + ...) * fl(1/N),
  version v + 1 = version v - lr * average(v).

All three run the same NumPy operations on arrays of the same shapes for each
(micro-batch, step, stage), so the trained parameters agree bit for bit where
the sums are formed in the same order (the stage handle's micro-batch order,
the data-parallel reduce chain's rank order under "delay1" / "newest").

Stage j: z = x W_j + b_j, y = tanh(z) (the last stage: y = z), parameters
flat [W_j (in x out, row-major), b_j]; the loss of a micro-batch is
1/2 mean((y - target)^2) over its rows and outputs.
"""
import numpy as np

import flatmem


class StageMlp:
    """widths[0 .. L]: stage j maps widths[j] -> widths[j + 1]; `rows` rows per
    micro-batch; data and initial parameters from `seed`."""

    def __init__(self, widths, rows, seed, dtype):
        self.widths, self.rows, self.seed, self.dtype = list(widths), rows, seed, np.dtype(dtype)
        self.stages = len(widths) - 1

    def count(self, j):
        """Parameters of stage j."""
        return self.widths[j] * self.widths[j + 1] + self.widths[j + 1]

    def initial(self, j):
        rng = np.random.default_rng([self.seed, 1, j])
        scale = 1.0 / np.sqrt(self.widths[j])
        return (rng.standard_normal(self.count(j)) * scale).astype(self.dtype)

    def batch(self, step, micro_batch):
        """(inputs (rows, widths[0]), targets (rows, widths[L])) of a micro-batch."""
        rng = np.random.default_rng([self.seed, 2, step, micro_batch])
        x = rng.standard_normal((self.rows, self.widths[0])).astype(self.dtype)
        t = rng.standard_normal((self.rows, self.widths[-1])).astype(self.dtype)
        return x, t

    def boundary_bytes(self):
        """options.boundary_bytes: the activation (= its gradient) of each boundary."""
        return [self.rows * self.widths[j + 1] * self.dtype.itemsize for j in range(self.stages - 1)]

    def activation_bytes(self):
        """Bytes a stage keeps per micro-batch: its input and output."""
        return [self.rows * (self.widths[j] + self.widths[j + 1]) * self.dtype.itemsize
                for j in range(self.stages)]

    def _split(self, j, w):
        n_in, n_out = self.widths[j], self.widths[j + 1]
        return w[:n_in * n_out].reshape(n_in, n_out), w[n_in * n_out:]

    def forward(self, j, w, x):
        W, b = self._split(j, w)
        z = x @ W + b
        return z if j == self.stages - 1 else np.tanh(z)

    def loss(self, y, target):
        """(loss, dloss/dy)."""
        d = y - target
        return float(0.5 * np.mean(d * d)), d / self.dtype.type(d.size)

    def backward(self, j, w, x, y, dy):
        """(the flat parameter gradient, dloss/dx)."""
        W, _ = self._split(j, w)
        dz = dy if j == self.stages - 1 else dy * (self.dtype.type(1) - y * y)
        grad = np.concatenate([(x.T @ dz).ravel(), dz.sum(axis=0)])
        return grad, dz @ W.T


def sgd(w, average, lr):
    """Version v + 1 from version v (the caller's optimizer, same op everywhere)."""
    return w - w.dtype.type(lr) * average


def delay(rule, micro_batches, stages, m, j):
    """The parameter delay of micro-batch m at stage j, from the closed forms
    (not from the library): sync 0, delay1 1, newest 0 when
    offset(N-1) - offset(m) <= 2j, offset(m) = floor(m 2L / N)."""
    if rule == "sync":
        return 0
    if rule == "delay1":
        return 1
    offset = lambda r: r * 2 * stages // micro_batches  # noqa: E731
    return 0 if offset(micro_batches - 1) - offset(m) <= 2 * j else 1


def simulate(mlp, micro_batches, steps, rule, lr):
    """The trained parameters of every stage, computed in one process."""
    L, N = mlp.stages, micro_batches
    versions = [[mlp.initial(j)] for j in range(L)]
    for s in range(steps):
        sums = [None] * L
        for m in range(N):
            w = [versions[j][max(0, s - delay(rule, N, L, m, j))] for j in range(L)]
            x, target = mlp.batch(s, m)
            kept = []
            for j in range(L):
                y = mlp.forward(j, w[j], x)
                kept.append((x, y))
                x = y
            _, dy = mlp.loss(y, target)
            for j in reversed(range(L)):
                grad, dy = mlp.backward(j, w[j], *kept[j], dy)
                sums[j] = grad if sums[j] is None else sums[j] + grad
        for j in range(L):
            versions[j].append(sgd(versions[j][s], sums[j] * mlp.dtype.type(1.0 / N), lr))
    return [versions[j][steps] for j in range(L)]


def train_stage(h, mlp, lr):
    """Stage h.stage's side of the training, to "done". Returns
    {"params": version S, "versions_kept": K, "actions": [...],
    "losses": {(step, micro_batch): loss} (last stage)}."""
    j, sched = h.stage, h.schedule
    L, S = sched.stages, sched.steps
    K = sched.versions_kept(j)
    slots, slot_version = [mlp.initial(j)] + [None] * (K - 1), [0] + [-1] * (K - 1)
    held, losses, actions = {}, {}, []
    n_in, n_out = mlp.widths[j], mlp.widths[j + 1]

    def use(version):
        assert slot_version[version % K] == version, (j, version, slot_version)
        return slots[version % K]

    while True:
        a = h.next()
        if a.kind == "done":
            break
        actions.append(a)
        if a.update_step is not None:
            v = a.update_step
            slots[(v + 1) % K] = sgd(use(v), h.average(), lr)
            slot_version[(v + 1) % K] = v + 1
        key = (a.step, a.micro_batch)
        if a.kind == "forward":
            w = use(a.version)
            x = h.receive(np.empty((mlp.rows, n_in), mlp.dtype)) if a.receives else mlp.batch(*key)[0]
            y = mlp.forward(j, w, x)
            held[key] = (x, y)
            if a.sends:
                h.send(y)
        elif a.kind == "backward":
            w = use(a.version)
            x, y = held.pop(key)
            if a.receives:
                dy = h.receive(np.empty((mlp.rows, n_out), mlp.dtype))
            else:
                losses[key], dy = mlp.loss(y, mlp.batch(*key)[1])
            grad, dx = mlp.backward(j, w, x, y, dy)
            h.accumulate(grad)
            if a.sends:
                h.send(dx)
    assert not held, f"stage {j}: {len(held)} micro-batches still held at done"
    return {"params": use(S), "versions_kept": K, "actions": actions, "losses": losses}


def train_stages(comm, mlp, micro_batches, steps, rule, lr, timeout_ms=20000):
    """Creates this stage rank's CyclicStages and trains; adds the summary and
    the per-time-step statistics to train_stage's result."""
    with flatmem.CyclicStages(comm, micro_batches=micro_batches, steps=steps, rule=rule,
                              boundary_bytes=mlp.boundary_bytes(), activation_bytes=mlp.activation_bytes(),
                              timeout_ms=timeout_ms) as h:
        result = train_stage(h, mlp, lr)
        result["summary"], result["stats"] = h.summary(), h.stats()
    return result


def train_data_parallel(comm, mlp, steps, rule, lr, timeout_ms=20000):
    """Rank r of N trains the whole model on micro-batch r's rows through
    flatmem.Cyclic; returns the trained parameters of every stage."""
    L, r = mlp.stages, comm.rank
    w = [mlp.initial(j) for j in range(L)]
    grads = [[np.zeros(mlp.count(j), mlp.dtype) for _ in range(2)] for j in range(L)]
    kept, dys = {}, {}
    with flatmem.Cyclic(comm, stages=L, steps=steps, rule=rule, timeout_ms=timeout_ms) as cyc:
        while (a := cyc.next()).kind != "done":
            if a.update_stage is not None:
                u = a.update_stage
                w[u] = sgd(w[u], grads[u][a.update_step % 2], lr)
            j = a.stage
            if a.kind == "forward":
                x = mlp.batch(a.step, r)[0] if j == 0 else kept[j - 1][1]
                kept[j] = (x, mlp.forward(j, w[j], x))
            elif a.kind == "backward":
                x, y = kept[j]
                dy = mlp.loss(y, mlp.batch(a.step, r)[1])[1] if j == L - 1 else dys[j]
                grad, dys[j - 1] = mlp.backward(j, w[j], x, y, dy)
                g = grads[j][a.step % 2]
                g[...] = grad
                cyc.reduce(j, g)
    return w


def train_relayed(comm, mlp, steps, lr, timeout_ms=20000, calls=lambda cyc: cyc):
    """The ZeRO relay mode ("delay1"): rank r of N keeps shard r of every
    stage (set_shard), takes the full stage from the relay before each
    forward and backward (parameters), and updates its shard in place with
    its range of the average. calls(handle): what set_shard, parameters and
    reduce are called on (the handle itself by default). Returns {"shards":
    [...], "summary": ..., "stats": [...]}, the shards holding version S."""
    L, r = mlp.stages, comm.rank
    with flatmem.Cyclic(comm, stages=L, steps=steps, rule="delay1", timeout_ms=timeout_ms, parameters="relayed",
                        parameter_count=[mlp.count(j) for j in range(L)]) as handle:
        cyc = calls(handle)
        for j in range(L):
            cyc.set_shard(j, mlp.initial(j)[cyc.shard_range(j)].copy())
        full = [np.empty(mlp.count(j), mlp.dtype) for j in range(L)]
        grads = [np.zeros(mlp.count(j), mlp.dtype) for j in range(L)]  # one per stage is enough (relayed)
        kept, dys = {}, {}
        while (a := cyc.next()).kind != "done":
            if a.update_stage is not None:
                u, shard = a.update_stage, cyc.shard(a.update_stage)
                shard[...] = sgd(shard, grads[u][cyc.shard_range(u)], lr)
            j = a.stage
            if a.kind not in ("forward", "backward"):
                continue
            w = cyc.parameters(full[j])
            if a.kind == "forward":
                x = mlp.batch(a.step, r)[0] if j == 0 else kept[j - 1][1]
                kept[j] = (x, mlp.forward(j, w, x))
            else:
                x, y = kept[j]
                dy = mlp.loss(y, mlp.batch(a.step, r)[1])[1] if j == L - 1 else dys[j]
                grad, dys[j - 1] = mlp.backward(j, w, x, y, dy)
                grads[j][...] = grad
                cyc.reduce(j, grads[j])
        return {"shards": [cyc.shard(j).copy() for j in range(L)], "summary": cyc.relay_summary(),
                "stats": cyc.relay_stats()}
