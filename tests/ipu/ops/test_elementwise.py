"""Element-wise ops, op by op and dtype by dtype, on the IPU Model against
JAX's CPU backend (XLA's integer and conversion semantics included)."""
from __future__ import annotations

import numpy as np
import pytest
from jax import lax

from helpers import SMALL, assert_matches_cpu, compile_fn, lower, values
from jax_ipu.compiler import compile_module
from jax_ipu.model.engine import Engine
from jax_ipu.ops import OPS, TRANSCENDENTAL

FLOATS = [np.float32, np.float16]
SIGNED = [np.int32, np.int16, np.int8]
UNSIGNED = [np.uint32, np.uint16, np.uint8]
INTS = SIGNED + UNSIGNED
NUMERIC = FLOATS + INTS
ALL = NUMERIC + [np.bool_]


# Ops with tests of their own below (attributes, several operands).
OWN_TESTS = {"compare", "select", "clamp", "convert", "bitcast_convert", "reduce_precision", "complex"}
# (complex64 and bfloat16: test_complex64.py, test_bfloat16.py)
KINDS = {"f": FLOATS, "i": SIGNED, "u": UNSIGNED, "b": [np.bool_], "c": []}


def _table(arity):
    """name -> (its lax reference, the dtypes it takes), from jax_ipu.ops."""
    return {name: (op.lax(lax), [t for kind in op.kinds for t in KINDS[kind]])
            for name, op in OPS.items() if op.arity == arity and name not in OWN_TESTS}


UNARY, BINARY = _table(1), _table(2)
# Transcendentals: numpy's and XLA's implementations differ by a few ulp
# (sqrt is correctly rounded in both).
LOOSE = TRANSCENDENTAL - {"sqrt"}


def _cases(table):
    return [pytest.param(name, dtype, id=f"{name}-{np.dtype(dtype).name}")
            for name, (_, dtypes) in table.items() for dtype in dtypes]


def _tol(name, dtype):
    if name in LOOSE and np.dtype(dtype) == np.float32:
        return {"rtol": 1e-5, "atol": 1e-6}
    return {}


@pytest.mark.parametrize("name, dtype", _cases(UNARY))
def test_unary(name, dtype):
    fn, _ = UNARY[name]
    positive = name in ("sqrt", "rsqrt", "log", "log_plus_one")
    assert_matches_cpu(fn, values(dtype, positive=positive), **_tol(name, dtype), target=SMALL)


def _second_operand(name, dtype):
    dtype = np.dtype(dtype)
    if name.startswith("shift"):
        return (np.arange(1001) % (dtype.itemsize * 8 + 3)).astype(dtype)
    return values(dtype, seed=1)


@pytest.mark.parametrize("name, dtype", _cases(BINARY))
def test_binary(name, dtype):
    fn, _ = BINARY[name]
    assert_matches_cpu(fn, values(dtype), _second_operand(name, dtype), **_tol(name, dtype), target=SMALL)


@pytest.mark.parametrize("dtype", ALL, ids=lambda d: np.dtype(d).name)
def test_compare_every_direction(dtype):
    x, y = values(dtype), values(dtype, seed=1)
    y[::3] = x[::3]
    assert_matches_cpu(lambda a, b: (a == b, a != b, a < b, a <= b, a > b, a >= b), x, y, target=SMALL)


def test_total_order_compare():
    """TOTALORDER (what sort comparators use): -NaN < -inf < -1 < -0 < 0 < 1 < inf < NaN."""
    order = [-np.nan, -np.inf, -1.0, -0.0, 0.0, 1.0, np.inf, np.nan]
    x = np.array(order, np.float32)
    rank = np.arange(len(order))
    for direction, expected in (("LT", rank[:, None] < rank), ("EQ", rank[:, None] == rank),
                                ("GE", rank[:, None] >= rank)):
        module = lower(lax.lt, x[:, None] * np.ones((1, 8), np.float32), np.ones((8, 8), np.float32) * x)
        (compare,) = [op for op in module.main.body.ops if op.name == "compare"]
        compare.attrs.update(comparison_direction=direction, compare_type="TOTALORDER")
        a, b = np.broadcast_arrays(x[:, None], x[None, :])
        out = Engine(SMALL).run(compile_module(module, SMALL), [a.copy(), b.copy()])
        np.testing.assert_array_equal(out[0], expected)


def test_integer_power_follows_xla():
    """stablehlo.power on integers (JAX itself emits multiplies instead)."""
    base = np.array([2, -2, 3, 1, -1, -1, 0, 5, 2], np.int32)
    exponent = np.array([10, 3, 0, -5, -3, -2, 0, -1, 31], np.int32)
    module = lower(lax.add, base, exponent)
    module.main.body.ops[0].name = "power"
    out = Engine(SMALL).run(compile_module(module, SMALL), [base, exponent])
    np.testing.assert_array_equal(out[0], [1024, -8, 1, 1, -1, 1, 1, 0, -2147483648])


@pytest.mark.parametrize("dtype", ALL, ids=lambda d: np.dtype(d).name)
def test_select_with_array_and_scalar_predicate(dtype):
    x, y = values(dtype), values(dtype, seed=1)
    p = values(np.bool_, seed=2)
    assert_matches_cpu(lax.select, p, x, y, target=SMALL)
    assert_matches_cpu(lambda p, a, b: lax.select(p, a, b), np.bool_(True), x[:5], y[:5], target=SMALL)


@pytest.mark.parametrize("dtype", NUMERIC, ids=lambda d: np.dtype(d).name)
def test_clamp(dtype):
    x = values(dtype)
    lo, hi = np.array(-3).astype(dtype) if np.dtype(dtype).kind != "u" else np.array(2, dtype), np.array(50, dtype)
    assert_matches_cpu(lax.clamp, lo, x, hi, target=SMALL)
    assert_matches_cpu(lax.clamp, values(dtype, seed=3), x, values(dtype, seed=3) + np.array(5, dtype), target=SMALL)


@pytest.mark.parametrize("src", ALL, ids=lambda d: np.dtype(d).name)
def test_convert_to_every_type(src):
    """Float -> int truncates and saturates (NaN -> 0), as XLA:CPU."""
    x = values(src)
    assert_matches_cpu(lambda a: tuple(lax.convert_element_type(a, dst) for dst in ALL), x, target=SMALL)


@pytest.mark.parametrize("src, dst", [(np.float32, np.int32), (np.int32, np.float32), (np.uint32, np.int32),
                                      (np.float16, np.int16), (np.int8, np.uint8)])
def test_bitcast_convert(src, dst):
    assert_matches_cpu(lambda a: lax.bitcast_convert_type(a, dst), values(src), target=SMALL)


SHAPES = [(), (7,), (1001,), (2, 3, 4), (0,), (4, 0, 3)]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", ALL, ids=lambda d: np.dtype(d).name)
def test_fused_chain_over_shapes(shape, dtype):
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        def f(a, b):
            return (a ^ b) | ~a, a & b
    elif dtype.kind == "f":
        def f(a, b):
            return lax.max(a * b - 1, b) / 2, lax.exp(a * 0.01) > b
    else:
        def f(a, b):
            return lax.max(a * b - a, b) + 1, a < b
    x, y = values(dtype, shape), values(dtype, shape, seed=1)
    assert_matches_cpu(f, x, y, rtol=1e-5 if dtype == np.float32 else None, target=SMALL)


def test_chain_is_one_compute_set_with_one_vertex_per_tile():
    x = values(np.float32, (1001,), positive=True)
    program = compile_fn(lambda a: lax.sqrt(lax.exp(a * 0.1) + a * 2) - 1, x)
    from jax_ipu.graph.programs import Execute, leaves
    executes = [s for s in leaves(program.body) if isinstance(s, Execute)]
    assert len(executes) == 1
    cs = executes[0].compute_set
    tiles = [v.tile for v in cs.vertices]
    assert len(tiles) == len(set(tiles)) == SMALL.num_tiles   # 1001 f32 spread over all 16 tiles
    ops = [i.op for i in cs.kernel.instructions]
    assert ops == ["multiply", "exponential", "multiply", "add", "sqrt", "subtract"]


def test_chains_split_where_a_value_is_read_outside_them():
    x = values(np.float32, (64,))

    def f(a):
        s = (a * 2).sum()        # reads a*2: the first chain is sealed here
        return a * 2 + s, a * 3
    assert_matches_cpu(f, x, rtol=1e-5, target=SMALL)


@pytest.mark.parametrize("dtype", INTS, ids=lambda d: np.dtype(d).name)
def test_integer_division_edge_cases(dtype):
    """x / 0, INT_MIN / -1, signs of quotient and remainder: as XLA."""
    info = np.iinfo(dtype)
    pairs = [(7, 0), (0, 0), (7, 2), (info.max, 1), (info.max, 0), (info.min, 3)]
    if info.min:
        pairs += [(-7, 0), (7, -1), (-7, 2), (7, -2), (-7, -2), (info.min, -1), (info.min, 0)]
    x = np.array([p[0] for p in pairs]).astype(dtype)
    y = np.array([p[1] for p in pairs]).astype(dtype)
    assert_matches_cpu(lambda a, b: (lax.div(a, b), lax.rem(a, b)), x, y, target=SMALL)
