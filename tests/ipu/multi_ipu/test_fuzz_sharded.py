"""Differential fuzzing of sharded programs (tests/fuzz/sharded.py): random
programs over random meshes of 2-8 devices, with random input and output
shardings, constraints, shard_maps (fully and partly manual, with their
collectives) and gradients, on 8 IPUs against 8 XLA:CPU devices.

The default suite runs SHORT_RUN programs from seed 0 in a subprocess (it
needs 8 devices of each platform); `pytest -m fuzz` runs
JAX_IPU_FUZZ_PROGRAMS (default 2000) from JAX_IPU_FUZZ_SEED (default 0)."""
import os
import pathlib

import pytest

from helpers import run_python

FUZZ = pathlib.Path(__file__).resolve().parents[2] / "fuzz"
SHORT_RUN = 100


def _fuzz(programs: int, seed: int, timeout: int):
    code = f"import sys, sharded; sys.exit(sharded.main(['--programs', '{programs}', '--seed', '{seed}']))"
    return run_python(code, path=[FUZZ], timeout=timeout, JAX_IPU_DEVICE_COUNT="8", JAX_NUM_CPU_DEVICES="8")


def test_a_short_run_of_sharded_programs_finds_no_difference():
    proc = _fuzz(SHORT_RUN, 0, timeout=900)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert f"{SHORT_RUN} programs" in proc.stdout and "'ok'" in proc.stdout, proc.stdout[-2000:]


@pytest.mark.fuzz
def test_a_long_run_of_sharded_programs_finds_no_difference():
    programs = int(os.environ.get("JAX_IPU_FUZZ_PROGRAMS", 2000))
    seed = int(os.environ.get("JAX_IPU_FUZZ_SEED", 0))
    proc = _fuzz(programs, seed, timeout=60 * 60 * 10)
    print(proc.stdout[-3000:])
    assert proc.returncode == 0, proc.stdout[-10000:] + proc.stderr[-3000:]
