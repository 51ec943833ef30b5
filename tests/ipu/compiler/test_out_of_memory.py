"""Out of memory through JAX on a small modelled IPU (JAX_IPU_MODEL_NUM_TILES):
a clear compile error, or with JAX_IPU_ALLOW_OUT_OF_MEMORY a run whose
profile shows by how much the program does not fit."""
from __future__ import annotations

import json
import re

from helpers import run_python

PROGRAM = """
import jax, jax.numpy as jnp, numpy as np
x = jax.device_put(np.zeros((512, 1024), np.float32), jax.devices("ipu")[0])   # fits; with its result it does not
f = jax.jit(lambda a: jnp.tanh(a * 2 + 1))
try:
    print("RESULT", float(f(x)[0, 0]))
except Exception as exc:
    print("ERROR", type(exc).__name__, exc)
"""


def test_out_of_memory_names_tile_bytes_and_largest_tensors():
    done = run_python(PROGRAM, JAX_IPU_MODEL_NUM_TILES="4")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "ERROR" in out and "RESULT" not in out
    match = re.search(r"out of memory on tile (\d+) of IPU Model ipu2 \(4 tiles, 624 KiB/tile.*?\): it needs "
                      r"(\d+) bytes but has (\d+)", out)
    assert match, out
    assert int(match.group(2)) > int(match.group(3)) == 624 * 1024
    assert "Largest tensors there: argument 0 float32[512, 1024]" in out
    for advice in ("JAX_IPU_MODEL_NUM_TILES", "available_memory_proportion"):
        assert advice in out


STREAMED = """
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import SingleDeviceSharding
ipu = jax.devices("ipu")[0]
m = jax.device_put(np.zeros((1024, 1024), np.float32), SingleDeviceSharding(ipu, memory_kind="pinned_host"))
x = jax.device_put(np.zeros((512, 1024), np.float32), ipu)
f = jax.jit(lambda m, a: (m, jnp.tanh(a * 2 + 1)))
try:
    print("RESULT", float(f(m, x)[1][0, 0]))
except Exception as exc:
    print("ERROR", type(exc).__name__, exc)
"""


def test_out_of_memory_names_no_tensor_in_streaming_memory():
    """A larger array in streaming memory takes no tile's SRAM: the error
    names the arrays in SRAM, as does an allowed run's profile."""
    done = run_python(STREAMED, JAX_IPU_MODEL_NUM_TILES="4")
    assert done.returncode == 0, done.stderr
    assert "Largest tensors there: argument 1 float32[512, 1024]" in done.stdout, done.stdout
    assert "[1024, 1024]" not in done.stdout, done.stdout


def test_allow_out_of_memory_runs_and_profiles(tmp_path):
    done = run_python(PROGRAM, JAX_IPU_MODEL_NUM_TILES="4", JAX_IPU_ALLOW_OUT_OF_MEMORY="1",
                      JAX_IPU_PROFILE=str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "RESULT" in done.stdout and "does not fit" in done.stderr
    (path,) = tmp_path.glob("jit__lambda-*[0-9].json")     # [0, 0] is a program of its own; no timeline
    memory = json.loads(path.read_text())["memory"]
    assert not memory["fits"] and memory["tiles_over_limit"] >= 1
    assert memory["max_bytes"] > memory["bytes_per_tile"] == 624 * 1024
    assert memory["largest_tensors_on_max_tile"][0]["shape"] == [512, 1024]
    report = run_python(f"from jax_ipu import cli; cli.main(['report', {str(path)!r}])")
    assert "DOES NOT FIT" in report.stdout


def test_a_tensor_bigger_than_the_whole_ipu_fails_at_once_without_host_blowup():
    """A 2**30-element intermediate took the host over 24 GB (the process was
    killed) while its tile mapping was costed: it now fails as it is made,
    with a clear error, using little host memory."""
    result = run_python("""
import jax, jax.numpy as jnp, numpy as np
x = jax.device_put(np.ones(4, np.float32), jax.devices('ipu')[0])
try:
    jax.jit(lambda x: jnp.broadcast_to(x[0], (2 ** 30,)).sum())(x)
except Exception as e:
    print('ERROR', e)
# VmHWM: this process's peak (ru_maxrss would keep the forking parent's across exec)
print('RSS_MB', next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM')) // 1024)
""")
    assert result.returncode == 0, result.stderr
    assert "ERROR RESOURCE_EXHAUSTED: out of memory: " in result.stdout, result.stdout
    assert "float32[1073741824] takes 4,294,967,296 bytes, more than all of IPU Model ipu2" in result.stdout, \
        result.stdout
    assert int(result.stdout.split("RSS_MB")[1]) < 2000, result.stdout


def test_compiler_options_set_the_matmul_planners_memory_share():
    # compile(compiler_options=...) reaches the planner: a lower
    # available_memory_proportion plans the product in serial steps with a
    # lower peak (the out-of-memory advice); unknown options and bad values
    # are refused, as XLA:CPU refuses them.
    proc = run_python("""
import jax, numpy as np
from jax_ipu.pjrt import client
ipu = jax.devices("ipu")[0]
x = np.random.default_rng(0).standard_normal((384, 384)).astype(np.float32)
a = jax.device_put(x, ipu)
f = jax.jit(lambda a: a @ a)
peaks = {}
for p in (0.1, 0.6):
    out = f.lower(a).compile(compiler_options={"available_memory_proportion": p})(a)
    np.testing.assert_allclose(np.asarray(out), x @ x, rtol=1e-4, atol=1e-3)
    peaks[p] = client.CURRENT.device(0).last_program.memory.max_bytes
assert peaks[0.1] < 0.6 * peaks[0.6], peaks
for options, message in [({"bogus": 1}, "No such compile option: 'bogus'"),
                         ({"available_memory_proportion": 2}, "expected 0 < p <= 1"),
                         ({"allow_out_of_memory": "maybe"}, "expected true or false")]:
    try:
        f.lower(a).compile(compiler_options=options)
        raise SystemExit(f"{options} compiled")
    except jax.errors.JaxRuntimeError as error:
        assert message in str(error), error
print("ok")
""", JAX_IPU_MODEL_NUM_TILES="16")
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]


def test_a_product_no_split_fits_takes_its_lowest_peak_serial_plan():
    # At a proportion no serial split meets, the product is computed in the
    # serial blocks with the lowest peak (it fits the tiles), not as the
    # whole product (which did not: out of memory).
    proc = run_python("""
import jax, numpy as np
from jax_ipu.pjrt import client
ipu = jax.devices("ipu")[0]
x = np.random.default_rng(0).standard_normal((512, 512)).astype(np.float32)
a = jax.device_put(x, ipu)
f = jax.jit(lambda a: a @ a)
out = f.lower(a).compile(compiler_options={"available_memory_proportion": 0.1})(a)
np.testing.assert_allclose(np.asarray(out), x @ x, rtol=1e-4, atol=1e-3)
program = client.CURRENT.device(0).last_program
assert program.memory.fits and sum("matmul" in s.compute_set.name for s in program.body.steps
                                   if hasattr(s, "compute_set")) >= 4
print("ok")
""", JAX_IPU_MODEL_NUM_TILES="16")
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]
