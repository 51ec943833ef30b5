"""Limits reached through JAX fail at once with a clear error: device_put
beyond an IPU's free memory (naming the sizes), copies between IPUs too,
an impossible JAX_IPU_DEVICE_COUNT (saying the limit), a huge stride-0
view before the host copies it, and host MemoryErrors in a transfer or a
run (RESOURCE_EXHAUSTED). (Found by differential fuzzing.)"""
from __future__ import annotations

import jax
import numpy as np
import pytest
from jax import lax

from helpers import run_python


def test_device_put_beyond_the_free_memory_fails_at_once_naming_the_sizes():
    result = run_python("""
import jax, numpy as np
ipu = jax.devices('ipu')[0]
limit = ipu.memory_stats()['bytes_limit']
kept = jax.device_put(np.ones(limit // 8, np.float32), ipu)        # half the memory
try:
    jax.device_put(np.ones(limit // 8 + 1024, np.float32), ipu)    # more than the other half
    print('ACCEPTED')
except Exception as e:
    print('ERROR', e)
print('IN USE', ipu.memory_stats()['bytes_in_use'] == limit // 2)
kept.delete()
x = jax.device_put(np.ones(limit // 8 + 1024, np.float32), ipu)    # fits once the first is gone
print('FITS', float(jax.jit(lambda v: v[0] + 1)(x)))
""", JAX_IPU_MODEL_NUM_TILES="8")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "ACCEPTED" not in out, out
    assert "ERROR RESOURCE_EXHAUSTED: device_put of float32[" in out and "bytes are in use" in out, out
    assert "IN USE True" in out and "FITS 2.0" in out, out


def test_copies_between_ipus_are_checked_too():
    result = run_python("""
import jax, numpy as np
a, b = jax.devices('ipu')[:2]
limit = b.memory_stats()['bytes_limit']
full = jax.device_put(np.ones(limit // 4 - 256, np.float32), b)
x = jax.device_put(np.ones(1024, np.float32), a)
try:
    jax.device_put(x, b)
    print('ACCEPTED')
except Exception as e:
    print('ERROR', e)
""", JAX_IPU_MODEL_NUM_TILES="8", JAX_IPU_DEVICE_COUNT="2")
    assert result.returncode == 0, result.stderr
    assert "ERROR RESOURCE_EXHAUSTED: a copy from IPU 0" in result.stdout, result.stdout


def test_an_impossible_device_count_is_refused_at_once_saying_the_limit():
    code = ("import time, jax\nt = time.perf_counter()\ntry:\n    jax.devices('ipu')\n    print('CREATED')\n"
            "except Exception as e:\n    print('ERROR', e)\nprint('SECONDS', time.perf_counter() - t)\n")
    result = run_python(code, JAX_IPU_DEVICE_COUNT="100000")
    assert result.returncode == 0, result.stderr
    assert "ERROR" in result.stdout and "JAX_IPU_DEVICE_COUNT='100000': at most 256" in result.stdout, result.stdout
    assert float(result.stdout.split("SECONDS")[1]) < 10
    result = run_python(code, JAX_IPU_DEVICE_COUNT="257")
    assert "at most 256" in result.stdout, result.stdout



def test_a_host_memory_error_in_a_transfer_is_resource_exhausted(ipu, monkeypatch):
    from jax_ipu.pjrt import client

    def no_memory(array, spec):
        raise MemoryError("Unable to allocate 3.64 TiB for an array")
    monkeypatch.setattr(client, "to_device", no_memory)
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"^RESOURCE_EXHAUSTED: MemoryError: Unable to allocate"):
        jax.device_put(np.ones(8, np.float32), ipu)


def test_a_huge_stride_0_view_is_refused_before_the_host_copies_it(ipu):
    view = np.lib.stride_tricks.as_strided(np.zeros(1, np.float32), shape=(10 ** 12,), strides=(0,))
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"^RESOURCE_EXHAUSTED: device_put of float32\[1000000000000\]"):
        jax.device_put(view, ipu)


def test_a_memory_error_while_running_is_resource_exhausted(ipu, monkeypatch):
    from jax_ipu.pjrt import client
    engine = client.CURRENT.device(ipu.id).engine
    f = jax.jit(lambda x: lax.fori_loop(0, 3, lambda i, c: c + 1, x))    # runs on the worker
    x = jax.device_put(np.zeros(2, np.float32), ipu)
    f(x).block_until_ready()

    def no_memory(*args, **kwargs):
        raise MemoryError("Unable to allocate 1.00 TiB")
    monkeypatch.setattr(engine, "run", no_memory)
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"^RESOURCE_EXHAUSTED: MemoryError"):
        np.asarray(f(x))
