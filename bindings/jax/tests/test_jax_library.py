"""libflatmem_jax.so itself: what it exports, which libflatmem it loads, how the
custom calls are lowered per platform, concurrent calls, the thread option."""
import os
import re
import shutil
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import flatmem_jax
from jax_checks import unit_rows
from python_support import run_concurrently

HANDLERS = [f"flatmem_jax_{loss}_{stage}"
            for loss in ("clip", "infonce", "reversible", "ring_clip", "ring_infonce")
            for stage in ("forward", "backward")] + ["flatmem_jax_ring_all_reduce"] + [
            f"flatmem_jax_{ring}sigmoid_{stage}" for ring in ("", "ring_")
            for stage in ("forward", "value_and_grad", "backward")]


@pytest.mark.skipif(shutil.which("nm") is None, reason="needs binutils' nm")
def test_exports_only_flatmem_jax_symbols():
    out = subprocess.run(["nm", "-D", "--defined-only", flatmem_jax.library_path],
                         check=True, capture_output=True, text=True).stdout
    names = {line.split()[-1] for line in out.splitlines() if line.strip()}
    expected = {f"{h}_cpu" for h in HANDLERS} | {
        "flatmem_jax_header_version", "flatmem_jax_library_version", "flatmem_jax_has_cuda",
        "flatmem_jax_workspace_size", "flatmem_jax_reversible_workspace_size",
        "flatmem_jax_contrastive_pool_stats", "flatmem_jax_comm_create_from_env",
        "flatmem_jax_comm_rank", "flatmem_jax_comm_health", "flatmem_jax_comm_barrier",
        "flatmem_jax_comm_init_device", "flatmem_jax_comm_close"}
    if flatmem_jax.has_cuda:
        expected |= {f"{h}_cuda" for h in HANDLERS}
    assert names == expected


def test_loads_the_installed_libflatmem():
    maps = open("/proc/self/maps").read()
    paths = set(re.findall(r"(/\S*/libflatmem\.so[.\d]*)$", maps, re.M))
    assert len(paths) == 1, paths
    prefix = os.environ.get("FLATMEM_JAX_EXPECT_PREFIX")  # set by scripts/check-jax.sh
    if prefix:
        assert os.path.realpath(paths.pop()).startswith(os.path.realpath(prefix) + os.sep)


@pytest.mark.skipif(not os.environ.get("FLATMEM_JAX_EXPECT_INSTALLED"),
                    reason="scripts/check-jax.sh sets FLATMEM_JAX_EXPECT_INSTALLED=1")
def test_the_installed_package_with_its_own_library():
    # pip install bindings/jax puts libflatmem_jax.so next to __init__.py; no path settings.
    assert "FLATMEM_JAX_LIBRARY" not in os.environ
    package = os.path.dirname(os.path.realpath(flatmem_jax.__file__))
    source = os.path.realpath(os.path.join(os.path.dirname(__file__), "..", "python"))
    assert not package.startswith(source + os.sep), package
    assert os.path.realpath(flatmem_jax.library_path) == os.path.join(package, "libflatmem_jax.so")


def test_versions_agree():
    lib = flatmem_jax._lib
    assert lib.flatmem_jax_header_version() == lib.flatmem_jax_library_version() == 200  # 0.2.0


def lowered(f, *args, platform):
    return jax.jit(f).trace(*args).lower(lowering_platforms=(platform,)).as_text()


def test_cpu_lowering_has_a_workspace_result_of_the_queried_size():
    q = unit_rows(1, 6, 5)
    text = lowered(flatmem_jax.clip_loss, q, q, 1.0, platform="cpu")
    size = flatmem_jax._workspace_bytes(1, False, q.dtype, q.shape, q.dtype, q.shape)
    call = re.search(r"custom_call @flatmem_clip_forward\(.*", text).group(0)
    assert call.endswith(f"-> (tensor<f32>, tensor<6xf32>, tensor<6xf32>, tensor<{size}xui8>)")


@pytest.mark.skipif(not flatmem_jax.has_cuda, reason="libflatmem_jax.so built without nvcc")
def test_cuda_lowering_uses_the_same_targets_without_workspace_result():
    q, k = unit_rows(1, 6, 5), unit_rows(2, 8, 5)
    labels = jnp.arange(6)
    grad = jax.grad(flatmem_jax.infonce_loss, argnums=(0, 1, 2))
    text = lowered(grad, q, k, 1.0, labels, platform="cuda")
    calls = re.findall(r"custom_call @(\w+)\(.*", text)
    assert sorted(calls) == ["flatmem_infonce_backward", "flatmem_infonce_forward"]
    assert "ui8" not in text


def fake_comm(slot):
    """A RingComm naming registry slot `slot` with no communicator behind it:
    tracing and lowering only read the slot (test_jax_ring.py runs real ones)."""
    comm = object.__new__(flatmem_jax.RingComm)
    comm._slot, comm._closed, comm._rank, comm._world_size = slot, False, 0, 1
    return comm


@pytest.mark.parametrize("platform", ["cpu", "cuda"])
def test_ring_lowering_carries_the_comm_slot_and_no_workspace(platform):
    if platform == "cuda" and not flatmem_jax.has_cuda:
        pytest.skip("libflatmem_jax.so built without nvcc")
    q, k = unit_rows(1, 6, 5), unit_rows(2, 8, 5)
    comm = fake_comm(3)
    grad = jax.grad(lambda q, k, s: flatmem_jax.infonce_loss(q, k, s, jnp.arange(6), comm=comm),
                    argnums=(0, 1, 2))
    text = lowered(grad, q, k, 1.0, platform=platform)
    calls = re.findall(r"custom_call @(flatmem_\w+)\((.*)", text)
    assert sorted(name for name, _ in calls) == ["flatmem_ring_infonce_backward",
                                                 "flatmem_ring_infonce_forward"]
    for _, call in calls:
        assert "comm = 3 : i64" in call and "logit_cache_bytes" not in call, call
    assert "ui8" not in text
    sigmoid = jax.value_and_grad(
        lambda q, k, s, t: flatmem_jax.sigmoid_loss(q, k, s, t, jnp.arange(6), comm=comm),
        argnums=(0, 1, 2, 3))
    calls = re.findall(r"custom_call @(flatmem_\w+)\((.*)", lowered(sigmoid, q, k, 1.0, 0.0,
                                                                     platform=platform))
    assert [name for name, _ in calls] == ["flatmem_ring_sigmoid_value_and_grad"], calls
    assert "comm = 3 : i64" in calls[0][1] and "ui8" not in calls[0][1], calls
    reduced = lowered(comm.all_reduce, jnp.zeros((2, 3)), platform=platform)
    assert re.search(r"custom_call @flatmem_ring_all_reduce\(.*comm = 3 : i64", reduced), reduced


def reversible_lowering(platform, math):
    import jax_reversible_reference as ref
    params = ref.random_parameters(np.random.default_rng(0), 2, 12)
    x = jnp.zeros((2, 5, 12), jnp.float32)

    def loss(x, params):
        y1, y2 = flatmem_jax.reversible_transformer(x, x, params, heads=3, math=math)
        return jnp.sum(y1 * y2)

    return lowered(jax.grad(loss, argnums=(0, 1)), x, params, platform=platform)


def test_reversible_cpu_lowering_carries_math_and_a_workspace_result():
    text = reversible_lowering("cpu", "tf32")
    calls = re.findall(r"custom_call @(flatmem_reversible_\w+)\(.*", text)
    assert sorted(calls) == ["flatmem_reversible_backward", "flatmem_reversible_forward"]
    for call in re.findall(r"custom_call @flatmem_reversible_\w+\(.*", text):
        assert "math = 1 : i32" in call, call
        assert "xui8>" in call, call  # the workspace result


@pytest.mark.skipif(not flatmem_jax.has_cuda, reason="libflatmem_jax.so built without nvcc")
def test_reversible_cuda_lowering_uses_the_same_targets_without_workspace_result():
    text = reversible_lowering("cuda", "fp32")
    calls = re.findall(r"custom_call @(flatmem_reversible_\w+)\(.*", text)
    assert sorted(calls) == ["flatmem_reversible_backward", "flatmem_reversible_forward"]
    assert "ui8" not in text
    for call in re.findall(r"custom_call @flatmem_reversible_\w+\(.*", text):
        assert "math = 0 : i32" in call, call


@pytest.mark.skipif(not flatmem_jax.has_cuda, reason="libflatmem_jax.so built without nvcc")
def test_cuda_handlers_return_flatmems_errors():
    # No GPU here: cuda_handler_check.cpp calls the exported CUDA handlers through a
    # hand-made XLA FFI call frame and a fake runtime (see its header comment).
    # scripts/check-jax.sh names the program in its CMake build folder; else next to the library.
    exe = os.environ.get("FLATMEM_JAX_CUDA_HANDLER_CHECK") or os.path.join(
        os.path.dirname(os.path.abspath(flatmem_jax.library_path)), "flatmem_jax_cuda_handler_check")
    if not os.path.exists(exe):
        pytest.skip(f"{exe} not built next to the library")
    run = subprocess.run([exe], capture_output=True, text=True)
    print(run.stdout)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "PASSED: 0 failure(s)" in run.stdout
    # XLA_FFI_Error_Code_UNIMPLEMENTED: 5 handler calls, 2 more with a logit cache budget,
    # 2 with fp32_precision TF32 / FULL, the ring all-reduce and 4 sigmoid handler calls
    assert run.stdout.count("-> code 12: ") == 14
    # the ring loss handlers run flatmem's ring on CUDA; slot 0 names no communicator:
    # XLA_FFI_Error_Code_INVALID_ARGUMENT (3) from the 4 softmax ones, 1 more with FULL and
    # the 3 sigmoid ones, the CPU forward with fp32_precision 7 (below) and the reversible CPU
    # forward with math 7
    assert run.stdout.count("-> code 3: ") == 10
    # fp32_precision reaches the CPU handler: TF32 and FULL succeed (the default's bits for
    # fp32), 7 is flatmem's INVALID_ARGUMENT (XLA_FFI_Error_Code_INVALID_ARGUMENT: 3)
    assert run.stdout.count("cpu forward (fp32_precision ") == 3
    assert "cpu forward (fp32_precision 7) -> code 3: " in run.stdout
    # the reversible CUDA handlers fail in the handler (what refuses them depends on the
    # flatmem build: its buffer checks, or no CUDA device for the gradient zeroing)
    assert run.stdout.count("(reversible): ") == 2


def test_concurrent_calls_from_threads():
    # XLA may run calls at once; each borrows its own flatmem handle from the pool.
    q, k = unit_rows(3, 200, 16), unit_rows(4, 200, 16)
    f = jax.jit(jax.value_and_grad(flatmem_jax.clip_loss, argnums=(0, 1, 2)))
    want = f(q, k, 9.0)
    results = []

    def work(_):
        for _ in range(5):
            results.append(jax.block_until_ready(f(q, k, 9.0)))

    run_concurrently(work, 4)
    assert len(results) == 20
    for value, grads in results:
        assert value == want[0]
        for g, w in zip(grads, want[1]):
            np.testing.assert_array_equal(g, w)


def run_with_threads(setting):
    code = textwrap.dedent("""
        import jax, jax.numpy as jnp, numpy as np, flatmem_jax
        x = np.random.default_rng(0).standard_normal((300, 24)).astype(np.float32)
        q, k = jnp.asarray(x[:150]), jnp.asarray(x[150:])
        value, grads = jax.value_and_grad(flatmem_jax.clip_loss, argnums=(0, 1, 2))(q, k, 5.0)
        print(repr(float(value)), float(grads[2]).hex(), np.asarray(grads[0]).tobytes().hex()[:64])
    """)
    env = dict(os.environ, FLATMEM_JAX_NUM_THREADS=setting,
               PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(flatmem_jax.__file__))]
                                          + sys.path))
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)


def test_num_threads_setting_does_not_change_results():
    one, two = run_with_threads("1"), run_with_threads("2")
    assert one.returncode == 0, one.stderr
    assert two.returncode == 0, two.stderr
    assert one.stdout == two.stdout


def test_num_threads_out_of_range_is_flatmems_error():
    bad = run_with_threads("1000")
    assert bad.returncode != 0
    assert ("FlatmemError: FLATMEM_STATUS_INVALID_ARGUMENT: options.num_threads: 1000; expected"
            in bad.stderr), bad.stderr


def test_num_threads_not_an_integer():
    bad = run_with_threads("lots")
    assert bad.returncode != 0
    assert "FLATMEM_JAX_NUM_THREADS='lots' is not an integer" in bad.stderr, bad.stderr
