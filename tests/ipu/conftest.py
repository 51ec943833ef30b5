"""Shared fixtures. The tests run against the installed plugin, as a user
would: JAX discovers it through its jax_plugins entry point."""
import os

# Two modelled IPUs, so that device-to-device copies and placement on a
# second device are tested; tests of the defaults run in subprocesses.
os.environ.setdefault("JAX_IPU_DEVICE_COUNT", "2")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

# Every dtype the IPU holds.
IPU_DTYPES = [np.float32, np.float16, np.int32, np.uint32, np.int16, np.uint16,
              np.int8, np.uint8, np.bool_]


def pytest_addoption(parser):
    parser.addoption("--fuzz-programs", type=int, default=None,
                     help="programs for `pytest -m fuzz` (default: JAX_IPU_FUZZ_PROGRAMS, else 5000)")
    parser.addoption("--fuzz-seed", type=int, default=None,
                     help="first seed for `pytest -m fuzz` (default: JAX_IPU_FUZZ_SEED, else 0)")


@pytest.fixture(scope="session")
def ipus():
    return jax.devices("ipu")


@pytest.fixture(scope="session")
def ipu(ipus):
    return ipus[0]


@pytest.fixture(scope="session")
def cpu():
    return jax.devices("cpu")[0]


def run_on(device, fn, *args):
    """fn jitted and run on `device`: its results as a pytree of numpy arrays."""
    return jax.tree.map(np.asarray, jax.jit(fn)(*jax.device_put(args, device)))


def on_cpu(fn, *args):
    """The reference: fn on XLA:CPU (run_on the CPU device)."""
    return run_on(jax.devices("cpu")[0], fn, *args)


def random_array(rng: np.random.Generator, shape, dtype) -> np.ndarray:
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(max(info.min, -100), min(info.max, 100), size=shape, endpoint=True).astype(dtype)


def run_python(code: str, **env) -> "subprocess.CompletedProcess":
    """Runs `code` in a fresh interpreter with extra environment variables."""
    import subprocess
    import sys
    import tempfile
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_IPU", "TF_POPLAR"))}
    full_env.pop("JAX_PLATFORMS", None)
    full_env.update(env)
    # Run outside the source tree, so that the installed jax_ipu is imported.
    return subprocess.run([sys.executable, "-c", code], env=full_env, capture_output=True,
                          text=True, timeout=240, cwd=tempfile.gettempdir())
