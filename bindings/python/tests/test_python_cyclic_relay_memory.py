"""The ZeRO relay's device calls without a device: set_shard(..., stream=)
and parameters(..., stream=) over flatmem_cyclic_set_shard_stream /
_parameters_stream. On a host relayed handle a kDLCUDA __dlpack__ shard or
full is refused naming options.memory (nothing registered or written; the
producer was asked for the call's DLPack stream); a __dlpack__ shard stays
referenced, with its capsule, while registered (the library reads it inside
next(), as it would a device shard); a training run through the stream
calls equals the plain one bitwise. The create-time shape rule (N <= 2L) is
in test_python_cyclic_memory.py. No CUDA runs on the CI machines."""
import gc
import weakref

import numpy as np
import pytest
from python_stage_mlp import StageMlp, train_relayed
from python_support import raises_flatmem
from test_python_comm import local_group, run_threads  # noqa: F401 (fixture)
from test_python_cyclic_memory import FakeCudaGradient
from test_python_cyclic_relay import LR, STEPS, check_rank, both

import flatmem
from flatmem import capi

ON_HOST = "options.memory = HOST takes kDLCPU tensors"


def relayed(comm, n, steps=1):
    return flatmem.Cyclic(comm, stages=1, steps=steps, parameters="relayed", parameter_count=[n])


def refused(call, name, fake):
    """call(fake) and call(fake, stream=) are refused naming `name` and options.memory."""
    for stream in (None, 0x5000):
        with raises_flatmem(flatmem.InvalidArgumentError, capi.STATUS_INVALID_ARGUMENT, f"{name}: device type 2",
                            ON_HOST):
            call(fake, stream=stream)
    assert fake.streams[-2:] == [1, 0x5000]  # DLPack's legacy default stream is 1


def test_device_shard_and_full_on_a_host_handle_are_refused_naming_the_option(local_group):
    """One rank, one stage of 3 elements: a kDLCUDA shard is not registered
    (shard(0) stays None, and next() still wants one), a kDLCUDA full is not
    served (the NumPy call after it is); the values are then the shard's."""
    comm = local_group(1)[0]
    with relayed(comm, 3) as cyc:
        refused(lambda t, stream: cyc.set_shard(0, t, stream=stream), "shard", FakeCudaGradient(3))
        assert cyc.shard(0) is None and not cyc._shards
        with raises_flatmem(flatmem.InvalidArgumentError, capi.STATUS_INVALID_ARGUMENT):
            cyc.next()  # no stage registered
        shard = np.array([0.5, -1.0, 2.0])
        cyc.set_shard(0, shard, stream=0x6000)
        assert cyc.shard(0) is shard
        assert cyc.next().kind == "forward"
        fake = FakeCudaGradient(3)
        refused(lambda t, stream: cyc.parameters(t, stream=stream), "full", fake)
        assert np.array_equal(fake.host, np.ones(3))  # not written
        np.testing.assert_array_equal(cyc.parameters(np.zeros(3), stream=0x7000), shard)


class _DLPackOnly:
    """A kDLCPU producer that is not a NumPy array (as a CPU torch tensor)."""

    def __init__(self, array):
        self.array = array

    def __dlpack__(self, stream=None):
        return self.array.__dlpack__()

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


@pytest.mark.parametrize("stream", [None, 0x5000])
def test_a_dlpack_shard_stays_referenced_while_registered(local_group, stream):
    """The library keeps reading a registered shard, so the handle keeps a
    __dlpack__ shard (as a device one would be) and its capsule until it is
    registered again or the handle is closed, as it keeps a NumPy shard."""
    comm = local_group(1)[0]
    with relayed(comm, 3) as cyc:
        producer = _DLPackOnly(np.array([1.0, 2.0, 3.0]))
        gone = weakref.ref(producer)
        cyc.set_shard(0, producer, stream=stream)
        del producer
        gc.collect()
        assert gone() is not None and cyc.shard(0) is gone()
        assert cyc.next().kind == "forward"
        np.testing.assert_array_equal(cyc.parameters(np.empty(3)), [1.0, 2.0, 3.0])
        replacement = np.array([4.0, 5.0, 6.0])
        cyc.set_shard(0, replacement)  # between actions: the first shard is released
        gc.collect()
        assert gone() is None and cyc.shard(0) is replacement
        producer = _DLPackOnly(np.zeros(3))
        gone = weakref.ref(producer)
        cyc.set_shard(0, producer, stream=stream)
        del producer
    gc.collect()
    assert gone() is None  # close() released it


class WithStreams:
    """A relayed Cyclic whose set_shard, parameters and reduce go through the
    *_stream entry points, each with its own made-up stream (ignored on the
    host; 0 is the legacy default stream, as None)."""

    def __init__(self, handle):
        self._h = handle

    def __getattr__(self, name):
        return getattr(self._h, name)

    def set_shard(self, stage, shard):
        self._h.set_shard(stage, shard, stream=0x1000 + stage)

    def parameters(self, full):
        return self._h.parameters(full, stream=0)

    def reduce(self, stage, gradient):
        self._h.reduce(stage, gradient, stream=0x3000)


@pytest.mark.parametrize("widths, rows, dtype, world", [([3, 5, 4, 2], 3, "float64", 3),
                                                         ([3, 1, 1], 2, "float32", 3)])
def test_host_relay_through_the_stream_calls_equals_the_plain_calls(local_group, widths, rows, dtype, world):
    """The same MLP trained relayed through the *_stream calls and through
    the plain ones: the shards and the relay's byte counts are equal, the
    shards bitwise, and both equal the replicated training's ranges."""
    mlp = StageMlp(widths, rows, seed=7, dtype=dtype)
    plain = run_threads(local_group(world), lambda c, _: both(c, mlp))
    streamed = run_threads(local_group(world),
                           lambda c, _: train_relayed(c, mlp, STEPS, LR, calls=WithStreams))
    for rank in range(world):
        check_rank(plain[rank], mlp, rank, world)
        for j in range(mlp.stages):
            got, want = streamed[rank]["shards"][j], plain[rank]["relayed"]["shards"][j]
            assert got.dtype == want.dtype and np.array_equal(got.view(np.uint8), want.view(np.uint8)), (rank, j)
        # Everything but the measured peak (timing) is the protocol's.
        assert (streamed[rank]["summary"]._replace(peak_parameter_bytes=0)
                == plain[rank]["relayed"]["summary"]._replace(peak_parameter_bytes=0))
        assert ([s.relay_bytes_sent for s in streamed[rank]["stats"]]
                == [s.relay_bytes_sent for s in plain[rank]["relayed"]["stats"]])
