"""The executable cache (JAX_IPU_EXECUTABLE_CACHE, Poplar's
--executable_cache_path): a second process loads what the first compiled;
anything that changes the compiled program misses; concurrent writers
leave whole entries; unusable entries are compiled again, never run."""
from __future__ import annotations

import glob
import os
import struct
import subprocess
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.lib import _jax
from jaxlib._jax import CompileOptions
from jaxlib.mlir.dialects import stablehlo

from helpers import rewrite_saved_program, run_python
from jax_ipu import config as config_lib
from jax_ipu.graph import serialize
from jax_ipu.pjrt.cache import SUFFIX
from jax_ipu.pjrt.client import Client

_PROGRAM = """
import jax, jax.numpy as jnp, numpy as np, jax_ipu.compiler
from jax_ipu.pjrt import client
compiled = []
original = jax_ipu.compiler.compile_module
def counted(*args, **kwargs):
    compiled.append(1)
    return original(*args, **kwargs)
jax_ipu.compiler.compile_module = counted
x = jax.device_put(np.linspace(-1, 1, 64, dtype=np.float32).reshape(8, 8), jax.devices("ipu")[0])
y = jax.jit(lambda x: jnp.tanh(x @ x.T).sum(0) * 3)(x)
print(repr((np.asarray(y).tolist(), len(compiled), client.CURRENT.cache.stats)))
"""


def _run(env: dict) -> tuple:
    done = run_python(_PROGRAM, **env)
    assert done.returncode == 0, done.stderr[-3000:]
    return eval(done.stdout.strip().splitlines()[-1])


def test_a_second_process_loads_instead_of_compiling(tmp_path):
    values, compiles, stats = _run({"JAX_IPU_EXECUTABLE_CACHE": str(tmp_path)})
    assert compiles == 1 and stats == {"hits": 0, "misses": 1, "stored": 1, "rejected": 0}
    assert len(glob.glob(str(tmp_path / f"*{SUFFIX}"))) == 1
    again, compiles, stats = _run({"TF_POPLAR_FLAGS": f"--executable_cache_path={tmp_path}"})   # Poplar's spelling
    assert compiles == 0 and stats == {"hits": 1, "misses": 0, "stored": 0, "rejected": 0}
    assert again == values
    x = np.linspace(-1, 1, 64, dtype=np.float32).reshape(8, 8)
    np.testing.assert_allclose(values, np.tanh(x @ x.T).sum(0) * 3, rtol=1e-5)


def test_concurrent_writers_leave_one_whole_entry(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_IPU", "TF_POPLAR"))}
    env.pop("JAX_PLATFORMS", None)
    env["JAX_IPU_EXECUTABLE_CACHE"] = str(tmp_path)
    writers = [subprocess.Popen([sys.executable, "-c", _PROGRAM], env=env, cwd=tempfile.gettempdir(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = []
    for w in writers:
        out, err = w.communicate(timeout=240)
        assert w.returncode == 0, err[-3000:]
        results.append(eval(out.strip().splitlines()[-1]))
    assert results[0][0] == results[1][0]
    assert len(glob.glob(str(tmp_path / f"*{SUFFIX}"))) == 1
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]
    values, compiles, stats = _run({"JAX_IPU_EXECUTABLE_CACHE": str(tmp_path)})
    assert compiles == 0 and stats["hits"] == 1 and values == results[0][0]


# In this process: clients of their own (other tile counts, targets), fed
# the bytes JAX would send.

def _code(f, *args) -> bytes:
    text = jax.jit(f).lower(*args).as_text()
    return _jax.mlir.serialize_portable_artifact(text, stablehlo.get_current_version())


CODE = _code(lambda x: jnp.sin(x) * 2 + x, np.ones((4, 4), np.float32))


def _options(**overrides) -> bytes:
    options = CompileOptions()
    options.env_option_overrides = list(overrides.items())
    return options.SerializeAsString()


def _client(directory, **env) -> Client:
    return Client(config_lib.from_environment({"JAX_IPU_EXECUTABLE_CACHE": str(directory), **env}))


def _compile(directory, options=None, **env):
    client = _client(directory, **env)
    try:
        executable = client.compile(CODE, "mlir", options or _options())
        x = np.arange(16, dtype=np.float32).reshape(4, 4)
        result = client.device(0).engine.run(executable.program, [x])[0]
        np.testing.assert_allclose(result, np.sin(x) * 2 + x, rtol=1e-5)
        return dict(client.cache.stats)
    finally:
        client.close()


@pytest.mark.parametrize("change", [
    {"JAX_IPU_MODEL_NUM_TILES": "64"},
    {"JAX_IPU_TARGET": "ipu21"},
    {"JAX_IPU_F64_AS_F32": "1"},
    {"JAX_IPU_ALLOW_OUT_OF_MEMORY": "1"},
    {"options": {"available_memory_proportion": "0.3"}},
])
def test_what_changes_the_program_misses(tmp_path, change):
    base = {"JAX_IPU_MODEL_NUM_TILES": "32"}
    assert _compile(tmp_path, **base)["stored"] == 1
    assert _compile(tmp_path, **base)["hits"] == 1
    options = _options(**change.pop("options", {}))
    stats = _compile(tmp_path, options, **{**base, **change})
    assert stats["hits"] == 0 and stats["stored"] == 1
    assert len(glob.glob(str(tmp_path / f"*{SUFFIX}"))) == 2


def _corrupt(data: bytes) -> bytes:
    data = bytearray(data)
    data[len(data) // 2] ^= 0xFF
    return bytes(data)


def _foreign(data: bytes) -> bytes:
    def other(header):
        header["plugin"] = "0.0.1+0123456789abcdef"
    return rewrite_saved_program(data, other)


@pytest.mark.parametrize("spoil, words", [
    (_corrupt, "checksum"),
    (lambda data: data[:len(data) // 3], "checksum"),
    (lambda data: b"", "too few"),
    (_foreign, "saved by jax-ipu 0.0.1"),
    (lambda data: data[:8] + struct.pack("<I", 1) + data[12:], f"program format 1, this jax-ipu reads format {serialize.FORMAT_VERSION}"),
    # The format before this one (7 saved outer reductions' intervals as rows).
    (lambda data: data[:8] + struct.pack("<I", serialize.FORMAT_VERSION - 1) + data[12:],
     f"program format {serialize.FORMAT_VERSION - 1}, this jax-ipu reads format {serialize.FORMAT_VERSION}"),
])
def test_an_unusable_entry_is_compiled_again_with_a_warning(tmp_path, spoil, words):
    env = {"JAX_IPU_MODEL_NUM_TILES": "32"}
    _compile(tmp_path, **env)
    entry, = glob.glob(str(tmp_path / f"*{SUFFIX}"))
    with open(entry, "rb") as f:
        good = f.read()
    with open(entry, "wb") as f:
        f.write(spoil(good))
    with pytest.warns(RuntimeWarning, match=f"cannot be used.*{words}.*compiling the program again"):
        stats = _compile(tmp_path, **env)       # and its results are checked right
    assert stats == {"hits": 0, "misses": 0, "stored": 1, "rejected": 1}
    with open(entry, "rb") as f:
        assert serialize.loads(f.read())[0].num_tiles == 32    # replaced by a good entry
    assert _compile(tmp_path, **env)["hits"] == 1
