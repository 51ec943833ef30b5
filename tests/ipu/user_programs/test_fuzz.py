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

import pytest

from run import fuzz  # tests/fuzz/run.py (tests/fuzz is on pytest's pythonpath)

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


def test_a_difference_is_minimised_to_a_reproducer_that_shows_it(ipus, cpu):
    """The comparison and the minimiser at work on a known difference:
    XLA:CPU contracts a * b + c into one fused multiply-add, the IPU rounds
    the product first (accepted; the generator never marks such a sum
    exact), here wrongly marked exact."""
    import numpy as np

    from compare import check
    from minimise import minimise
    from programs import Program, Var

    f32 = np.dtype(np.float32)
    rng = np.random.default_rng(0)
    a, b, c = (rng.standard_normal((16, 4)).astype(np.float32) for _ in range(3))
    p = Program(inputs={"v0": a, "v1": b, "v2": c},
                lines=[("v3", "jnp.sin(v2)", "elementwise"), ("v4", "v0 * v1", "elementwise"),
                       ("v5", "v4 + v2", "elementwise")],
                outputs=["v5", "v3"],
                vars={"v0": Var((16, 4), f32), "v1": Var((16, 4), f32), "v2": Var((16, 4), f32),
                      "v3": Var((16, 4), f32, exact=False, pristine=False, zero_sign=False),
                      "v4": Var((16, 4), f32, pristine=False), "v5": Var((16, 4), f32, pristine=False)})
    outcome = check(p, ipus, cpu)
    assert outcome.status == "mismatch" and outcome.detail.startswith("v5 (exact, "), outcome
    small = minimise(p, ipus, cpu, "mismatch", budget=20)
    assert [name for name, *_ in small.lines] == ["v4", "v5"] and small.outputs == ["v5"]
    simple = sum(int(np.sum((v == 0) | (v == 1))) for v in small.inputs.values())
    assert simple > 0      # values set to 0 or 1 where the difference stays
    source = small.reproducer()
    assert "v5 = v4 + v2" in source and "arr(" in source
    results = []
    exec(compile(source.replace("print('ipu', ", "results.append(").replace("print('cpu', ", "results.append("),
                 "<reproducer>", "exec"), {"results": results})
    (got,), (want,) = results
    assert not np.array_equal(np.asarray(got), np.asarray(want))     # the reproducer shows the difference
