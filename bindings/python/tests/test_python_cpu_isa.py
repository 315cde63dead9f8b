"""The CPU instruction set (flatmem.cpu_isa / set_cpu_isa over
flatmem_cpu_isa_get / _set / _name): names, the round trip, every instruction
set up to the best selectable and computing, one above the best refused, and
FLATMEM_CPU_ISA honoured and checked. Every test puts the process back on the
environment's choice."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from python_support import features, raises_flatmem

import flatmem
from flatmem import capi

RANK = {name: i for i, name in enumerate(reversed(flatmem.CPU_ISAS))}  # baseline 0 .. avx512 2


@pytest.fixture(autouse=True)
def back_to_default():
    flatmem.set_cpu_isa(None)
    yield
    flatmem.set_cpu_isa(None)


def test_names_and_values():
    assert flatmem.CPU_ISAS == ("avx512", "avx2", "baseline")
    assert (capi.CPU_ISA_DEFAULT, capi.CPU_ISA_BASELINE, capi.CPU_ISA_AVX2, capi.CPU_ISA_AVX512) == (0, 1, 2, 3)
    assert [capi.cpu_isa_name(v) for v in range(5)] == ["default", "baseline", "avx2", "avx512", "unknown"]
    in_use, best = flatmem.cpu_isa()
    assert in_use in flatmem.CPU_ISAS and best in flatmem.CPU_ISAS
    assert RANK[in_use] <= RANK[best]


def test_environment_variable_is_the_default():
    wanted = os.environ.get("FLATMEM_CPU_ISA", "").strip().lower()
    in_use, best = flatmem.cpu_isa()
    assert in_use == (best if wanted in ("", "auto") else wanted)


def _loss_and_grads(q, k):
    loss, backward = flatmem.contrastive_loss(q, k, 10.0)
    return [np.asarray(x) for x in (loss, *backward())]


def test_every_isa_up_to_the_best_selects_and_computes():
    in_use, best = flatmem.cpu_isa()
    rng = np.random.default_rng(1)
    q, k = features(rng, 40, 24, np.float32), features(rng, 40, 24, np.float32)
    results = {}
    for name in flatmem.CPU_ISAS:
        if RANK[name] > RANK[best]:
            continue
        flatmem.set_cpu_isa(name)
        assert flatmem.cpu_isa() == (name, best)
        first, again = _loss_and_grads(q, k), _loss_and_grads(q, k)
        assert all(a.tobytes() == b.tobytes() for a, b in zip(first, again)), name  # bitwise per ISA
        results[name] = first
    flatmem.set_cpu_isa(None)
    assert flatmem.cpu_isa() == (in_use, best)  # the round trip
    reference = results["baseline"]
    for name, got in results.items():  # the ISAs round differently, within the error bounds
        for a, b in zip(got, reference):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=name)


def test_names_are_case_insensitive_and_default_is_none():
    in_use, best = flatmem.cpu_isa()
    flatmem.set_cpu_isa("BaseLine")
    assert flatmem.cpu_isa() == ("baseline", best)
    flatmem.set_cpu_isa("default")
    assert flatmem.cpu_isa() == (in_use, best)
    flatmem.set_cpu_isa(capi.CPU_ISA_BASELINE)
    assert flatmem.cpu_isa()[0] == "baseline"


@pytest.mark.skipif(capi.cpu_isa_best() == capi.CPU_ISA_AVX512,
                    reason="this processor has AVX-512: no instruction set above its best")
def test_above_the_best_is_refused():
    in_use, best = flatmem.cpu_isa()
    above = flatmem.CPU_ISAS[flatmem.CPU_ISAS.index(best) - 1]
    with raises_flatmem(flatmem.UnsupportedError, capi.STATUS_UNSUPPORTED, above) as info:
        flatmem.set_cpu_isa(above)
    assert isinstance(info.value, NotImplementedError)
    assert flatmem.cpu_isa() == (in_use, best)  # nothing changed


def test_not_an_isa():
    with raises_flatmem(flatmem.InvalidArgumentError, capi.STATUS_INVALID_ARGUMENT,
                        "isa: 7 is not a flatmem_cpu_isa value"):
        flatmem.set_cpu_isa(7)
    with pytest.raises(ValueError, match="'sse4' is not one of"):
        flatmem.set_cpu_isa("sse4")


def _child(env_value, code):
    env = dict(os.environ, FLATMEM_CPU_ISA=env_value)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=120)


def test_malformed_environment_variable():
    """FLATMEM_CPU_ISA=sse9: cpu_isa() and the first handle raise
    InvalidArgumentError naming the variable; set_cpu_isa overrides it."""
    done = _child("sse9", """
        import flatmem
        for call in (flatmem.cpu_isa, flatmem.Contrastive):
            try:
                call()
            except flatmem.InvalidArgumentError as e:
                print("refused:", e)
            else:
                print("accepted")
        flatmem.set_cpu_isa("baseline")
        print("after set:", flatmem.cpu_isa()[0])
    """)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 3, done.stdout
    assert all(line.startswith("refused: FLATMEM_STATUS_INVALID_ARGUMENT") and "FLATMEM_CPU_ISA" in line
               for line in lines[:2]), done.stdout
    assert lines[2] == "after set: baseline"


@pytest.mark.parametrize("name", ["baseline", "avx2", "avx512"])
def test_environment_variable_selects(name):
    best = flatmem.cpu_isa()[1]
    done = _child(name, "import flatmem; print(*flatmem.cpu_isa())")
    if RANK[name] <= RANK[best]:
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == [name, best]
    else:
        assert done.returncode != 0
        assert "UnsupportedError: FLATMEM_STATUS_UNSUPPORTED" in done.stderr
        assert "FLATMEM_CPU_ISA" in done.stderr
