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
from test_python_cyclic_memory import WITHOUT_NCCL, FakeCudaGradient, nccl_built
from test_python_cyclic_stages import LR, MLP_2, MLP_3, assert_bitwise, check_training, mlp_of

import flatmem
from flatmem import capi

INVALID = capi.STATUS_INVALID_ARGUMENT
ON_HOST = "options.memory = HOST takes kDLCPU tensors"


def test_memory_option_maps_to_the_c_enum(monkeypatch):
    seen = []

    class Recording:
        def __init__(self, *args):
            seen.append(args[-1])  # memory: the last argument of capi.CyclicStages
            raise RuntimeError("recorded")

    monkeypatch.setattr(capi, "CyclicStages", Recording)
    comm = flatmem.Communicator.create_local(1)[0]
    try:
        for memory in ("host", "cuda", "CUDA", "Host", 0, 1, 7):
            with pytest.raises(RuntimeError, match="recorded"):
                flatmem.CyclicStages(comm, micro_batches=1, steps=1, memory=memory)
        with pytest.raises(RuntimeError, match="recorded"):
            flatmem.CyclicStages(comm, micro_batches=1, steps=1)
        with pytest.raises(ValueError, match=r"memory: 'gpu' is not one of \['cuda', 'host'\]"):
            flatmem.CyclicStages(comm, micro_batches=1, steps=1, memory="gpu")
    finally:
        comm.close()
    assert seen == [0, 1, 1, 0, 0, 1, 7, 0]


def test_unknown_memory_value_is_the_librarys_error(local_group):
    comm = local_group(1)[0]
    with raises_flatmem(flatmem.InvalidArgumentError, INVALID, "options.memory: 7",
                        "FLATMEM_CYCLIC_MEMORY_HOST (0)", "FLATMEM_CYCLIC_MEMORY_CUDA (1)"):
        flatmem.CyclicStages(comm, micro_batches=1, steps=1, memory=7)


def test_cuda_memory_needs_the_device_transport(local_group):
    """Without init_device every rank refuses, naming options.memory and the
    first rank without a device transport; a build without NCCL refuses with
    UNSUPPORTED at once. Either way the communicator is still usable."""
    comms = local_group(2, timeout_ms=5000)
    built = nccl_built()

    def job(comm, _):
        create = lambda: flatmem.CyclicStages(comm, micro_batches=2, steps=1, boundary_bytes=[8],  # noqa: E731
                                              memory="cuda")
        if built:
            with raises_flatmem(flatmem.InvalidArgumentError, INVALID, "options.memory: CUDA",
                                "rank 0 has no device transport", "flatmem_comm_init_device"):
                create()
        else:
            with raises_flatmem(flatmem.UnsupportedError, capi.STATUS_UNSUPPORTED, "options.memory: CUDA",
                                WITHOUT_NCCL):
                create()
        comm.barrier()
        return comm._raw.users()

    assert run_threads(comms, job) == [0, 0]


def test_ranks_that_differ_in_memory_are_named(local_group):
    if not nccl_built():
        pytest.skip("this flatmem has no NCCL: memory='cuda' is refused before the ranks compare options")
    comms = local_group(2, timeout_ms=5000)

    def job(comm, _):
        with raises_flatmem(flatmem.InvalidArgumentError, INVALID, "options.memory: rank 1 passes CUDA, rank 0 HOST"):
            flatmem.CyclicStages(comm, micro_batches=1, steps=1, boundary_bytes=[8],
                                 memory="cuda" if comm.rank else "host")

    run_threads(comms, job)


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
