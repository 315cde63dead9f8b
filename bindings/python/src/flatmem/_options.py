"""Options by name, once, for every Python binding (flatmem, flatmem.torch, flatmem_jax): a name
becomes its enum value from the header's own table (_header.NAMES, generated from
include/flatmem/*.h), an integer is checked against the range of its C type (_header.FIELDS), and
every other judgement is C's, whose message reaches the caller unchanged."""
from __future__ import annotations

import operator

from ._header import FIELDS, NAMES

# The C integer types of the options structs; an enum field is a C enum (int: its *_MAX sentinel
# is 0x7fffffff).
_RANGES = {"int32_t": (-2**31, 2**31), "int64_t": (-2**63, 2**63), "uint64_t": (0, 2**64),
           "size_t": (0, 2**64)}
_ENUM_RANGE = _RANGES["int32_t"]


def _power(n):
    """A bound as the caller reads it: 0, 2**64, -2**31."""
    if n and (abs(n) & (abs(n) - 1)) == 0:
        return f"{'-' if n < 0 else ''}2**{abs(n).bit_length() - 1}"
    return str(n)


def c_type(struct, field):
    """The C type of an options field (flatmem_contrastive_options, "logit_cache_bytes") -> "size_t"."""
    return FIELDS[struct][field][0]


def c_defaults(struct):
    """{field: value} of an options struct's *_INIT macro (its C defaults; 0 = the library's own)."""
    return {name: default for name, (_, default) in FIELDS[struct].items()}


def c_integer(value, option, ctype, *, limit=None, unit="an integer", note=""):
    """value as an integer of C type ctype (an enum type: int), below limit when the binding's
    carrier is narrower than C's type; TypeError / ValueError naming the option otherwise."""
    try:
        n = operator.index(value)
    except TypeError:
        raise TypeError(f"{option}: {value!r} is not an integer{note}") from None
    low, high = _RANGES.get(ctype, _ENUM_RANGE)
    high = high if limit is None else min(high, limit)
    if not low <= n < high:
        raise ValueError(f"{option}: {n}; expected {unit} in [{_power(low)}, {_power(high)}){note}")
    return n


def enum_value(value, enum, option, aliases=None):
    """A name of enum's values (any case; aliases adds the binding's own, e.g. "clip") as its
    value, or an integer passed on for C to judge; an unknown name is a ValueError naming the
    option and the names it has."""
    if isinstance(value, str):
        names = {**NAMES[enum], **(aliases or {})}
        try:
            return names[value.lower()]
        except KeyError:
            raise ValueError(f"{option}: '{value}' is not one of {sorted(names)}") from None
    return c_integer(value, option, enum)


def enum_name(enum, value):
    """The first name of value in enum (its canonical one: "round_once", not its alias "tf32"),
    or value itself when the header has no name for it."""
    return next((name for name, v in NAMES[enum].items() if v == value), value)


def _choices(enum):
    """'default', 'round_once' ('tf32'), 'full': each value's names, aliases in parentheses."""
    by_value = {}
    for name, v in NAMES[enum].items():
        by_value.setdefault(v, []).append(repr(name))
    return ", ".join(names[0] + "".join(f" ({alias})" for alias in names[1:]) for names in by_value.values())


def precision_value(value):
    """The precision option (exactly one of its names: "default", "round_once" or its alias
    "tf32", "full") as its flatmem_fp32_precision value; anything else is a ValueError naming the
    option and its names."""
    names = NAMES["flatmem_fp32_precision"]
    if isinstance(value, str) and value in names:
        return names[value]
    raise ValueError(f"precision: {value!r} is not one of {_choices('flatmem_fp32_precision')}")
