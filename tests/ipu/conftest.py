"""Fixtures of the plugin's tests: the ipu and cpu devices, and the options
of the long fuzz run. Helpers (running a program on the IPU or the Model,
comparing with XLA:CPU, inputs with edge cases) are in helpers.py, which
tests import as `from helpers import ...` (tests/ipu is on pytest's
pythonpath, pyproject.toml); test files do not import each other. The
tests run against the installed plugin, as a user would: JAX discovers it
through its jax_plugins entry point."""
import os

# Two modelled IPUs, so that device-to-device copies and placement on a
# second device are tested; tests of the defaults run in subprocesses.
os.environ.setdefault("JAX_IPU_DEVICE_COUNT", "2")

import jax  # noqa: E402
import pytest  # noqa: E402


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
