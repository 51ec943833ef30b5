"""Indexing (stablehlo.gather / scatter / dynamic_slice /
dynamic_update_slice, select and clamp with scalars) through real JAX
programs on the IPU Model, against XLA:CPU: exact, as they move data."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from helpers import assert_matches_cpu, random_array, run_ipu

DTYPES = [np.float32, np.float16, np.int32, np.uint8, np.bool_]


def ids(op):
    return lambda d: f"stablehlo.{op}-{np.dtype(d).name}"


@pytest.mark.parametrize("dtype", DTYPES, ids=ids("gather"))
@pytest.mark.parametrize("index", [np.array([0, 3, 5, -1, -6, 7]), np.array([[1, 2], [4, 0]])], ids=["1d", "2d"])
def test_take_rows(dtype, index):
    x = random_array(np.random.default_rng(0), (6, 3), dtype)
    assert_matches_cpu(lambda x, i: x[i], x, index.astype(np.int32), exact=True)


@pytest.mark.parametrize("mode", ["clip", "fill", "promise_in_bounds"], ids=lambda m: f"stablehlo.gather-{m}")
def test_take_modes(mode):
    x = np.arange(10, dtype=np.float32)
    i = np.array([0, 9, 12, -1, -13, 4], np.int32) if mode != "promise_in_bounds" else np.array([0, 9, 3], np.int32)
    assert_matches_cpu(lambda x, i: x.at[i].get(mode=mode, fill_value=-5.0 if mode == "fill" else None), x, i,
                       exact=True)


def test_gather_clamps_slices():
    x = np.arange(40, dtype=np.int32).reshape(5, 8)
    assert_matches_cpu(lambda x, i: lax.dynamic_slice(x, (i[0], i[1]), (3, 4)), x, np.array([4, -2], np.int32),
                       exact=True)
    dn = lax.GatherDimensionNumbers(offset_dims=(1,), collapsed_slice_dims=(0,), start_index_map=(0, 1))
    assert_matches_cpu(lambda x, i: lax.gather(x, i, dn, (1, 3), mode="clip"), x,
                       np.array([[0, 7], [9, 2], [-4, -4]], np.int32), exact=True)


def test_gather_with_batching_dims():
    x = np.arange(2 * 5 * 3, dtype=np.float32).reshape(2, 5, 3)
    i = np.array([[1, 4, 0], [3, 3, 2]], np.int32)[..., None]
    dn = lax.GatherDimensionNumbers(offset_dims=(2,), collapsed_slice_dims=(1,), start_index_map=(1,),
                                    operand_batching_dims=(0,), start_indices_batching_dims=(0,))
    assert_matches_cpu(lambda x, i: lax.gather(x, i, dn, (1, 1, 3), mode="clip"), x, i, exact=True)
    assert_matches_cpu(lambda x, i: jax.vmap(lambda r, j: r[j])(x, i[..., 0]), x, i, exact=True)


def test_take_along_axis_and_advanced_indexing():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 5, 6)).astype(np.float32)
    i = rng.integers(0, 5, (4, 3, 6)).astype(np.int32)
    assert_matches_cpu(lambda x, i: jnp.take_along_axis(x, i, axis=1), x, i, exact=True)
    assert_matches_cpu(lambda x: x[jnp.array([0, 3]), :, jnp.array([1, 5])], x, exact=True)
    assert_matches_cpu(lambda x: x[1:, jnp.array([4, 0, 2])][..., ::2], x, exact=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=ids("dynamic_slice"))
@pytest.mark.parametrize("start", [-3, 0, 2, 6], ids=str)
def test_dynamic_slice(dtype, start):
    x = random_array(np.random.default_rng(2), (7, 4), dtype)
    assert_matches_cpu(lambda x, s: lax.dynamic_slice(x, (s, s // 2), (3, 2)), x, np.int32(start), exact=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=ids("dynamic_update_slice"))
@pytest.mark.parametrize("start", [-3, 1, 6], ids=str)
def test_dynamic_update_slice(dtype, start):
    rng = np.random.default_rng(3)
    x, u = random_array(rng, (7, 4), dtype), random_array(rng, (3, 2), dtype)
    assert_matches_cpu(lambda x, u, s: lax.dynamic_update_slice(x, u, (s, jnp.int32(1))), x, u, np.int32(start),
                       exact=True)


SCATTER_MODES = ["set", "add", "mul", "min", "max"]


@pytest.mark.parametrize("how", SCATTER_MODES, ids=lambda m: f"stablehlo.scatter-{m}")
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32, np.uint8], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("mode", ["drop", "clip", "promise_in_bounds"])
def test_scatter_modes(how, dtype, mode):
    rng = np.random.default_rng(4)
    x = random_array(rng, (8, 3), dtype)
    i = np.array([1, 7, 1, 9, -2, 3] if mode != "promise_in_bounds" else [1, 7, 1, 3], np.int32)
    u = random_array(rng, (len(i), 3), dtype)
    tol = 2e-3 if np.dtype(dtype) == np.float16 and how in ("add", "mul") else 0
    assert_matches_cpu(lambda x, i, u: getattr(x.at[i], how)(u, mode=mode), x, i, u, rtol=tol, atol=tol)


def test_scatter_bool_and_unique_indices():
    x = np.zeros(6, bool)
    assert_matches_cpu(lambda x: x.at[jnp.array([1, 4])].set(True, unique_indices=True), x, exact=True)
    assert_matches_cpu(lambda x: x.at[jnp.array([1, 4, 1])].max(True), x, exact=True)
    assert_matches_cpu(lambda x: (~x).at[jnp.array([1, 4, 1])].min(False), x, exact=True)
    y = np.arange(6, dtype=np.float32)
    assert_matches_cpu(lambda y: y.at[jnp.array([5, 0])].add(10.0, indices_are_sorted=True, unique_indices=True), y,
                       exact=True)


def test_scatter_general_body_and_batching():
    x = np.arange(5, dtype=np.float32)
    i = np.array([[1], [3], [1]], np.int32)
    u = np.array([2.0, -1.0, 3.0], np.float32)
    dn = lax.ScatterDimensionNumbers(update_window_dims=(), inserted_window_dims=(0,),
                                     scatter_dims_to_operand_dims=(0,))
    assert_matches_cpu(lambda x, i, u: lax.scatter_apply(x, i, lambda v: v * v - 1.0, dn, update_shape=(3,)), x, i, u,
                       exact=True)
    xs = np.zeros((2, 4), np.int32)
    idx = np.array([[0, 3], [2, 2]], np.int32)
    assert_matches_cpu(lambda xs, idx: jax.vmap(lambda r, j: r.at[j].add(5))(xs, idx), xs, idx, exact=True)


def test_scatter_window():
    x = np.zeros((5, 6), np.float32)
    u = np.ones((2, 3), np.float32) * np.array([[1], [2]], np.float32)
    assert_matches_cpu(lambda x, u, s: lax.dynamic_update_slice(x, u, (s, jnp.int32(4))), x, u, np.int32(4), exact=True)
    assert_matches_cpu(lambda x, u: x.at[jnp.array([0, 4]), 2:5].add(u), x, u, exact=True)


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.uint8], ids=ids("select"))
def test_select_scalar_pred_and_clamp_scalar_bounds(dtype):
    rng = np.random.default_rng(5)
    x, y = random_array(rng, (3, 4), dtype), random_array(rng, (3, 4), dtype)
    assert_matches_cpu(lambda p, x, y: lax.select(p, x, y), np.bool_(False), x, y, exact=True)
    assert_matches_cpu(lambda x: lax.clamp(np.array(1, dtype), x, np.array(50, dtype)), x, exact=True)


def test_indexing_inside_scan():
    table = np.arange(20, dtype=np.float32).reshape(10, 2)
    ids_ = np.array([3, 9, 0, 3], np.int32)
    assert_matches_cpu(lambda t, ids: lax.scan(lambda c, i: (c + t[i], c.at[0].set(i.astype(jnp.float32))),
                                               jnp.zeros(2), ids), table, ids_, exact=True)


def test_a_scalar_gather_keeps_its_shape_in_the_model():
    """A gather of one element (x[i] with a traced i) is 0-d in the Model's
    state, not 1-d: the engine's results have the program's shapes."""
    x, i = np.arange(10, dtype=np.float32), np.int32(7)
    got = run_ipu(lambda x, i: (x[i], x[i] * 2 + x[i - 1]), x, i)
    assert [g.shape for g in got] == [(), ()]
    assert [float(g) for g in got] == [7.0, 20.0]
