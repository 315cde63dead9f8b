"""flatmem for PyTorch: the tiled contrastive losses as torch custom operators, open_clip-compatible
loss modules, flatmem communicators from torch.distributed, and reversible segments over nn.Modules.

    import flatmem.torch as fmt
    loss = fmt.clip_loss(image_features, text_features, logit_scale.exp())   # CLIP, O(b) memory
    loss = fmt.sigmoid_loss(img, txt, logit_scale.exp(), logit_bias)       # SigLIP
    criterion = fmt.ClipLoss()        # open_clip.loss.ClipLoss's signature: swap one import
    comm = fmt.communicator()         # the ring across the ranks of torch.distributed's default group
    loss = fmt.clip_loss(q_r, k_r, s, comm=comm)                             # loss of the global batch
    seq = fmt.ReversibleSequence([(F1, G1), (F2, G2)], mode="auto")          # nn.Modules, O(1) activations
    y1, y2 = seq(x1, x2)
    model = fmt.ReversibleTransformer(width=384, heads=6, depth=12)           # flatmem's built-in blocks
    cdp = fmt.CyclicDataParallel(fmt.split_sequential(net, 4), opt, loss_fn, comm, steps=S)
    loss = cdp.step(inputs, target)   # cyclic data parallelism: staggered ranks, per-stage reduce chains

``import flatmem`` does not need torch; ``import flatmem.torch`` does. The losses are documented in
flatmem.torch.losses, the communicators (and the gradient convention under DDP) in
flatmem.torch.distributed, the reversible segments in flatmem.torch.reversible and
flatmem.torch.transformer, cyclic data parallelism in flatmem.torch.cyclic (data-parallel ranks) and
flatmem.torch.cyclic_stages (one rank per stage).
"""
try:
    import torch as _torch
except ImportError as e:  # pragma: no cover - exercised by a test that hides torch
    raise ImportError("flatmem.torch needs PyTorch (pip install torch); the rest of flatmem works without "
                      "it") from e

from .cyclic import CyclicDataParallel
from .cyclic_stages import CyclicStageParallel
from ._stages import split_sequential
from .distributed import communicator, communicator_from_env
from .losses import ClipLoss, SigLipLoss, clip_loss, infonce_loss, sigmoid_loss
from .reversible import ReversibleSequence
from .transformer import ReversibleTransformer

__all__ = ["ClipLoss", "CyclicDataParallel", "CyclicStageParallel", "ReversibleSequence", "ReversibleTransformer", "SigLipLoss", "clip_loss", "communicator",
           "communicator_from_env", "infonce_loss", "sigmoid_loss", "split_sequential"]
del _torch
