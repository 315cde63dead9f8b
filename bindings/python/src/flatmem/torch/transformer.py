"""flatmem's built-in reversible transformer blocks as a torch module with nn.Parameters.

    model = flatmem.torch.ReversibleTransformer(width=384, heads=6, depth=12)
    y1, y2 = model(x1, x2)        # x1, x2: (batch, tokens, width) float32, CPU or one CUDA device

Block k: F_k = pre-LayerNorm multi-head self-attention, G_k = pre-LayerNorm MLP with exact GELU
(include/flatmem/reversible.h has the formulas), y1 = x1 + F_k(x2), y2 = x2 + G_k(y1). Everything
runs inside flatmem (no Python per block; the GIL is released), on the CPU or, for CUDA tensors,
on torch's current stream with a workspace from torch's allocator (cuBLASLt products; ``math``
"tf32" uses TF32 tensor cores there). The forward keeps only (y1, y2); the backward rebuilds
(mode "auto", "vanilla", "overlapped" or "standard", as ReversibleSequence).

Parameters (per block, in reversible.h's order, weights stored (in, out): y = x W + b):
``blocks[k].attention`` = ln_weight (w,), ln_bias (w,), qkv_weight (w, 3w), qkv_bias (3w,),
proj_weight (w, w), proj_bias (w,); ``blocks[k].mlp`` = ln_weight, ln_bias, fc1_weight (w, h),
fc1_bias (h,), fc2_weight (h, w), fc2_bias (w,). Initialised as ViT does (LayerNorm 1 and 0,
weights N(0, 0.02^2), biases 0). Their gradients reach ``.grad`` through autograd as for any
module (the flatmem blocks accumulate into buffers this module hands back to the engine).
"""
from __future__ import annotations

import torch

from .. import reversible as _rev
from . import _bridge as br
from .reversible import _run_segment, _SegmentOwner

ATTENTION_NAMES = ("ln_weight", "ln_bias", "qkv_weight", "qkv_bias", "proj_weight", "proj_bias")
MLP_NAMES = ("ln_weight", "ln_bias", "fc1_weight", "fc1_bias", "fc2_weight", "fc2_bias")


class _BlockParameters(torch.nn.Module):
    """The six parameters of one built-in block, named as reversible.h orders them."""

    def __init__(self, names, shapes):
        super().__init__()
        self.names = names
        for name, shape in zip(names, shapes):
            if name == "ln_weight":
                value = torch.ones(shape)
            elif name.endswith("weight"):
                value = torch.randn(shape) * 0.02
            else:
                value = torch.zeros(shape)
            self.register_parameter(name, torch.nn.Parameter(value))

    def ordered(self):
        return [getattr(self, name) for name in self.names]


class _Pair(torch.nn.Module):
    def __init__(self, attention, mlp):
        super().__init__()
        self.attention, self.mlp = attention, mlp


class ReversibleTransformer(_SegmentOwner):
    """depth reversible blocks of flatmem's built-in attention (F) and MLP (G) (module docstring).

    width, heads   width % heads == 0
    depth          number of (F, G) blocks
    hidden         the MLP's width (0 = 4 * width)
    eps            the LayerNorms' epsilon
    mode           "auto", "vanilla", "overlapped" or "standard"
    math           "fp32" or "tf32" (CUDA tensor cores; the CPU computes fp32 either way)
    num_threads    flatmem's CPU threads (0 = torch.get_num_threads() when the module is made)
    """

    def __init__(self, width, heads, depth, hidden=0, eps=1e-6, mode="auto", math="fp32", num_threads=0):
        super().__init__()
        self._flatmem_blocks = [(_rev.Block("attention", width, heads=heads, eps=eps, math=math),
                                 _rev.Block("mlp", width, hidden=hidden, eps=eps, math=math)) for _ in range(depth)]
        attention0, mlp0 = self._flatmem_blocks[0]
        self.blocks = torch.nn.ModuleList(
            _Pair(_BlockParameters(ATTENTION_NAMES, attention0.parameter_shapes),
                  _BlockParameters(MLP_NAMES, mlp0.parameter_shapes)) for _ in range(depth))
        self.width, self.heads, self.depth, self.hidden = width, heads, depth, mlp0.hidden
        self.eps, self.mode, self.math, self.num_threads = eps, mode, math, num_threads
        self._segment = _rev.ReversibleSegment(self._flatmem_blocks, mode=mode,
                                               num_threads=num_threads or torch.get_num_threads())

    def _point_blocks(self, device, gradients):
        """Points every flatmem block at this module's parameter tensors (and at gradient buffers,
        when given): no copy; repeated each call, since parameters may have been moved or replaced."""
        for k, (pair, (attention, mlp)) in enumerate(zip(self.blocks, self._flatmem_blocks)):
            for block, params, offset in ((attention, pair.attention, 0), (mlp, pair.mlp, 6)):
                tensors = [p.detach() for p in params.ordered()]
                for t in tensors:
                    if t.device != device:
                        raise ValueError(f"flatmem.torch.ReversibleTransformer: block {k}'s parameters are on "
                                         f"{t.device}, the states on {device}")
                grads = None if gradients is None else gradients[12 * k + offset:12 * k + offset + 6]
                block.set_parameters(tensors, grads)

    @staticmethod
    def _states(x1, x2):
        for name, x in (("x1", x1), ("x2", x2)):
            if not isinstance(x, torch.Tensor):
                raise TypeError(f"flatmem.torch.ReversibleTransformer: {name} must be a torch.Tensor")
        return x1.detach().contiguous(), x2.detach().contiguous()

    def _workspace(self, h, state, backward, stream):
        if state.device.type != "cuda":
            return None
        a = br.arg(state, "x", stream)
        nbytes = h.backward_workspace_size(a.tensor) if backward else h.forward_workspace_size(a.tensor)
        return br.workspace(nbytes, state.device, stream)

    def _run_forward(self, x1, x2, seed, call):
        x1, x2 = self._states(x1, x2)
        stream = br.stream_of(x1.device)
        self._point_blocks(x1.device, None)
        y1, y2 = torch.empty_like(x1), torch.empty_like(x2)
        a = [br.arg(t, n, stream) for t, n in ((x1, "x1"), (x2, "x2"), (y1, "y1"), (y2, "y2"))]
        with self._segment._call() as h:
            ws = self._workspace(h, x1, False, stream)
            h.forward(a[0].tensor, a[1].tensor, seed, 0, a[2].tensor, a[3].tensor, ws and ws.tensor, stream)
        return y1, y2

    def _run_backward(self, y1, y2, dy1, dy2, seed, call):
        dy1, dy2 = self._states(dy1, dy2)
        stream = br.stream_of(y1.device)
        parameters = [p for pair in self.blocks for part in (pair.attention, pair.mlp) for p in part.ordered()]
        gradients = [torch.zeros_like(p) for p in parameters]  # the blocks accumulate into these
        self._point_blocks(y1.device, gradients)
        dx1, dx2 = torch.empty_like(y1), torch.empty_like(y2)
        names = ((y1, "y1"), (y2, "y2"), (dy1, "dy1"), (dy2, "dy2"), (dx1, "dx1"), (dx2, "dx2"))
        a = [br.arg(t, n, stream) for t, n in names]
        with self._segment._call() as h:
            ws = self._workspace(h, y1, True, stream)
            h.backward(a[0].tensor, a[1].tensor, a[2].tensor, a[3].tensor, seed, 0, a[4].tensor, a[5].tensor,
                       None, None, ws and ws.tensor, stream)
        return dx1, dx2, gradients, []  # autograd drops those of parameters that want none

    @property
    def last_mode(self):
        return self._segment.last_mode

    def forward(self, x1, x2):
        self._states(x1, x2)
        parameters = [p for pair in self.blocks for part in (pair.attention, pair.mlp) for p in part.ordered()]
        # the built-in blocks draw no random numbers: seed 0
        return _run_segment(self, torch.zeros(1, dtype=torch.int64), x1, x2, parameters)
