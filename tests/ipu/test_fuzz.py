"""Differential fuzzing against XLA:CPU (tests/fuzz, docs/fuzzing.md): random
programs over every op family the compiler lowers, in every IPU dtype and
with special values, run on ipu and on the CPU backend and compared by
tests/fuzz/compare.py's rules. A failure is minimised and shown as a
Python reproducer.

The default suite runs SHORT_RUN programs from seed 0; `pytest -m fuzz`
runs --fuzz-programs (or JAX_IPU_FUZZ_PROGRAMS, default 5000) from
--fuzz-seed (JAX_IPU_FUZZ_SEED, default 0)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fuzz"))

from run import fuzz  # noqa: E402

SHORT_RUN = 200


def _report(stats) -> str:
    parts = [stats.summary()]
    for seed, status, detail, reproducer in stats.failures[:5]:
        parts.append(f"--- seed {seed}: {status}: {detail}\n{reproducer}")
    return "\n".join(parts)


def test_a_short_fuzz_run_finds_no_difference():
    stats = fuzz(SHORT_RUN, seed=0)
    assert not stats.failures, _report(stats)
    assert stats.status["ok"] + stats.status["accepted"] >= SHORT_RUN * 0.98, stats.summary()


@pytest.mark.fuzz
def test_a_long_fuzz_run_finds_no_difference(request):
    programs = request.config.getoption("--fuzz-programs") or int(os.environ.get("JAX_IPU_FUZZ_PROGRAMS", 5000))
    seed = request.config.getoption("--fuzz-seed")
    seed = int(os.environ.get("JAX_IPU_FUZZ_SEED", 0)) if seed is None else seed
    stats = fuzz(programs, seed=seed)
    print(stats.summary())
    assert not stats.failures, _report(stats)
