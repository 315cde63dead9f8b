"""The contrastive losses for torch: functions and open_clip-compatible modules.

    loss = flatmem.torch.clip_loss(image_features, text_features, logit_scale)
    loss = flatmem.torch.sigmoid_loss(image_features, text_features, logit_scale, logit_bias)
    loss.backward()          # gradients of q, k, the scale (and the bias), as for any torch op

Formulas (include/flatmem/flatmem.h): logits x_ij = s <q_i, k_j> (+ t for the sigmoid loss),
never materialised; the b x c matrix is walked in tiles.
  clip_loss     L = 1/2 [mean_i (LSE_j x_ij - x_ii) + mean_j (LSE_i x_ij - x_jj)]       (c = b)
  infonce_loss  L = mean_i (LSE_j x_ij - x_{i, y_i}),   y = labels or 0..b-1         (c >= b allowed)
  sigmoid_loss  L = -(1/b) sum_i sum_j log sigmoid(z_ij x_ij),  z = +1 at (i, y_i), else -1
The scale s is the multiplier itself (open_clip's ``logit_scale.exp()``); its gradient is dL/ds,
so a learned log-scale passed as ``log_s.exp()`` gets its gradient through autograd.

Inputs: q (b, d) and k (c, d), float32, bfloat16 or float16 (fp32 accumulation), on the CPU or
one CUDA device (torch's current stream is the call's), any row stride (other layouts are made
contiguous); q and k of different dtypes are promoted as torch promotes them (torch.promote_types:
bfloat16 + float32 -> float32, float16 + bfloat16 -> float32, ...; what open_clip computes in),
equal dtypes are used as they are (no copy), other dtypes (float64, integers) are refused by the
library naming the argument; the scale and bias are numbers or one-element tensors (cast to
float32); labels integer (b,). Results are torch tensors on the inputs' device: the loss a 0-d
float32 tensor, dq and dk each in its own input's dtype (computed in the promoted one). Every
call is a torch custom operator: eager, under torch.compile without a graph break, under
torch.library.opcheck. Gradients are first order: a second backward through them (after
create_graph=True) raises a RuntimeError (_bridge.first_order_only).

Options:
  logit_cache_bytes  (softmax losses, CPU) bytes of logit tiles the forward keeps for the backward:
                     6 b c d instead of 8 b c d FLOPs at 4 b c bytes, bitwise the same gradients
  comm               a flatmem.Communicator (flatmem.torch.communicator()): the ring loss of the
                     GLOBAL batch whose rows this rank holds; see distributed.py for the gradient
                     convention under DDP. CPU tensors travel over the host transport; CUDA
                     tensors over NCCL after ``comm.init_device(torch.cuda.current_device())`` on
                     every rank (without it the call fails naming options.comm). The CUDA ring
                     synchronises the current stream once per call and keeps its transit buffers
                     in memory it allocates itself (outside torch's caching allocator).
  grad_scale         the gradients of q and k are multiplied by this (the ring under DDP: the world
                     size); the scale and bias gradients are not (every rank of a ring holds the
                     global dL/ds, dL/dt, which DDP's average leaves as they are; distributed.py)
  nonfinite          "propagate" (default: NaN / Inf flow into the results, as in torch; CUDA needs
                     it) or "error" (the CPU refuses them, naming the tensor)
  precision          "default", "round_once" (alias "tf32") or "full" (anything else: ValueError):
                     flatmem_fp32_precision, defined once, with its bounds, in flatmem.h.
  recompute          (sigmoid_loss) False: under autograd one pass computes the loss and every
                     gradient (6 b c d FLOPs) and keeps dq, dk for the backward; True: the forward
                     keeps nothing and the backward recomputes (8 b c d FLOPs in all)
Errors are flatmem's exceptions (flatmem.InvalidArgumentError is a ValueError, ...) with its message
naming the argument.
"""
from __future__ import annotations

import torch

from ..contrastive import Options
from . import _bridge as br
from . import _ops  # noqa: F401  (registers the operators)
from . import distributed as dist_

def _options(nonfinite, precision, logit_cache_bytes=0) -> Options:
    """The one translation of an entry point's option names into C values (flatmem.contrastive.Options)."""
    return Options.of(nonfinite=nonfinite, precision=precision, logit_cache_bytes=logit_cache_bytes)


def _softmax(q, k, logit_scale, labels, symmetric, comm, grad_scale, o: Options):
    q, k = br.features(q, k)
    s = br.scalar(logit_scale, q, "logit_scale")
    labels = br.labels_tensor(labels, q)
    loss, _, _ = torch.ops.flatmem.contrastive_forward(q, k, s, labels, symmetric, o.logit_cache_bytes,
                                                       dist_.slot(comm), o.nonfinite,
                                                       float(grad_scale), o.fp32_precision)
    return loss


def clip_loss(q, k, logit_scale, *, logit_cache_bytes=0, comm=None, grad_scale=1.0, nonfinite="propagate",
              precision="default"):
    """The symmetric CLIP loss of rows q (b, d) and columns k (b, d) at scale s (module docstring;
    precision as in the module docstring)."""
    return _softmax(q, k, logit_scale, None, True, comm, grad_scale, _options(nonfinite, precision, logit_cache_bytes))


def infonce_loss(q, k, logit_scale, labels=None, *, logit_cache_bytes=0, comm=None, grad_scale=1.0,
                 nonfinite="propagate", precision="default"):
    """InfoNCE of rows q (b, d) against columns k (c, d), labels (b,) in [0, c) or None (y_i = i);
    with comm, labels are GLOBAL column indices (module docstring; precision as clip_loss)."""
    return _softmax(q, k, logit_scale, labels, False, comm, grad_scale, _options(nonfinite, precision, logit_cache_bytes))


def sigmoid_loss(q, k, logit_scale, logit_bias, labels=None, *, recompute=False, comm=None, grad_scale=1.0,
                 nonfinite="propagate", precision="default"):
    """The pairwise sigmoid (SigLIP) loss of rows q (b, d) against columns k (c, d) (module docstring;
    precision as clip_loss)."""
    return _sigmoid(q, k, logit_scale, logit_bias, labels, recompute, comm, grad_scale, _options(nonfinite, precision))


def _sigmoid(q, k, logit_scale, logit_bias, labels, recompute, comm, grad_scale, o: Options):
    q, k = br.features(q, k)
    s, t = br.scalar(logit_scale, q, "logit_scale"), br.scalar(logit_bias, q, "logit_bias")
    labels = br.labels_tensor(labels, q)
    args = (q, k, s, t, labels, dist_.slot(comm), o.nonfinite, float(grad_scale),
            o.fp32_precision)
    differentiated = torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, s, t))
    if differentiated and not recompute:
        return torch.ops.flatmem.sigmoid_value_and_grad(*args)[0]
    return torch.ops.flatmem.sigmoid_forward(*args)


def _process_group_ready() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


class _RingModule(torch.nn.Module):
    """What ClipLoss and SigLipLoss share: open_clip's rank / world_size arguments and the
    communicator of a ring when world_size > 1 and none is given: made from the default process
    group when the module is made (collective), or at its first call if the group did not exist
    yet. Slot and size are plain attributes then, so a compiled forward (fullgraph=True) reads
    them as constants."""

    def __init__(self, rank, world_size, use_horovod, comm, nonfinite, comm_timeout_ms, precision="default",
                 logit_cache_bytes=0):
        super().__init__()
        # The module's one translation of its option names (every forward carries the C values).
        self._options = _options(nonfinite, precision, logit_cache_bytes)
        self.precision, self.nonfinite = precision, nonfinite
        self.comm_timeout_ms = int(comm_timeout_ms)
        if use_horovod:
            raise ValueError("flatmem.torch: use_horovod is not supported; the ring runs over a "
                             "flatmem.Communicator (flatmem.torch.communicator())")
        self.rank, self.world_size = int(rank), int(world_size)
        self.comm = None
        self._made_comm = comm is None  # made here: the device transport is ours to start too
        self._device_ready = False
        if comm is not None:
            self._use(comm)
        elif self.world_size > 1 and _process_group_ready():
            self._start_ring()  # collective: every rank makes its loss module, as in any DDP script

    def _use(self, comm):
        """Takes comm as this module's ring (checked against world_size; given its slot now, so that
        a compiled forward reads slot and size as constants)."""
        size = dist_.world_size(comm)
        if self.world_size > 1 and size != self.world_size:
            raise ValueError(f"flatmem.torch: world_size={self.world_size} but the communicator has "
                             f"{size} ranks")
        self.comm = comm

    @torch.compiler.disable  # collective set-up: eager (made at construction when the group exists)
    def _start_ring(self):
        self._use(dist_.communicator(timeout_ms=self.comm_timeout_ms))

    @torch.compiler.disable  # collective set-up of the NCCL transport, once
    def _start_device(self, features):
        self.comm.init_device(features.device.index if features.device.index is not None
                              else torch.cuda.current_device(), self.comm_timeout_ms)
        self._device_ready = True

    def _ring(self, features):
        if self.comm is None and self.world_size > 1:
            self._start_ring()
        if self.comm is not None and self._made_comm and features.is_cuda and not self._device_ready:
            # CUDA features: the communicator made here gets its NCCL transport on their GPU
            # (collective: every rank's first call comes here with its own CUDA features).
            self._start_device(features)
        return self.comm

    def _grad_scale(self, comm):
        # DDP averages parameter gradients over the ranks; the ring's feature gradients are those of
        # the global loss for this rank's rows, so N times them averages to the global gradient; the
        # scale / bias gradients are global on every rank already and stay unscaled (distributed.py).
        return float(dist_.world_size(comm))

    @staticmethod
    def _result(loss, output_dict):
        return {"contrastive_loss": loss} if output_dict else loss


class ClipLoss(_RingModule):
    """open_clip's ``ClipLoss``, tiled: ``ClipLoss()(image_features, text_features, logit_scale,
    logit_bias=None, output_dict=False)`` returns the symmetric CLIP loss (or
    ``{"contrastive_loss": loss}``), the same value as open_clip's on the same inputs, without the
    b x b logits (a logit_bias changes no softmax, so it is accepted and ignored).

    rank, world_size: as open_clip's; world_size > 1 runs flatmem's ring over a communicator made
    from the initialised default process group (or ``comm``), which gives the loss of the GLOBAL
    batch -- open_clip's ``gather_with_grad=True, local_loss=False`` -- and gradients that DDP's
    average turns into the global loss's (distributed.py). local_loss, gather_with_grad and
    cache_labels are accepted for compatibility and change nothing: flatmem always computes that
    global loss exactly, in O(b) memory. comm_timeout_ms: the deadline of each wait of the
    communicator made here (0 = $FLATMEM_COMM_TIMEOUT_MS or 60 s; raise it for very large batches).
    With CUDA features that communicator also gets its NCCL device transport on their GPU at the
    first call (a ``comm`` passed in must have had ``init_device`` called on it).
    logit_cache_bytes, nonfinite, precision: as clip_loss.
    """

    def __init__(self, local_loss=False, gather_with_grad=False, cache_labels=False, rank=0, world_size=1,
                 use_horovod=False, *, comm=None, comm_timeout_ms=0, logit_cache_bytes=0, nonfinite="propagate",
                 precision="default"):
        super().__init__(rank, world_size, use_horovod, comm, nonfinite, comm_timeout_ms, precision,
                         logit_cache_bytes)
        self.local_loss, self.gather_with_grad, self.cache_labels = local_loss, gather_with_grad, cache_labels
        self.logit_cache_bytes = self._options.logit_cache_bytes

    def forward(self, image_features, text_features, logit_scale, logit_bias=None, output_dict=False):
        comm = self._ring(image_features)
        options = self._options._replace(logit_cache_bytes=0) if comm is not None else self._options  # a ring keeps none
        loss = _softmax(image_features, text_features, logit_scale, None, True, comm, self._grad_scale(comm), options)
        if isinstance(logit_bias, torch.Tensor) and logit_bias.requires_grad:
            # A bias added to every logit leaves each softmax, hence the loss, unchanged; its
            # gradient is exactly 0, and it gets that 0 (as under open_clip), so that an optimiser
            # still sees it (AdamW's weight decay skips parameters without a gradient).
            loss = loss + (logit_bias * 0.0).sum().to(loss.dtype)
        return self._result(loss, output_dict)


class SigLipLoss(_RingModule):
    """open_clip's ``SigLipLoss``, tiled: ``SigLipLoss()(image_features, text_features, logit_scale,
    logit_bias, output_dict=False)`` returns -sum(log sigmoid(z * logits)) / b (or
    ``{"contrastive_loss": loss}``), open_clip's value on the same inputs, without the b x b logits.

    rank, world_size: as ClipLoss (the ring over the global batch: every image against every
    text of every rank, the mean over all images -- what open_clip's neighbour exchange sums, as
    DDP averages it; the value returned is that global mean, where open_clip returns this rank's
    sum over its own images). cache_labels and dist_impl are accepted for compatibility and change
    nothing. comm_timeout_ms: as ClipLoss. recompute, nonfinite, precision: as sigmoid_loss.
    """

    def __init__(self, cache_labels=False, rank=0, world_size=1, dist_impl=None, *, comm=None, comm_timeout_ms=0,
                 recompute=False, nonfinite="propagate", precision="default"):
        super().__init__(rank, world_size, False, comm, nonfinite, comm_timeout_ms, precision)
        self.cache_labels, self.dist_impl = cache_labels, dist_impl
        self.recompute = bool(recompute)

    def forward(self, image_features, text_features, logit_scale, logit_bias, output_dict=False):
        comm = self._ring(image_features)
        loss = _sigmoid(image_features, text_features, logit_scale, logit_bias, None, self.recompute, comm,
                        self._grad_scale(comm), self._options)
        return self._result(loss, output_dict)
