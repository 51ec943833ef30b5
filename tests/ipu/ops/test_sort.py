"""stablehlo.sort (one or several operands, key and arbitrary
comparators), chlo.top_k and the jnp functions built on them, on the IPU
Model against XLA:CPU: exact, as sorting moves data."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from helpers import assert_matches_cpu, random_array, with_specials

DTYPES = [np.float32, np.float16, np.int32, np.uint8, np.bool_]


def ids(what):
    return lambda d: f"stablehlo.sort-{what}-{np.dtype(d).name}"


@pytest.mark.parametrize("dtype", DTYPES, ids=ids("jnp.sort"))
@pytest.mark.parametrize("shape,axis", [((37,), 0), ((4, 9), 1), ((5, 3, 6), 0), ((2, 70), -1)], ids=str)
def test_jnp_sort(dtype, shape, axis):
    x = with_specials(random_array(np.random.default_rng(0), shape, dtype))
    assert_matches_cpu(lambda x: jnp.sort(x, axis=axis), x, exact=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=ids("argsort"))
@pytest.mark.parametrize("descending", [False, True])
def test_argsort_is_stable(dtype, descending):
    x = with_specials(random_array(np.random.default_rng(1), (3, 40), dtype))
    assert_matches_cpu(lambda x: jnp.argsort(x, axis=1, descending=descending, stable=True), x, exact=True)


@pytest.mark.parametrize("num_keys", [1, 2, 3], ids=lambda k: f"stablehlo.sort-lax-keys{k}")
def test_lax_sort_several_operands(num_keys):
    rng = np.random.default_rng(2)
    a = rng.integers(0, 3, (5, 30)).astype(np.int32)
    b = rng.integers(0, 3, (5, 30)).astype(np.float16)
    c = rng.standard_normal((5, 30)).astype(np.float32)
    assert_matches_cpu(lambda a, b, c: lax.sort((a, b, c), dimension=1, num_keys=num_keys, is_stable=True),
                       a, b, c, exact=True)


def test_unstable_sort_of_distinct_keys():
    x = np.random.default_rng(3).permutation(50).astype(np.float32)
    assert_matches_cpu(lambda x: lax.sort((x, jnp.arange(50)), is_stable=False, num_keys=1), x, exact=True)


def test_lexsort_and_unique():
    rng = np.random.default_rng(4)
    k1, k2 = rng.integers(0, 4, 25).astype(np.int32), rng.integers(0, 4, 25).astype(np.int32)
    assert_matches_cpu(lambda a, b: jnp.lexsort((a, b)), k1, k2, exact=True)
    x = rng.integers(0, 6, 20).astype(np.int32)
    assert_matches_cpu(lambda x: jnp.unique(x, size=8, fill_value=-1), x, exact=True)
    assert_matches_cpu(lambda x: jnp.unique(x, size=8, fill_value=-1, return_index=True, return_counts=True), x,
                       exact=True)


@pytest.mark.parametrize("n", [1, 2, 7, 64, 100])
def test_merge_sort_with_arbitrary_comparator(n):
    """The engine's merge sort, by a comparator that is no single key
    (|x| first, then the sign), matches Python's stable sort."""
    import functools

    from jax_ipu.model.executors.indexing import merge_sort
    rows = np.random.default_rng(7).integers(-5, 6, (3, n)).astype(np.int32)

    def less(lhs, rhs):
        a, b = lhs[0], rhs[0]
        return (np.abs(a) < np.abs(b)) | ((np.abs(a) == np.abs(b)) & (a < b))
    perm = merge_sort([rows], less)
    for row, p in zip(rows, perm, strict=True):
        cmp = functools.cmp_to_key(lambda i, j, row=row: -1 if less([row[i]], [row[j]]) else
                                   (1 if less([row[j]], [row[i]]) else 0))
        assert list(p) == sorted(range(n), key=cmp)


def test_key_and_merge_comparators_are_detected():
    from jax_ipu.compiler import compile_module
    from jax_ipu.graph.programs import Execute, leaves
    from jax_ipu.stablehlo import import_module
    from jax_ipu.targets import get_target

    def sorts(f, *args):
        program = compile_module(import_module(jax.jit(f).lower(*args).as_text()), get_target("ipu2"))
        return [s.compute_set.name.split()[1] for s in leaves(program.body)
                if isinstance(s, Execute) and s.compute_set.name.startswith("sort")]
    x = jnp.ones((4, 8), jnp.float32)
    assert sorts(lambda x: jnp.sort(x, axis=1), x) == ["key"]
    assert sorts(lambda x: jnp.argsort(-x.astype(jnp.int32), axis=0), x) == ["key"]
    assert sorts(lambda x: lax.sort((x, x), num_keys=2), x) == ["merge"]


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32, np.uint8], ids=lambda d: f"chlo.top_k-{np.dtype(d).name}")
@pytest.mark.parametrize("k", [1, 4])
def test_top_k(dtype, k):
    x = with_specials(random_array(np.random.default_rng(5), (3, 12), dtype))
    assert_matches_cpu(lambda x: lax.top_k(x, k), x, exact=True)


def test_sort_inside_loop():
    x = np.random.default_rng(6).standard_normal(16).astype(np.float32)
    assert_matches_cpu(lambda x: lax.fori_loop(0, 3, lambda i, c: jnp.sort(i - c), x), x, exact=True)


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=lambda d: f"ApproxTopK-{np.dtype(d).name}")
def test_approx_max_k_and_min_k_are_exact_as_on_the_cpu(ipu, dtype):
    """lax.approx_max_k / approx_min_k (the ApproxTopK custom call) as
    XLA:CPU computes them: an exact top-k, ties included."""
    rng = np.random.default_rng(8)
    x = rng.standard_normal((6, 300)).astype(dtype)     # (its FLOAT compare leaves NaNs' places open)
    ties = rng.integers(0, 5, (4, 50)).astype(dtype)
    assert_matches_cpu(lambda x: lax.approx_max_k(x, 3), x, exact=True)
    assert_matches_cpu(lambda x: lax.approx_min_k(x, 4, reduction_dimension=0, recall_target=0.5), x, exact=True)
    assert_matches_cpu(lambda x: lax.approx_max_k(x, 4, aggregate_to_topk=False)[0], x, exact=True)   # (f16 has ties)
    assert_matches_cpu(jax.grad(lambda x: lax.approx_max_k(x, 3)[0].astype(jnp.float32).sum()), x, exact=True)
    # XLA:CPU's sort here is unstable: among ties, any order of the indices.
    values, indices = jax.jit(lambda x: lax.approx_max_k(x, 6))(jax.device_put(ties, ipu))
    want = -np.sort(-ties, axis=1)[:, :6]
    np.testing.assert_array_equal(np.asarray(values), want)
    np.testing.assert_array_equal(np.take_along_axis(ties, np.asarray(indices), axis=1), want)
    assert all(len(set(row)) == 6 for row in np.asarray(indices).tolist())


def test_a_comparator_that_is_no_order_still_permutes(ipu):
    """A FLOAT `<` comparator meets NaNs (no strict weak order): the
    result is still a permutation of the operands, kept together."""
    x = with_specials(np.random.default_rng(9).standard_normal((3, 200)).astype(np.float32))
    x[:, ::7] = np.nan

    def f(x):
        return lax.sort_p.bind(x, jnp.broadcast_to(jnp.arange(200, dtype=jnp.int32), x.shape), dimension=1,
                               is_stable=True, num_keys=1)
    values, index = (np.asarray(a) for a in jax.jit(f)(jax.device_put(x, ipu)))
    for row, v, i in zip(x, values, index, strict=True):
        assert sorted(i.tolist()) == list(range(200))
        np.testing.assert_array_equal(v, row[i])
