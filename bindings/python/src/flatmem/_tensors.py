"""Arrays as the C API sees them: NumPy arrays and ``__dlpack__`` objects
turned into ``capi.Tensor`` (a DLTensor plus its shape and strides), and
NumPy outputs allocated for results.

* NumPy arrays (including ml_dtypes.bfloat16 ones) are described directly:
  data pointer, dtype code/bits, shape, and strides converted from bytes to
  elements (NULL strides when the array is C-contiguous). No copy.
* Any other object with ``__dlpack__`` (JAX, PyTorch, CuPy, ...) is asked for
  its capsule; ``capi.tensor_from_dlpack`` copies the DLTensor fields. The
  capsule and the object stay referenced by the Arg for as long as the C call
  may read them; the capsule is never consumed, so its own destructor calls
  the producer's deleter. No copy.
* Anything else goes through ``numpy.asarray``.

Nothing here judges dtypes, shapes or strides: the library does, and its
messages name the argument.
"""
from __future__ import annotations

import numbers

import numpy as np

from . import capi

try:
    import ml_dtypes

    BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - ml_dtypes is a dependency
    BFLOAT16 = None

_KIND_TO_CODE = {"f": capi.kDLFloat, "i": capi.kDLInt, "u": capi.kDLUInt, "c": capi.kDLComplex}


class Arg:
    """One tensor argument: the capi.Tensor, the objects that keep its memory
    alive, and its NumPy dtype (None when NumPy has no equivalent)."""

    __slots__ = ("tensor", "keepalive", "dtype")

    def __init__(self, tensor, keepalive, dtype):
        self.tensor = tensor
        self.keepalive = keepalive
        self.dtype = dtype

    @property
    def shape(self):
        t = self.tensor
        return tuple(t.shape(i) for i in range(t.ndim()))

    @property
    def ndim(self):
        return self.tensor.ndim()

    def extent(self, dim, default=1):
        """shape[dim], or `default` when the tensor has fewer dimensions
        (the library reports the bad ndim itself)."""
        return self.tensor.shape(dim) if dim < self.tensor.ndim() else default


def dlpack_dtype(dtype, name):
    """(code, bits) of a NumPy dtype in DLPack terms."""
    dtype = np.dtype(dtype)
    if BFLOAT16 is not None and dtype == BFLOAT16:
        return capi.kDLBfloat, 16
    code = _KIND_TO_CODE.get(dtype.kind)
    if code is None:
        raise TypeError(f"{name}: NumPy dtype {dtype} has no DLPack equivalent flatmem can take")
    return code, dtype.itemsize * 8


def numpy_dtype(code, bits):
    """The NumPy dtype of a DLPack (code, bits), or None."""
    if code == capi.kDLBfloat and bits == 16:
        return BFLOAT16
    kind = {capi.kDLFloat: "f", capi.kDLInt: "i", capi.kDLUInt: "u", capi.kDLComplex: "c"}.get(code)
    if kind is None or bits % 8:
        return None
    try:
        return np.dtype(f"{kind}{bits // 8}")
    except TypeError:
        return None


def from_array(a, name):
    """Describe a NumPy array (no copy)."""
    if not a.dtype.isnative:
        raise TypeError(f"{name}: byte order '{a.dtype.byteorder}' is not this machine's")
    code, bits = dlpack_dtype(a.dtype, name)
    t = capi.Tensor(a.__array_interface__["data"][0], a.ndim, code, bits)
    for i, n in enumerate(a.shape):
        t.set_shape(i, n)
    if not a.flags.c_contiguous:
        for i, s in enumerate(a.strides):
            if s % a.itemsize:
                raise ValueError(
                    f"{name}: stride {s} bytes in dimension {i} is not a multiple of the "
                    f"{a.itemsize}-byte element"
                )
            t.set_stride(i, s // a.itemsize)
    return Arg(t, a, a.dtype)


def from_dlpack(obj, name, stream=None):
    """Describe an object with __dlpack__ (no copy). stream: None, or the
    consumer's stream as the DLPack protocol passes it to __dlpack__(stream=)
    (for CUDA: 1 = the legacy default stream, > 2 a cudaStream_t), so that
    the producer makes its data ready for that stream."""
    capsule = obj.__dlpack__() if stream is None else obj.__dlpack__(stream=stream)
    t = capi.tensor_from_dlpack(capsule)
    return Arg(t, (obj, capsule), numpy_dtype(t.dtype_code(), t.dtype_bits()))


# kDLCUDA, kDLCUDAManaged: their __dlpack__ takes the consumer's stream.
_DLPACK_CUDA_DEVICES = (capi.kDLCUDA, 13)


def from_dlpack_for_stream(obj, name, stream):
    """from_dlpack for a call that takes a cudaStream_t (`stream`: an int, or
    None = the legacy default stream): a producer on a CUDA device is asked
    for its capsule with the DLPack spelling of that stream (the legacy
    default stream is 1 there: 0 is ambiguous), so that its data is ready for
    the work the call enqueues on it; any other producer is asked without."""
    on_cuda = hasattr(obj, "__dlpack_device__") and obj.__dlpack_device__()[0] in _DLPACK_CUDA_DEVICES
    return from_dlpack(obj, name, (stream or 1) if on_cuda else None)


def as_stream_arg(obj, name, stream):
    """An input of a call with a cudaStream_t: a NumPy array (as as_arg), or
    a __dlpack__ object (from_dlpack_for_stream). Whether its device suits
    the handle is the library's call (its message names options.memory)."""
    if isinstance(obj, np.ndarray):
        return from_array(obj, name)
    if not hasattr(obj, "__dlpack__"):
        raise TypeError(f"{name}: expected a NumPy array or an object with __dlpack__, not {type(obj).__name__}")
    return from_dlpack_for_stream(obj, name, stream)


def as_stream_output(obj, name, stream):
    """An output of a call with a cudaStream_t: a writable NumPy array (as
    as_output), or a __dlpack__ object the library writes through
    (from_dlpack_for_stream)."""
    if isinstance(obj, np.ndarray):
        return as_output(obj, name)
    if not hasattr(obj, "__dlpack__"):
        raise TypeError(f"{name}: an output must be a NumPy array or an object with __dlpack__, not "
                        f"{type(obj).__name__}")
    return from_dlpack_for_stream(obj, name, stream)


def as_arg(obj, name):
    """Any accepted input as an Arg (None stays None: the C API's NULL)."""
    if obj is None or isinstance(obj, Arg):
        return obj
    if isinstance(obj, np.ndarray):
        return from_array(obj, name)
    if hasattr(obj, "__dlpack__"):
        return from_dlpack(obj, name)
    return from_array(np.asarray(obj), name)


def as_scalar_arg(obj, name):
    """A one-element fp32 argument (logit_scale, dloss): Python and NumPy
    numbers are converted to float32; __dlpack__ objects are passed as they are."""
    if obj is None or isinstance(obj, Arg):
        return obj
    if isinstance(obj, (numbers.Number, np.ndarray, np.generic)):
        a = np.asarray(obj)
        if a.dtype != np.float32 and a.dtype.kind in "fiub":
            a = a.astype(np.float32)
        return from_array(a, name)
    return as_arg(obj, name)


def output(shape, dtype, name):
    """A new NumPy array for the library to write, and its Arg."""
    a = np.empty(shape, dtype=dtype)
    return a, from_array(a, name)


def as_output(a, name):
    """A caller-provided NumPy array for the library to write into."""
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{name}: an output must be a NumPy array, not {type(a).__name__}")
    if not a.flags.writeable:
        raise ValueError(f"{name}: the output array is read-only")
    return from_array(a, name)


def as_workspace(ws, name="workspace"):
    """A caller workspace: a writable C-contiguous NumPy array (any dtype)."""
    if ws is None:
        return None
    if not isinstance(ws, np.ndarray) or not ws.flags.c_contiguous or not ws.flags.writeable:
        raise ValueError(f"{name}: expected a writable C-contiguous NumPy array (e.g. np.empty(n, np.uint8))")
    flat = ws.reshape(-1).view(np.uint8)
    return from_array(flat, name)
