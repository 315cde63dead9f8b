"""The ABI's struct sizes (flatmem.h, "Conventions"), seen from Python: the SWIG wrapper passes the
sizeof it was compiled with, and the library loaded beside it (called here through ctypes, as a
caller built against another header would) honours every size: a larger struct gets the library's
fields then zeros, a smaller one the prefix, a set byte past the library's sizeof is UNSUPPORTED,
and a size of 0 or above FLATMEM_MAX_STRUCT_SIZE is INVALID_ARGUMENT naming the argument."""
import ctypes
import re

import pytest

import flatmem
from flatmem import capi

FILL = 0xAB  # what the library must leave alone


class ContrastiveOptions(ctypes.Structure):
    """flatmem_contrastive_options of ABI 1."""
    _fields_ = [("struct_size", ctypes.c_size_t), ("loss", ctypes.c_int32), ("num_threads", ctypes.c_int32),
                ("tile_rows", ctypes.c_int32), ("tile_cols", ctypes.c_int32), ("nonfinite", ctypes.c_int32),
                ("fp32_precision", ctypes.c_int64), ("comm", ctypes.c_void_p),
                ("logit_cache_bytes", ctypes.c_size_t)]


class CyclicAction(ctypes.Structure):
    """flatmem_cyclic_action of ABI 1."""
    _fields_ = [("time_step", ctypes.c_int64), ("kind", ctypes.c_int32), ("stage", ctypes.c_int32),
                ("step", ctypes.c_int64), ("update_stage", ctypes.c_int32), ("update_step", ctypes.c_int64),
                ("activations_held", ctypes.c_int32), ("phase", ctypes.c_int32)]


@pytest.fixture(scope="module")
def lib():
    """The libflatmem flatmem.capi loaded (the one mapped into this process), through ctypes."""
    with open("/proc/self/maps") as maps:
        mapped = set(re.findall(r"(/\S*/libflatmem\.so[.\d]*)$", maps.read(), re.M))
    assert len(mapped) == 1, mapped
    library = ctypes.CDLL(mapped.pop())  # the loader hands back the object already loaded
    assert library.flatmem_version() == capi.version() == capi.VERSION
    library.flatmem_last_error.restype = ctypes.c_char_p
    return library


def filled(size):
    return (ctypes.c_ubyte * size)(*([FILL] * size))


def fields(struct, names):
    return tuple(getattr(struct, name) for name in names)


OPTION_FIELDS = ("loss", "num_threads", "tile_rows", "tile_cols", "nonfinite", "fp32_precision",
                 "logit_cache_bytes")
ACTION_FIELDS = ("time_step", "kind", "stage", "step", "update_stage", "update_step", "activations_held", "phase")


def test_the_wrapper_passes_its_own_sizes():
    assert (capi.ABI_VERSION, capi.MAX_STRUCT_SIZE) == (1, 4096)
    options = capi.ContrastiveOptions()  # flatmem_contrastive_options_init(o, sizeof *o)
    assert options.struct_size == ctypes.sizeof(ContrastiveOptions) == 56
    assert (options.loss, options.num_threads, options.tile_rows, options.tile_cols, options.nonfinite,
            options.logit_cache_bytes) == (capi.CONTRASTIVE_DEFAULT, 0, 0, 0, capi.NONFINITE_ERROR, 0)
    # The output structs lost struct_size (the size is an argument now).
    assert not hasattr(capi.CyclicRelaySummary, "struct_size")
    assert not hasattr(capi.CyclicAction, "struct_size")


def test_options_init_writes_exactly_the_callers_size(lib):
    known = ctypes.sizeof(ContrastiveOptions)
    mirror = ContrastiveOptions()
    assert lib.flatmem_contrastive_options_init(ctypes.byref(mirror), known) == capi.STATUS_SUCCESS
    swig = capi.ContrastiveOptions()
    assert mirror.struct_size == known and fields(mirror, OPTION_FIELDS) == fields(swig, OPTION_FIELDS)

    # Larger (a newer header): the library's fields, then zeros; never past the size.
    larger = filled(known + 24)
    assert lib.flatmem_contrastive_options_init(larger, known + 16) == capi.STATUS_SUCCESS
    head = ContrastiveOptions.from_buffer(larger)
    assert head.struct_size == known + 16 and fields(head, OPTION_FIELDS) == fields(swig, OPTION_FIELDS)
    assert list(larger[known:known + 16]) == [0] * 16 and list(larger[known + 16:]) == [FILL] * 8

    # Smaller (an older header): the prefix only, struct_size = 8.
    smaller = filled(known)
    assert lib.flatmem_contrastive_options_init(smaller, 8) == capi.STATUS_SUCCESS
    assert ContrastiveOptions.from_buffer(smaller).struct_size == 8 and list(smaller[8:]) == [FILL] * (known - 8)


@pytest.mark.parametrize("size", [0, 4, 4097, 1 << 40])
def test_options_init_refuses_a_bad_size(lib, size):
    buffer = filled(64)
    assert lib.flatmem_contrastive_options_init(buffer, ctypes.c_size_t(size)) == capi.STATUS_INVALID_ARGUMENT
    message = lib.flatmem_last_error().decode()
    assert message.startswith(f"struct_size: {size}; expected sizeof the struct"), message
    assert "FLATMEM_MAX_STRUCT_SIZE = 4096" in message
    assert list(buffer) == [FILL] * 64  # nothing written


def test_options_past_the_librarys_sizeof_must_be_zero(lib):
    known = ctypes.sizeof(ContrastiveOptions)
    newer = (ctypes.c_ubyte * (known + 16))()
    assert lib.flatmem_contrastive_options_init(newer, known + 16) == capi.STATUS_SUCCESS
    ContrastiveOptions.from_buffer(newer).tile_rows = 3
    handle = ctypes.c_void_p()
    # Zeros past the library's fields: the fields a newer header appended are left at their defaults.
    assert lib.flatmem_contrastive_create(ctypes.byref(handle), newer) == capi.STATUS_SUCCESS
    assert handle.value and lib.flatmem_contrastive_destroy(handle) == capi.STATUS_SUCCESS
    # A set one is a field this library does not know: refused, and no handle made.
    newer[known + 5] = 1
    handle = ctypes.c_void_p()
    assert lib.flatmem_contrastive_create(ctypes.byref(handle), newer) == capi.STATUS_UNSUPPORTED
    assert handle.value is None
    message = lib.flatmem_last_error().decode()
    assert message.startswith(f"options: byte {known + 5} of the caller's {known + 16}-byte struct is set, "
                              f"past the {known} bytes this libflatmem ({flatmem.library_version()}) knows"), message
    # struct_size 0: INVALID_ARGUMENT naming it and the init to use.
    zero = ContrastiveOptions()
    assert lib.flatmem_contrastive_create(ctypes.byref(handle), ctypes.byref(zero)) == capi.STATUS_INVALID_ARGUMENT
    assert lib.flatmem_last_error().decode().startswith("options: struct_size is 0; initialise with ")


def test_an_output_struct_gets_the_callers_size(lib):
    schedule = capi.CyclicSchedule(8, 4, 3, capi.CYCLIC_NEWEST)
    address = ctypes.c_void_p(int(schedule.this))
    action = lambda buffer, size: lib.flatmem_cyclic_schedule_action(  # noqa: E731
        address, 5, ctypes.c_int64(7), buffer, ctypes.c_size_t(size))
    expected = fields(schedule.action(5, 7), ACTION_FIELDS)  # the wrapper's sizeof
    assert expected == (7, capi.CYCLIC_FORWARD, 2, 0, -1, -1, 3, 2)
    known = ctypes.sizeof(CyclicAction)

    larger = filled(known + 24)
    assert action(larger, known + 16) == capi.STATUS_SUCCESS
    assert fields(CyclicAction.from_buffer(larger), ACTION_FIELDS) == expected
    assert list(larger[known:known + 16]) == [0] * 16 and list(larger[known + 16:]) == [FILL] * 8

    smaller = filled(known)
    assert action(smaller, 16) == capi.STATUS_SUCCESS  # time_step, kind, stage
    prefix = CyclicAction.from_buffer(smaller)
    assert (prefix.time_step, prefix.kind, prefix.stage) == expected[:3]
    assert list(smaller[16:]) == [FILL] * (known - 16)

    for size in (0, capi.MAX_STRUCT_SIZE + 1):
        untouched = filled(known)
        assert action(untouched, size) == capi.STATUS_INVALID_ARGUMENT
        assert lib.flatmem_last_error().decode().startswith(f"action_size: {size}; expected sizeof the struct")
        assert list(untouched) == [FILL] * known
