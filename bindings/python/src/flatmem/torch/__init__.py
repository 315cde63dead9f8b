"""flatmem for PyTorch: the tiled contrastive losses as torch custom operators, open_clip-compatible
loss modules, flatmem communicators from torch.distributed, and reversible segments over nn.Modules.

    import flatmem.torch as fmt
    loss = fmt.clip_loss(image_features, text_features, logit_scale.exp())   # CLIP, O(b) memory
    loss = fmt.sigmoid_loss(img, txt, logit_scale.exp(), logit_bias)       # SigLIP
    criterion = fmt.ClipLoss()        # open_clip.loss.ClipLoss's signature: swap one import
    comm = fmt.communicator()         # the ring across the ranks of torch.distributed's default group
    loss = fmt.clip_loss(q_r, k_r, s, comm=comm)                             # loss of the global batch

``import flatmem`` does not need torch; ``import flatmem.torch`` does. The losses are documented in
flatmem.torch.losses, the communicators (and the gradient convention under DDP) in
flatmem.torch.distributed.
"""
try:
    import torch as _torch
except ImportError as e:  # pragma: no cover - exercised by a test that hides torch
    raise ImportError("flatmem.torch needs PyTorch (pip install torch); the rest of flatmem works without "
                      "it") from e

from .distributed import communicator, communicator_from_env
from .losses import ClipLoss, SigLipLoss, clip_loss, infonce_loss, sigmoid_loss

__all__ = ["ClipLoss", "SigLipLoss", "clip_loss", "communicator", "communicator_from_env", "infonce_loss",
           "sigmoid_loss"]
del _torch
