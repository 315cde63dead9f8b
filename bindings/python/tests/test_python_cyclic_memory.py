"""Cyclic(..., memory=) and reduce(..., stream=): the option's mapping, the
library's refusals (a device handle without the device transport, a gradient
of the other kind than the handle's memory), the DLPack stream handed to a
CUDA producer, and host gradients through flatmem_cyclic_reduce_stream
against the average computed here. No CUDA runs on the CI machines: the test
that needs a device handle skips, saying why, when init_device fails."""
import ctypes

import numpy as np
import pytest
from python_support import raises_flatmem
from test_python_comm import local_group, run_threads  # noqa: F401 (fixture)

import flatmem
from flatmem import capi

INVALID = capi.STATUS_INVALID_ARGUMENT
WITHOUT_NCCL = "built without NCCL"


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _Device), ("ndim", ctypes.c_int32),
                ("dtype", _DataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _Managed(ctypes.Structure):
    _fields_ = [("dl_tensor", _Tensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_DLTENSOR = b"dltensor"  # the capsule keeps a pointer to its name


class FakeCudaGradient:
    """A __dlpack__ producer whose float64 vector claims to live on CUDA
    device 0 (its data is host memory, which no host handle reads: the
    library refuses the kind first). Records the stream each __dlpack__ call
    was given."""

    def __init__(self, n):
        self.host = np.ones(n)
        self.shape = (ctypes.c_int64 * 1)(n)
        self.managed = _Managed()
        t = self.managed.dl_tensor
        t.data = self.host.ctypes.data
        t.device = _Device(capi.kDLCUDA, 0)
        t.ndim = 1
        t.dtype = _DataType(capi.kDLFloat, 64, 1)
        t.shape = self.shape
        self.streams = []

    def __dlpack__(self, stream=None):
        self.streams.append(stream)
        return _capsule_new(ctypes.addressof(self.managed), _DLTENSOR, None)

    def __dlpack_device__(self):
        return (capi.kDLCUDA, 0)


def nccl_built():
    """Whether this libflatmem has the NCCL transport, as the library says it
    (init_device's UNSUPPORTED message on a one-rank group)."""
    comm = flatmem.Communicator.create_local(1, timeout_ms=5000)[0]
    try:
        comm.init_device(0)
    except flatmem.UnsupportedError as e:
        return WITHOUT_NCCL not in str(e)
    except flatmem.InvalidArgumentError:  # no device 0, but NCCL is there
        return True
    finally:
        comm.close()
    return True


def to_backward(cyc):
    """next() until the first backward; returns its action."""
    while (a := cyc.next()).kind != "backward":
        assert a.kind != "done"
    return a


# The memory option of both cyclic handles: the capi class each wraps, and a
# constructor for a communicator (one rank per stage for CyclicStages).
HANDLES = {
    "Cyclic": lambda comm, **kw: flatmem.Cyclic(comm, stages=1, steps=1, **kw),
    "CyclicStages": lambda comm, **kw: flatmem.CyclicStages(
        comm, micro_batches=1, steps=1, boundary_bytes=[8] * (comm._raw.world_size() - 1), **kw),
}
handle_kinds = pytest.mark.parametrize("kind", sorted(HANDLES))


def test_memory_enum_values_are_the_headers():
    assert (capi.CYCLIC_MEMORY_HOST, capi.CYCLIC_MEMORY_CUDA) == (0, 1)  # cyclic.h


@handle_kinds
def test_memory_option_maps_to_the_c_enum(monkeypatch, kind):
    seen = []

    class Recording:
        def __init__(self, *args):
            seen.append(args[-1])  # memory: the last argument of the capi class
            raise RuntimeError("recorded")

    monkeypatch.setattr(capi, kind, Recording)
    make = HANDLES[kind]
    comm = flatmem.Communicator.create_local(1)[0]
    try:
        for memory in ("host", "cuda", "CUDA", "Host", 0, 1, 7):
            with pytest.raises(RuntimeError, match="recorded"):
                make(comm, memory=memory)
        with pytest.raises(RuntimeError, match="recorded"):
            make(comm)
        with pytest.raises(ValueError, match=r"memory: 'gpu' is not one of \['cuda', 'host'\]"):
            make(comm, memory="gpu")
    finally:
        comm.close()
    assert seen == [0, 1, 1, 0, 0, 1, 7, 0]


@handle_kinds
def test_unknown_memory_value_is_the_librarys_error(local_group, kind):
    comm = local_group(1)[0]
    with raises_flatmem(flatmem.InvalidArgumentError, INVALID, "options.memory: 7",
                        "FLATMEM_CYCLIC_MEMORY_HOST (0)", "FLATMEM_CYCLIC_MEMORY_CUDA (1)"):
        HANDLES[kind](comm, memory=7)


@handle_kinds
def test_cuda_memory_needs_the_device_transport(local_group, kind):
    """Without init_device every rank refuses, naming options.memory and the
    first rank without a device transport; a build without NCCL refuses with
    UNSUPPORTED at once. Either way the communicator is still usable."""
    comms = local_group(2, timeout_ms=5000)
    built = nccl_built()

    def job(comm, _):
        if built:
            with raises_flatmem(flatmem.InvalidArgumentError, INVALID, "options.memory: CUDA",
                                "rank 0 has no device transport", "flatmem_comm_init_device"):
                HANDLES[kind](comm, memory="cuda")
        else:
            with raises_flatmem(flatmem.UnsupportedError, capi.STATUS_UNSUPPORTED, "options.memory: CUDA",
                                WITHOUT_NCCL):
                HANDLES[kind](comm, memory="cuda")
        comm.barrier()
        return comm._raw.users()

    assert run_threads(comms, job) == [0, 0]


@handle_kinds
def test_ranks_that_differ_in_memory_are_named(local_group, kind):
    if not nccl_built():
        pytest.skip("this flatmem has no NCCL: memory='cuda' is refused before the ranks compare options")
    comms = local_group(2, timeout_ms=5000)

    def job(comm, _):
        with raises_flatmem(flatmem.InvalidArgumentError, INVALID, "options.memory: rank 1 passes CUDA, rank 0 HOST"):
            HANDLES[kind](comm, memory="cuda" if comm.rank else "host")

    run_threads(comms, job)


def test_cuda_memory_with_the_relay_needs_n_at_most_2l(local_group):
    """memory="cuda" with "relayed" parameters: N = 3 ranks over L = 1 stage
    (N > 2L) is UNSUPPORTED on every rank at once, naming the shape; N = 1
    passes that check and stops at the missing device transport. A build
    without NCCL refuses both with UNSUPPORTED, saying so."""
    built = nccl_built()
    relayed = {"stages": 1, "steps": 1, "parameters": "relayed", "parameter_count": [4], "memory": "cuda"}
    for comm in local_group(3, timeout_ms=5000):  # refused before any rank is contacted
        with raises_flatmem(flatmem.UnsupportedError, capi.STATUS_UNSUPPORTED, "options.memory: CUDA",
                            "N <= 2L" if built else WITHOUT_NCCL):
            flatmem.Cyclic(comm, **relayed)
    comm = local_group(1)[0]
    if built:
        with raises_flatmem(flatmem.InvalidArgumentError, INVALID, "options.memory: CUDA", "no device transport"):
            flatmem.Cyclic(comm, **relayed)
    else:
        with raises_flatmem(flatmem.UnsupportedError, capi.STATUS_UNSUPPORTED, "options.memory: CUDA",
                            WITHOUT_NCCL):
            flatmem.Cyclic(comm, **relayed)


def test_device_gradient_on_a_host_handle_is_refused_naming_the_option(local_group):
    """A kDLCUDA __dlpack__ gradient reaches the library, which refuses it
    (nothing is held, the time step does not move on); the producer was asked
    for the DLPack stream of the call. Then a NumPy gradient is taken."""
    comm = local_group(1)[0]
    fake = FakeCudaGradient(3)
    with flatmem.Cyclic(comm, stages=1, steps=1) as cyc:
        to_backward(cyc)
        with raises_flatmem(flatmem.InvalidArgumentError, INVALID, "gradient: device type 2",
                            "options.memory = HOST takes kDLCPU gradients",
                            "options.memory = FLATMEM_CYCLIC_MEMORY_CUDA"):
            cyc.reduce(0, fake)
        with raises_flatmem(flatmem.InvalidArgumentError, INVALID, "options.memory = HOST takes kDLCPU"):
            cyc.reduce(0, fake, stream=0x5000)
        assert fake.streams == [1, 0x5000]  # DLPack's legacy default stream is 1
        assert not cyc._held
        g = np.array([0.5, -2.0, 3.0])
        cyc.reduce(0, g)
        assert list(cyc._held.values()) == [g]


def test_reduce_refuses_what_it_cannot_describe(local_group):
    comm = local_group(1)[0]
    with flatmem.Cyclic(comm, stages=1, steps=1) as cyc:
        to_backward(cyc)
        with pytest.raises(TypeError, match="gradient: expected a NumPy array or an object with __dlpack__, not list"):
            cyc.reduce(0, [1.0])
        with pytest.raises(TypeError, match="stream: expected an int, not str"):
            cyc.reduce(0, np.ones(2), stream="default")
        assert not cyc._held


@pytest.mark.parametrize("rule", ["delay1", "sync"])
def test_host_gradients_through_reduce_stream_average_as_reduce_does(local_group, rule):
    """On a host handle the stream is ignored: gradients handed over with a
    stream come back as ((g_0 + g_1) + g_2) / 3, computed here, over two steps."""
    comms = local_group(3, timeout_ms=5000)
    steps = 2
    grads = [[np.array([1.0 + r + 10 * s, -0.25 * r, 2.0 ** -(r + s)]) for s in range(steps)] for r in range(3)]

    def job(comm, _):
        r = comm.rank
        got = {}
        with flatmem.Cyclic(comm, stages=1, steps=steps, rule=rule) as cyc:
            buffers = {}
            while (a := cyc.next()).kind != "done":
                if a.update_stage is not None:
                    got[a.update_step] = buffers.pop(a.update_step).copy()
                if a.kind == "backward":
                    buffers[a.step] = grads[r][a.step].copy()
                    cyc.reduce(a.stage, buffers[a.step], stream=1000 + r if a.step == 0 else None)
        return got

    results = run_threads(comms, job)
    for s in range(steps):
        expected = ((grads[0][s] + grads[1][s]) + grads[2][s]) * (1.0 / 3.0)
        for r in range(3):
            if rule == "delay1":  # the chain's order, bitwise (cyclic.h)
                np.testing.assert_array_equal(results[r][s], expected)
            else:  # the ring all-reduce's order
                np.testing.assert_allclose(results[r][s], expected, rtol=1e-15, atol=0)


def test_numpy_gradient_on_a_cuda_handle_is_refused_naming_the_option(local_group):
    """Needs a device handle: CUDA, NCCL and device 0 (skips, with the
    library's reason, everywhere else)."""
    comm = local_group(1)[0]
    try:
        comm.init_device(0)
    except (flatmem.UnsupportedError, flatmem.InvalidArgumentError) as e:
        pytest.skip(f"no device transport here: {e}")
    with flatmem.Cyclic(comm, stages=1, steps=1, memory="cuda") as cyc:
        to_backward(cyc)
        with raises_flatmem(flatmem.InvalidArgumentError, INVALID, "options.memory = CUDA takes kDLCUDA"):
            cyc.reduce(0, np.ones(3))
        assert not cyc._held
