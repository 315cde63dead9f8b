"""examples/jax/run_two_tower.sh: 4 processes train the two-tower CLIP example
with the ring loss; the script checks that every rank exits 0, that step 1
matches the single-process loss of the concatenated batch (the example
compares loss and summed gradients) and that the loss fell. Launched by a
shell loop, and by mpirun where Open MPI is installed."""
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from ring_launch import child_environment

SCRIPT = pathlib.Path(__file__).resolve().parents[3] / "examples" / "jax" / "run_two_tower.sh"
# The script kills each rank after DEADLINE_S; this one covers the script itself.
DEADLINE_S = 90


@pytest.mark.parametrize("mode", ["loop", "mpirun"])
def test_two_tower_example_trains_and_matches_one_process(mode, tmp_path):
    if mode == "mpirun" and shutil.which("mpirun") is None:
        pytest.skip("mpirun not installed (Debian: openmpi-bin)")
    env = child_environment(0, 1, "unused")
    for name in ("FLATMEM_RANK", "FLATMEM_WORLD_SIZE", "FLATMEM_COORDINATOR"):
        del env[name]  # the script sets them (mpirun: its own rank variables)
    env.update(PYTHON=sys.executable, DEADLINE_S="60", LOG_DIR=str(tmp_path))
    try:
        done = subprocess.run(["bash", str(SCRIPT), mode], env=env, capture_output=True, text=True,
                              timeout=DEADLINE_S)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"run_two_tower.sh {mode} ran past {DEADLINE_S} s:\n{e.stdout}\n{e.stderr}")
    assert done.returncode == 0, f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    assert f"run_two_tower: OK (4 ranks, {mode})" in done.stdout
    assert "step  30  loss" in done.stdout, done.stdout
