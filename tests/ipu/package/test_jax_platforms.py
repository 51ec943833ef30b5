"""JAX_PLATFORMS settings with the rest of JAX: host callbacks need JAX's CPU
backend, so JAX_PLATFORMS=ipu alone fails them (with a hint), and
JAX_PLATFORMS=ipu,cpu runs them with the IPU as JAX's default backend."""
from __future__ import annotations

import json

from helpers import run_python

PROGRAM = """
import json, jax, jax.numpy as jnp, numpy as np, jax_ipu
out = {"default": jax.default_backend(), "devices": [d.platform for d in jax.devices()]}

@jax.jit
def f(x):
    jax.debug.print("x = {}", x)
    y = jax.pure_callback(lambda a: np.asarray(a) * 3, jax.ShapeDtypeStruct((3,), jnp.float32), x)
    return x * 2 + y

x = np.arange(3, dtype=np.float32)
try:
    y = f(x)
    out["result"] = np.asarray(y).tolist()
    out["result_on"] = [d.platform for d in y.devices()]
except Exception as exc:
    out["error"] = f"{type(exc).__name__}: {exc}"
print("OUT", json.dumps(out))
"""


def _run(platforms: str) -> dict:
    done = run_python(PROGRAM, JAX_PLATFORMS=platforms)
    assert done.returncode == 0, done.stderr
    line = next(l for l in done.stdout.splitlines() if l.startswith("OUT "))
    return {**json.loads(line[4:]), "stdout": done.stdout}


def test_ipu_alone_fails_callbacks_with_a_hint():
    out = _run("ipu")
    assert out["default"] == "ipu" and set(out["devices"]) == {"ipu"}
    error = out["error"]
    # JAX's own words, then the plugin's: where, and what to set.
    assert error.startswith("JaxRuntimeError: INTERNAL: the host callback at"), error
    assert "failed to find a local CPU device" in error
    assert "set JAX_PLATFORMS=ipu,cpu instead" in error and "default backend" in error


def test_ipu_then_cpu_runs_callbacks_on_the_ipu_by_default():
    out = _run("ipu,cpu")
    assert "error" not in out, out.get("error")
    assert out["default"] == "ipu" and out["devices"][0] == "ipu" and out["result_on"] == ["ipu"]
    x = [0.0, 1.0, 2.0]
    assert out["result"] == [5 * v for v in x]                    # x * 2 + x * 3, exact in float32
    assert "x = [0. 1. 2.]" in out["stdout"]
