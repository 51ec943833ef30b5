"""pmap, shard_map and jit of sharded arrays over 2 and 4 IPU Model devices,
against the CPU backend with as many devices (each side in a subprocess:
tests/ipu/multi_ipu/collective_cases.py holds the programs)."""
import os
import tempfile

import numpy as np
import pytest

from helpers import run_python

CASES = os.path.join(os.path.dirname(__file__), "collective_cases.py")
NAMES = [
    *(f"{how}_{c}" for how in ("pmap", "shard_map") for c in (
        "psum", "pmean", "pmax", "pmin", "all_gather", "all_gather_tiled", "all_to_all", "ppermute",
        "psum_scatter", "axis_index", "psum_in_loop", "ppermute_in_loop", "train_step")),
    "shard_map_named_shardings", "jit_sharded_out_shardings", "jit_sharded_layouts",
    "jit_sharded_sort", "jit_sharded_cumsum", "jit_sharded_concatenate",
    "pmap_psum_int", "pmap_pmax_int",
    "full_batch_step", "jit_sharded_forward", "jit_sharded_loss", "jit_sharded_grad", "jit_sharded_train_step",
    "jit_sharded_fori_loop", "jit_replicated_fori_loop", "jit_sharded_scan", "jit_sharded_while", "jit_sharded_cond",
    "jit_sharded_io_callback", "jit_sharded_ordered_io_callback", "jit_sharded_debug_callback_only",
    "pmap_infeed", "shard_map_infeed", "jit_sharded_infeed_loop",
    "jit_resharded_between_axes", "jit_out_sharding_other_axis",
]


def _results(platform: str, n: int) -> dict:
    out = os.path.join(tempfile.mkdtemp(), f"{platform}{n}.npz")
    env = {"PLATFORM": platform, "N": str(n), "OUT": out}
    if platform == "cpu":
        env.update(JAX_PLATFORMS="cpu", XLA_FLAGS=f"--xla_force_host_platform_device_count={n}")
    else:
        env.update(JAX_IPU_DEVICE_COUNT=str(n))
    proc = run_python(open(CASES).read(), **env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with np.load(out) as data:
        return dict(data)


@pytest.fixture(scope="module", params=[2, 4])
def both(request):
    n = request.param
    return n, _results("ipu", n), _results("cpu", n)


@pytest.mark.parametrize("name", NAMES)
def test_against_cpu(both, name):
    n, ipu, cpu = both
    assert f"{name}/error" not in ipu, str(ipu[f"{name}/error"])
    assert f"{name}/error" not in cpu, str(cpu[f"{name}/error"])
    keys = sorted(k for k in cpu if k.startswith(name + "/"))
    assert keys and keys == sorted(k for k in ipu if k.startswith(name + "/"))
    for k in keys:
        assert ipu[k].shape == cpu[k].shape and ipu[k].dtype == cpu[k].dtype, k
        if cpu[k].dtype.kind == "U":     # e.g. the sharding JAX gives a result
            assert ipu[k] == cpu[k], f"{k} on {n} devices"
            continue
        np.testing.assert_allclose(ipu[k], cpu[k], rtol=2e-5, atol=2e-5, err_msg=f"{k} on {n} devices")


def test_data_parallel_training_matches_one_device_full_batch(both):
    """The pmap'd step (pmean of per-device gradients) equals one device's
    step on the whole batch."""
    n, ipu, cpu = both
    for i in range(4):      # b1, w1, w2, loss
        on_device_0 = ipu[f"pmap_train_step/{i}"][0]
        np.testing.assert_allclose(on_device_0, cpu[f"full_batch_step/{i}"], rtol=1e-4, atol=1e-5)
