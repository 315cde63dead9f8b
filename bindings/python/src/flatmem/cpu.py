"""The CPU instruction set flatmem's kernels run with, and the engine it
selects (flatmem_cpu_isa_get / _set / _name / _engine of include/flatmem/flatmem.h).

    flatmem.cpu_isa()            # ('amx', 'amx'): (in use, best this processor has)
    flatmem.cpu_engine()         # 'flatmem 0.2.0 own kernels at amx: fp32 ...; bf16 ...'
    flatmem.set_cpu_isa("avx2")  # every later call of this process, any thread
    flatmem.set_cpu_isa(None)    # back to $FLATMEM_CPU_ISA, or the best

The kernels (the matrix products, the exponentials and reductions of the
contrastive loss, the built-in blocks' LayerNorm, softmax and GELU) are
compiled once per instruction set; one of them runs for the whole process:
the best the processor supports, capped by the environment variable
FLATMEM_CPU_ISA (amx, avx512bf16, avx512, avx2, baseline, any case; read when
the process first asks), overridden by set_cpu_isa(). The matrix products are
flatmem's own kernels for that level, never a BLAS's guess about the
processor. avx512bf16 adds the contrastive tile products of bf16 inputs on
vdpbf16ps, amx on AMX tiles (bf16 products, fp32 accumulation); below them
bf16 inputs are widened to fp32. Results are bitwise reproducible for one
instruction set; different ones round differently, within each function's
error bounds. cpu_engine() names the kernels.
"""
from __future__ import annotations

from . import capi
from ._header import NAMES

_LEVELS = (capi.CPU_ISA_AMX, capi.CPU_ISA_AVX512BF16, capi.CPU_ISA_AVX512, capi.CPU_ISA_AVX2, capi.CPU_ISA_BASELINE)
#: The instruction sets, from the most capable down, by their flatmem names.
CPU_ISAS = tuple(capi.cpu_isa_name(isa) for isa in _LEVELS)
_BY_NAME = NAMES["flatmem_cpu_isa"]


def cpu_isa():
    """(in_use, best): the instruction set the CPU kernels run with now and
    the best this processor supports among those compiled into libflatmem,
    as names ("amx", "avx512bf16", "avx512", "avx2" or "baseline").

    Raises flatmem.InvalidArgumentError when $FLATMEM_CPU_ISA is not one of
    those names (or empty / "auto"), flatmem.UnsupportedError when it names
    one above the best; the message names the variable and what this
    processor has.
    """
    return capi.cpu_isa_name(capi.cpu_isa_in_use()), capi.cpu_isa_name(capi.cpu_isa_best())


def set_cpu_isa(isa):
    """Selects the instruction set of the CPU kernels for the whole process:
    "amx", "avx512bf16", "avx512", "avx2", "baseline" (any case), or None (also
    "default") to go back to $FLATMEM_CPU_ISA, or the best when it is unset.
    It overrides the variable. An integer is passed on as a flatmem_cpu_isa
    value.

    Raises flatmem.UnsupportedError, and nothing changes, when this processor
    lacks that instruction set (flatmem.InvalidArgumentError for an integer
    that is no flatmem_cpu_isa value; ValueError for an unknown name). Calls
    already running may finish with the previous one: select before computing
    when bitwise reproducibility matters.
    """
    if isa is None:
        value = capi.CPU_ISA_DEFAULT
    elif isinstance(isa, str):
        try:
            value = _BY_NAME[isa.lower()]
        except KeyError:
            raise ValueError(f"set_cpu_isa: '{isa}' is not one of {sorted(_BY_NAME)} "
                             "(or None)") from None
    else:
        value = int(isa)  # the library judges numbers
    capi.cpu_isa_set(value)


def cpu_engine(isa=None):
    """The kernels behind the CPU products at `isa` (a name as for
    set_cpu_isa, or None: the instruction set in use now), in words: library,
    version and the kernel for each input dtype, e.g. "flatmem 0.2.0 own
    kernels at amx: fp32 avx512 fma 12x32; bf16 AMX tiles ...; fp16 widened
    to fp32". For logs and benchmark rows; not a stable format."""
    if isa is None:
        return capi.cpu_isa_engine(capi.CPU_ISA_DEFAULT)
    try:
        value = _BY_NAME[isa.lower()] if isinstance(isa, str) else int(isa)
    except KeyError:
        raise ValueError(f"cpu_engine: '{isa}' is not one of {sorted(_BY_NAME)} (or None)") from None
    return capi.cpu_isa_engine(value)
