"""Models split over IPUs by NamedSharding in jit (Megatron tensor
parallelism, ZeRO-1): values match XLA:CPU, each IPU holds and computes on
its shards, no split weight is ever whole on an IPU (cases in
model_parallel_cases.py), on 2 IPUs here and on 4 in a subprocess."""
import os

import model_parallel_cases
import pytest

from helpers import run_python

CASES = model_parallel_cases.cases(2)


@pytest.mark.parametrize("name", sorted(CASES))
def test_split_model_on_two_ipus(ipus, name):
    figures = model_parallel_cases.check(name, CASES[name], ipus)
    assert figures["argument_bytes_per_ipu"] < figures["argument_bytes_whole"]


def test_split_models_on_four_ipus():
    here = os.path.dirname(os.path.abspath(__file__))
    proc = run_python(f"import runpy; runpy.run_path({os.path.join(here, 'model_parallel_cases.py')!r}, "
                      "run_name='__main__')", path=[here], JAX_IPU_DEVICE_COUNT="4")
    lines = [line for line in proc.stdout.splitlines() if line.startswith(("OK", "FAIL"))]
    assert len(lines) == len(CASES) and all(line.startswith("OK") for line in lines), \
        proc.stdout + proc.stderr[-3000:]
