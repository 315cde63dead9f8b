"""flatmem for JAX (the tiled contrastive loss, reversible segments): the functions of the flatmem_jax
package (bindings/jax, XLA FFI custom calls), under the flatmem name.

    import jax, flatmem.jax
    loss = flatmem.jax.clip_loss(q, k, logit_scale)                   # symmetric CLIP
    loss = flatmem.jax.infonce_loss(q, k, logit_scale, labels=None)   # InfoNCE
    grads = jax.grad(flatmem.jax.clip_loss, argnums=(0, 1, 2))(q, k, logit_scale)
    y1, y2 = flatmem.jax.reversible_transformer(x1, x2, params, heads=4)  # reversible segment
    comm = flatmem.jax.ring.initialize()       # one process per rank; then clip_loss(..., comm=comm)

These are flatmem_jax's own objects (see help(flatmem_jax)): the XLA FFI plugin
libflatmem_jax.so and its Python side, which the flatmem wheel (`pip install .`
at the repository root) ships beside this package, linked to the wheel's own
libflatmem.

`import flatmem` alone never imports jax; only this module does.
"""
try:
    import flatmem_jax as _flatmem_jax
except ModuleNotFoundError as _e:
    if (_e.name or "").split(".")[0] not in ("flatmem_jax", "jax", "jaxlib"):
        raise
    raise ImportError(
        f"flatmem.jax needs jax and the flatmem_jax package (flatmem's JAX plugin), but "
        f"{_e.name!r} is not installed. Install jax (pip install 'jax>=0.7'); the flatmem wheel "
        "holds flatmem_jax when jaxlib was importable where it was built (pip install . gets "
        "jaxlib for its build by itself; a build with --no-build-isolation needs it in the "
        "environment, and says so in a CMake warning when it is missing)",
        name=__name__,
    ) from _e

from flatmem_jax import (FlatmemError, RingComm, clip_loss, has_cuda, infonce_loss,
                         reversible_transformer, ring, sigmoid_loss)

__all__ = ["clip_loss", "infonce_loss", "sigmoid_loss", "reversible_transformer", "FlatmemError",
           "has_cuda", "RingComm", "ring"]
