"""Discovery, devices and the IPU Model's environment flags."""
import json

import jax
import pytest

from helpers import run_python

SHOW = ("import jax, json; d = jax.devices('ipu'); "
        "print(json.dumps({'n': len(d), 'kind': d[0].device_kind, 'repr': repr(d[0]), "
        "'platform': d[0].platform, 'default': jax.default_backend()}))")


def show(**env) -> dict:
    result = run_python(SHOW, **env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_discovered_without_importing_jax_ipu(ipus):
    # Registered by the jax_plugins entry point when JAX looked for backends.
    assert ipus and all(d.platform == "ipu" for d in ipus)
    assert jax.default_backend() == "cpu", "CPU must stay the default backend"


def test_device_kind_and_repr_name_model_target_and_tiles():
    info = show()
    assert info["n"] == 1
    assert info["platform"] == "ipu"
    assert info["kind"] == "IPU Model ipu2 (1472 tiles)"
    assert "IPU Model ipu2" in info["repr"] and "1472 tiles" in info["repr"]
    assert info["default"] == "cpu"


@pytest.mark.parametrize("env, n, tiles, target", [
    ({"JAX_IPU_DEVICE_COUNT": "4"}, 4, 1472, "ipu2"),
    ({"JAX_IPU_MODEL_NUM_TILES": "16", "JAX_IPU_USE_MODEL": "1"}, 1, 16, "ipu2"),
    ({"TF_POPLAR_FLAGS": "--use_ipu_model --ipu_model_tiles=8"}, 1, 8, "ipu2"),
    ({"JAX_IPU_TARGET": "ipu1"}, 1, 1216, "ipu1"),
    ({"JAX_IPU_TARGET": "ipu21", "JAX_IPU_DEVICE_COUNT": "2"}, 2, 1472, "ipu21"),
])
def test_environment_flags(env, n, tiles, target):
    info = show(**env)
    assert info["n"] == n
    assert info["kind"] == f"IPU Model {target} ({tiles} tiles)"


def test_jax_platforms_ipu_makes_ipu_the_default():
    info = show(JAX_PLATFORMS="ipu")
    assert info["default"] == "ipu"


@pytest.mark.parametrize("env, message", [
    ({"JAX_IPU_DEVICE_COUNT": "zero"}, "JAX_IPU_DEVICE_COUNT"),
    ({"JAX_IPU_USE_MODEL": "0"}, "IPU Model only"),
    ({"JAX_IPU_TARGET": "ipu9"}, "ipu9"),
])
def test_bad_flags_raise_clear_errors(env, message):
    result = run_python("import jax\ntry:\n    jax.devices('ipu')\nexcept Exception as e:\n"
                        "    print('ERROR', e)\n", **env)
    assert result.returncode == 0, result.stderr  # an exception, not an abort
    assert "ERROR" in result.stdout and message in result.stdout


def test_memory_stats_report_bytes_in_use_and_the_sram_limit(ipu):
    import numpy as np
    before = ipu.memory_stats()["bytes_in_use"]
    x = jax.device_put(np.zeros(1000, np.float32), ipu)
    stats = ipu.memory_stats()
    assert stats["bytes_in_use"] == before + 4000
    assert stats["bytes_limit"] == 1472 * 624 * 1024
    x.delete()
    assert ipu.memory_stats()["bytes_in_use"] == before
