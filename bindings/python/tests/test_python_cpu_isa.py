"""The CPU instruction set (flatmem.cpu_isa / set_cpu_isa over
flatmem_cpu_isa_get / _set / _name): names, the round trip, every instruction
set up to the best selectable and computing, those above the best refused
(avx512bf16 on AVX2-only and AVX-512-without-BF16 processors, amx where
there are no AMX tiles), FLATMEM_CPU_ISA honoured and checked, and
cpu_engine() naming the kernels of each. Expectations follow the processor's
best, so the tests pass on AVX2, AVX-512, AVX512_BF16 and AMX machines alike.
Every test puts the process back on the environment's choice."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from python_support import BFLOAT16, features, raises_flatmem

import flatmem
from flatmem import capi

RANK = {name: i for i, name in enumerate(reversed(flatmem.CPU_ISAS))}  # baseline 0 .. amx 4


@pytest.fixture(autouse=True)
def back_to_default():
    flatmem.set_cpu_isa(None)
    yield
    flatmem.set_cpu_isa(None)


def test_names_and_values():
    assert flatmem.CPU_ISAS == ("amx", "avx512bf16", "avx512", "avx2", "baseline")
    assert (capi.CPU_ISA_DEFAULT, capi.CPU_ISA_BASELINE, capi.CPU_ISA_AVX2, capi.CPU_ISA_AVX512,
            capi.CPU_ISA_AVX512BF16, capi.CPU_ISA_AMX) == (0, 1, 2, 3, 4, 5)
    assert ([capi.cpu_isa_name(v) for v in range(7)]
            == ["default", "baseline", "avx2", "avx512", "avx512bf16", "amx", "unknown"])
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
    flatmem.set_cpu_isa(None)
    for word in ("AVX512BF16", "Avx512Bf16", "AMX", "Amx"):  # any case: selected, or refused as above the best
        name = word.lower()
        if RANK[name] <= RANK[best]:
            flatmem.set_cpu_isa(word)
            assert flatmem.cpu_isa() == (name, best)
            flatmem.set_cpu_isa(None)
        else:
            with raises_flatmem(flatmem.UnsupportedError, capi.STATUS_UNSUPPORTED, name):
                flatmem.set_cpu_isa(word)
            assert flatmem.cpu_isa() == (in_use, best)


@pytest.mark.skipif(capi.cpu_isa_best() == capi.CPU_ISA_AMX,
                    reason="this processor has AMX tiles: no instruction set above its best")
def test_above_the_best_is_refused():
    in_use, best = flatmem.cpu_isa()
    above = [name for name in flatmem.CPU_ISAS if RANK[name] > RANK[best]]
    assert above and above[0] == "amx"
    for name in above:
        with raises_flatmem(flatmem.UnsupportedError, capi.STATUS_UNSUPPORTED, name) as info:
            flatmem.set_cpu_isa(name)
        assert isinstance(info.value, NotImplementedError)
        assert best in str(info.value)
        assert flatmem.cpu_isa() == (in_use, best)  # nothing changed


@pytest.mark.skipif(capi.cpu_isa_best() < capi.CPU_ISA_AVX512BF16,
                    reason="this processor lacks AVX512_BF16 (test_above_the_best_is_refused covers it)")
def test_avx512bf16_bf16_tile_products_agree_with_widening():
    """bf16 inputs: vdpbf16ps tile products (fp32 accumulation) under
    avx512bf16, widened to fp32 for sgemm under avx512; each bitwise
    reproducible, the two within bf16 rounding of each other."""
    rng = np.random.default_rng(3)
    q, k = features(rng, 40, 24, BFLOAT16), features(rng, 40, 24, BFLOAT16)
    results = {}
    for name in ("avx512bf16", "avx512"):
        flatmem.set_cpu_isa(name)
        first, again = _loss_and_grads(q, k), _loss_and_grads(q, k)
        assert all(a.tobytes() == b.tobytes() for a, b in zip(first, again)), name
        results[name] = first
    for a, b in zip(results["avx512bf16"], results["avx512"]):
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=2e-2, atol=1e-3)


def test_not_an_isa():
    for value in (6, 7, -1):
        with raises_flatmem(flatmem.InvalidArgumentError, capi.STATUS_INVALID_ARGUMENT,
                            f"isa: {value} is not a flatmem_cpu_isa value"):
            flatmem.set_cpu_isa(value)
    for word in ("sse4", "avx512_bf16", "bf16"):
        with pytest.raises(ValueError, match=f"'{word}' is not one of"):
            flatmem.set_cpu_isa(word)


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


@pytest.mark.parametrize("word", ["baseline", "avx2", "avx512", "avx512bf16", "AVX512BF16", "Avx512", "amx", "AMX"])
def test_environment_variable_selects(word):
    name, best = word.lower(), flatmem.cpu_isa()[1]
    done = _child(word, "import flatmem; print(*flatmem.cpu_isa())")
    if RANK[name] <= RANK[best]:
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == [name, best]
    else:
        assert done.returncode != 0
        assert "UnsupportedError: FLATMEM_STATUS_UNSUPPORTED" in done.stderr
        assert "FLATMEM_CPU_ISA" in done.stderr
        assert name in done.stderr and best in done.stderr


def test_engine_names_the_kernels_of_every_level():
    """cpu_engine(): library, version, the ISA and a kernel per input dtype;
    the fp32 kernel changes with the vector width, bf16 goes to vdpbf16ps at
    avx512bf16 and to AMX tiles at amx; no BLAS appears anywhere."""
    in_use, best = flatmem.cpu_isa()
    assert flatmem.cpu_engine() == flatmem.cpu_engine(in_use)
    texts = {name: flatmem.cpu_engine(name) for name in flatmem.CPU_ISAS}  # above the best too: what would run
    for name, text in texts.items():
        assert text.startswith(f"flatmem {flatmem.library_version()} own kernels at {name}: fp32 "), text
        assert "blas" not in text.lower(), text
    assert "widened to fp32" in texts["avx512"].split("bf16")[1]
    assert "vdpbf16ps" in texts["avx512bf16"] and "AMX" in texts["amx"]
    assert len({texts[n].split(";")[0].split(": ")[1] for n in ("baseline", "avx2", "avx512")}) == 3
    assert flatmem.cpu_engine(capi.CPU_ISA_AVX2) == texts["avx2"]
    assert capi.cpu_isa_engine(99) == "unknown"
    with pytest.raises(ValueError, match="'sse9' is not one of"):
        flatmem.cpu_engine("sse9")
