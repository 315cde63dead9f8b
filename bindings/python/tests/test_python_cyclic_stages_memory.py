"""CyclicStages(..., memory=) and send / receive / accumulate / average(...,
stream=): the option's mapping, the library's refusals (a device handle
without the device transport, a tensor of the other kind than the handle's
memory, in each of the four calls), the DLPack stream handed to a CUDA
producer, and a host training run through the flatmem_cyclic_stages_*_stream
calls against the same run through the plain calls and the NumPy simulation
(bitwise). No CUDA runs on the CI machines: nothing here needs a device."""
import numpy as np
import pytest
from python_stage_mlp import train_stage
from python_support import raises_flatmem
from test_python_comm import local_group, run_threads  # noqa: F401 (fixture)
from test_python_cyclic_memory import FakeCudaGradient
from test_python_cyclic_stages import LR, MLP_2, MLP_3, assert_bitwise, check_training, mlp_of

import flatmem
from flatmem import capi

INVALID = capi.STATUS_INVALID_ARGUMENT
ON_HOST = "options.memory = HOST takes kDLCPU tensors"


# The option mapping and the create-time refusals of both handles are in
# test_python_cyclic_memory.py (parametrized over Cyclic and CyclicStages).


def refuse_then_do(call, name, fake, real):
    """call(fake) and call(fake, stream=) are refused naming `name` and
    options.memory (nothing happens: the real call then succeeds); returns
    call(real)."""
    for stream in (None, 0x5000):
        with raises_flatmem(flatmem.InvalidArgumentError, INVALID, f"{name}: device type 2", ON_HOST,
                            "options.memory = FLATMEM_CYCLIC_MEMORY_CUDA"):
            call(fake, stream=stream)
    return call(real)


def test_device_tensors_on_a_host_handle_are_refused_naming_the_option(local_group):
    """Two stages, two micro-batches, one step: every send, receive,
    accumulate and average is first tried with a kDLCUDA __dlpack__ tensor
    (the library refuses it, changing nothing) and then done with NumPy; the
    average is still the mean of the two accumulated gradients. The producer
    was asked for DLPack's stream of each call (1 = the legacy default)."""
    comms = local_group(2, timeout_ms=10000)
    N, width = 2, 3

    def job(comm, _):
        j, fake = comm.rank, FakeCudaGradient(width)
        calls, averages = [], []
        with flatmem.CyclicStages(comm, micro_batches=N, steps=1, boundary_bytes=[width * 8]) as h:
            while (a := h.next()).kind != "done":
                if a.update_step is not None:
                    averages.append(refuse_then_do(h.average, "out", fake, np.empty(width)))
                    calls.append("average")
                if a.receives:
                    refuse_then_do(h.receive, "into", fake, np.empty(width))
                    calls.append("receive")
                if a.accumulates:
                    refuse_then_do(h.accumulate, "gradient", fake, np.full(width, float(a.micro_batch + 1)))
                    calls.append("accumulate")
                if a.sends:
                    refuse_then_do(h.send, "tensor", fake, np.zeros(width))
                    calls.append("send")
        assert fake.streams == [1, 0x5000] * len(calls)
        return sorted(set(calls)), averages

    for calls, averages in run_threads(comms, job):
        assert calls == ["accumulate", "average", "receive", "send"]
        np.testing.assert_array_equal(averages, [np.full(width, (1.0 + 2.0) * 0.5)])


def test_calls_refuse_what_they_cannot_describe(local_group):
    comm = local_group(1)[0]
    with flatmem.CyclicStages(comm, micro_batches=1, steps=1) as h:
        h.next()
        with pytest.raises(TypeError, match="stream: expected an int, not str"):
            h.accumulate(np.ones(2), stream="default")
        with pytest.raises(TypeError, match="out: an output must be a NumPy array or an object with __dlpack__, "
                                            "not list"):
            h.average([0.0], stream=0)
        with pytest.raises(TypeError, match="into: an output must be a NumPy array or an object with __dlpack__, "
                                            "not NoneType"):
            h.receive(None)


class WithStreams:
    """A CyclicStages whose four tensor calls go through the *_stream entry
    points, each with its own made-up stream (ignored on the host)."""

    def __init__(self, handle):
        self._h = handle

    def __getattr__(self, name):
        return getattr(self._h, name)

    def send(self, tensor):
        self._h.send(tensor, stream=0x1000)

    def receive(self, into):
        return self._h.receive(into, stream=0x2000)

    def accumulate(self, gradient):
        self._h.accumulate(gradient, stream=0)  # 0: the legacy default stream, as None

    def average(self, out=None):
        return self._h.average(out, stream=0x4000)


def train(comm, mlp, N, S, rule, streams):
    with flatmem.CyclicStages(comm, micro_batches=N, steps=S, rule=rule, boundary_bytes=mlp.boundary_bytes(),
                              activation_bytes=mlp.activation_bytes(), timeout_ms=20000) as h:
        result = train_stage(WithStreams(h) if streams else h, mlp, LR)
        result["summary"], result["stats"] = h.summary(), h.stats()
    return result


@pytest.mark.parametrize("case, N, S, rule", [(MLP_3, 4, 3, "delay1"), (MLP_2, 3, 3, "sync")])
def test_host_training_through_the_stream_calls_equals_the_plain_calls(local_group, case, N, S, rule):
    """The same MLP trained through the *_stream calls and through the plain
    ones: both equal the NumPy simulation (check_training), and each other,
    bitwise."""
    mlp = mlp_of(case)
    plain = run_threads(local_group(mlp.stages), lambda c, _: train(c, mlp, N, S, rule, streams=False))
    streamed = run_threads(local_group(mlp.stages), lambda c, _: train(c, mlp, N, S, rule, streams=True))
    check_training(streamed, mlp, N, S, rule)
    assert_bitwise([r["params"] for r in streamed], [r["params"] for r in plain], "stream calls vs plain calls")
