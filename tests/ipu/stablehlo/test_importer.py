"""jax_ipu.stablehlo: real JAX programs, as JAX sends them, -> jax_ipu.ir.

Nothing here runs on a device: programs are only lowered, for the CPU
platform (whatever the default backend is), from numpy inputs.
"""
from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from jaxlib.mlir.dialects import stablehlo

from jax_ipu import ir
from jax_ipu.errors import IpuCompileError, IpuUnimplementedError
from jax_ipu.ir_printer import format_module
from jax_ipu.stablehlo import deserialize, import_module, locations

THIS_FILE = os.path.basename(__file__)


def portable_artifact(text: str) -> bytes:
    """The bytes format JAX sends a plugin. (XLA's serializer, which JAX
    calls, first rewrites chlo ops into stablehlo ones; keeping them here
    tests more of the importer.)"""
    module = deserialize.parse(text)
    return stablehlo.serialize_portable_artifact(
        module, stablehlo.get_current_version(), allow_other_dialects=True)


@pytest.fixture(params=["portable", "text"])
def lower(request):
    """lower(f, *args, **jit_options) -> ir.Module, from either input form."""
    def run(f, *args, **jit_options) -> ir.Module:
        traced = jax.jit(f, **jit_options).trace(*args)
        text = traced.lower(lowering_platforms=("cpu",)).as_text(debug_info=True)
        return import_module(portable_artifact(text) if request.param == "portable" else text)
    return run


def walk(block: ir.Block):
    for op in block.ops:
        yield op
        for region in op.regions:
            yield from walk(region)


def ops_named(module: ir.Module, name: str) -> list[ir.Op]:
    return [op for f in module.functions.values() for op in walk(f.body) if op.name == name]


def the_op(module: ir.Module, name: str) -> ir.Op:
    found = ops_named(module, name)
    assert found, f"no {name} in\n{format_module(module)}"
    return found[0]


def _ones(shape, dtype=np.float32):
    return np.ones(shape, dtype)


def _zeros(shape, dtype=np.float32):
    return np.zeros(shape, dtype)


def _eye(n):
    return np.eye(n, dtype=np.float32)


X = np.arange(12, dtype=np.float32).reshape(3, 4)


@pytest.mark.parametrize("f, args, op_name", [
    (jnp.sin, (X,), "sine"),
    (jnp.exp, (X,), "exponential"),
    (jnp.log1p, (X,), "log_plus_one"),
    (lax.erf, (X,), "chlo.erf"),
    (lambda x: jnp.where(x > 2, x, 0.0), (X,), "select"),
    (lambda x: x.astype(jnp.int8), (X,), "convert"),
    (lambda x: lax.bitcast_convert_type(x, jnp.int32), (X,), "bitcast_convert"),
    (lambda x: x.reshape(4, 3), (X,), "reshape"),
    (lambda x: x.T, (X,), "transpose"),
    (lambda x: x[1:3], (X,), "slice"),
    (lambda x: x[::-1], (X,), "reverse"),
    (lambda x: jnp.concatenate([x, x]), (X,), "concatenate"),
    (lambda: jnp.arange(5), (), "iota"),
    (lambda x: jnp.pad(x, 1), (X,), "pad"),
    (lambda x: lax.population_count(x), (_ones(3, jnp.uint32),), "popcnt"),
    (lambda x: lax.top_k(x, 2), (_ones(5),), "chlo.top_k"),
    (jnp.linalg.solve, (_eye(3), _ones(3)), "custom_call"),
    (jax.nn.softmax, (X,), "reduce"),
    (jax.nn.gelu, (X,), "tanh"),
    (lambda x, i: lax.dynamic_slice(x, (i, 0), (2, 2)), (X, 1), "dynamic_slice"),
])
def test_op_names_drop_only_the_stablehlo_prefix(lower, f, args, op_name):
    module = lower(f, *args)
    assert the_op(module, op_name).name == op_name


@pytest.mark.parametrize("dtype, shape, element_type", [
    (jnp.float32, (2, 3), "f32"),
    (jnp.float16, (4,), "f16"),
    (jnp.bfloat16, (4,), "bf16"),
    (jnp.int8, (2, 2), "i8"),
    (jnp.uint32, (), "ui32"),
    (jnp.bool_, (3,), "i1"),
    (jnp.complex64, (2,), "complex<f32>"),
])
def test_argument_and_result_types(lower, dtype, shape, element_type):
    module = lower(lambda x: (x, x.reshape(-1)), _zeros(shape, dtype))
    expected = ir.TensorType(shape, ir.ELEMENT_TYPES[element_type])
    size = int(np.prod(shape))
    assert module.main.arg_types == [expected]
    assert module.main.result_types == [expected, ir.TensorType((size,), expected.dtype)]
    assert module.main.body.results[0] is module.main.body.args[0]


def test_pytrees_flatten_into_arguments(lower):
    module = lower(lambda d: {"a": d["x"] + 1, "b": (d["y"], d["x"] * 2)},
                   {"x": _ones(3), "y": np.int8(3)})
    assert [str(t) for t in module.main.arg_types] == ["tensor<3xf32>", "tensor<i8>"]
    assert len(module.main.result_types) == 3


@pytest.mark.parametrize("value", [
    np.full((2, 3), 1.5, np.float32),                         # splat
    np.array([True, False, True]),                            # i1, bit-packed by MLIR
    np.full((4,), True),                                      # i1 splat
    np.array([1.0, 2.5, -np.inf], np.float16),
    np.array([1.0, 0.33, np.nan], ml_dtypes.bfloat16),        # the bindings refuse bf16
    np.full((2, 2), 0.5, ml_dtypes.bfloat16),
    np.array(-0.99609, ml_dtypes.bfloat16),                   # a 0-d bf16 splat
    np.array(1 + 2j, np.complex64),
    np.array([4294967295, 0, 7], np.uint32),
    np.array([-128, 127, 3], np.int8),
    np.array([1 + 2j, -3.5j], np.complex64),                  # the bindings cannot wrap it
    np.arange(300, dtype=np.float32) / 7,                     # printed as a hex blob
    np.arange(150) % 3 == 0,
    (np.arange(200) / 3).astype(ml_dtypes.bfloat16),
], ids=lambda v: f"{v.dtype}{list(v.shape)}")
def test_constants_become_numpy_arrays(lower, value):
    module = lower(lambda: jnp.asarray(value) == jnp.asarray(value))
    constants = [op.attrs["value"] for op in ops_named(module, "constant")
                 if op.attrs["value"].shape == value.shape]
    assert constants, format_module(module)
    assert constants[0].dtype == value.dtype
    assert constants[0].tobytes() == value.tobytes()  # exact, NaN included


@pytest.mark.parametrize("f, dtype, direction, compare_type", [
    (lambda a, b: a > b, jnp.float32, "GT", "FLOAT"),
    (lambda a, b: a < b, jnp.int32, "LT", "SIGNED"),
    (lambda a, b: a == b, jnp.uint32, "EQ", "UNSIGNED"),
    (lambda a, b: a != b, jnp.bool_, "NE", "UNSIGNED"),
    (lambda a, b: a >= b, jnp.float16, "GE", "FLOAT"),
])
def test_compare_enums_become_their_names(lower, f, dtype, direction, compare_type):
    x = _zeros(3, dtype)
    compare = the_op(lower(f, x, x), "compare")
    assert compare.attrs["comparison_direction"] == direction
    assert compare.attrs["compare_type"] == compare_type
    assert compare.results[0].type == ir.TensorType((3,), np.dtype(bool))


@pytest.mark.parametrize("f, args, dims", [
    (jnp.matmul, (_ones((2, 3)), _ones((3, 4))),
     ir.DotDimensionNumbers((), (), (1,), (0,))),
    (lambda a, b: jnp.einsum("bij,bjk->bik", a, b), (_ones((2, 3, 4)), _ones((2, 4, 5))),
     ir.DotDimensionNumbers((0,), (0,), (2,), (1,))),
    (jax.vmap(jnp.dot), (_ones((2, 3)), _ones((2, 3))),
     ir.DotDimensionNumbers((0,), (0,), (1,), (1,))),
])
def test_dot_general_dimension_numbers(lower, f, args, dims):
    dot = the_op(lower(f, *args), "dot_general")
    assert dot.attrs["dot_dimension_numbers"] == dims


def test_dot_precision_config(lower):
    f = lambda a, b: jnp.dot(a, b, precision=lax.Precision.HIGHEST)  # noqa: E731
    dot = the_op(lower(f, _ones((2, 3)), _ones((3, 4))), "dot_general")
    assert dot.attrs["precision_config"] == ("HIGHEST", "HIGHEST")


def test_gather_dimension_numbers(lower):
    gather = the_op(lower(lambda x, i: x[i], X, np.array([0, 2], np.int32)), "gather")
    assert gather.attrs["dimension_numbers"] == ir.GatherDimensionNumbers(
        offset_dims=(1,), collapsed_slice_dims=(0,), operand_batching_dims=(),
        start_indices_batching_dims=(), start_index_map=(0,), index_vector_dim=1)
    assert gather.attrs["slice_sizes"] == (1, 4)


def test_scatter_dimension_numbers_and_region(lower):
    scatter = the_op(lower(lambda x: x.at[1].set(5.0), X), "scatter")
    dims = scatter.attrs["scatter_dimension_numbers"]
    assert isinstance(dims, ir.ScatterDimensionNumbers)
    assert dims.inserted_window_dims == (0,)
    assert dims.scatter_dims_to_operand_dims == (0,)
    (update,) = scatter.regions
    assert update.results == [update.args[1]]  # "set" keeps the new value


def test_convolution_dimension_numbers(lower):
    f = lambda x, w: lax.conv_general_dilated(x, w, (1, 1), "SAME")  # noqa: E731
    conv = the_op(lower(f, _ones((1, 2, 5, 5)), _ones((3, 2, 3, 3))), "convolution")
    assert conv.attrs["dimension_numbers"] == ir.ConvDimensionNumbers(
        input_batch_dimension=0, input_feature_dimension=1, input_spatial_dimensions=(2, 3),
        kernel_input_feature_dimension=1, kernel_output_feature_dimension=0,
        kernel_spatial_dimensions=(2, 3), output_batch_dimension=0,
        output_feature_dimension=1, output_spatial_dimensions=(2, 3))
    # Portable artifacts leave out attributes at their default value (here
    # window_strides), so only non-default ones can be relied on.
    assert conv.attrs["feature_group_count"] == 1
    np.testing.assert_array_equal(conv.attrs["padding"], [[1, 1], [1, 1]])
    assert conv.results[0].type == ir.TensorType((1, 3, 5, 5), np.dtype(np.float32))


@pytest.mark.parametrize("f, args, op_name, region_arg_counts", [
    (lambda x: lax.fori_loop(0, 3, lambda i, v: v * 2, x), (X,), "while", [2, 2]),
    (lambda x: lax.scan(lambda c, v: (c + v, c * v), _zeros(4), x), (X,), "while", None),
    (lambda p, x: lax.cond(p, jnp.sin, jnp.cos, x), (True, X), "case", [0, 0]),
    (lambda i, x: lax.switch(i, [jnp.sin, jnp.cos, jnp.tanh], x), (1, X), "case", [0, 0, 0]),
    (jnp.sum, (X,), "reduce", [2]),
    (jnp.argmax, (X,), "reduce", [4]),
    (jnp.sort, (_ones(5),), "sort", [2]),
    (jnp.cumsum, (X,), "reduce_window", [2]),
    (jax.grad(lambda x: lax.reduce_window(x, -jnp.inf, lax.max, (2, 2), (1, 1), "VALID").sum()),
     (X,), "select_and_scatter", [2, 2]),
])
def test_regions_become_blocks(lower, f, args, op_name, region_arg_counts):
    op = the_op(lower(f, *args), op_name)
    if region_arg_counts is not None:
        assert [len(r.args) for r in op.regions] == region_arg_counts
    for region in op.regions:
        assert region.results, "every region returns something"


def test_while_condition_returns_a_predicate(lower):
    loop = the_op(lower(lambda x: lax.fori_loop(0, 3, lambda i, v: v * 2, x), X), "while")
    condition, body = loop.regions
    assert [r.type for r in condition.results] == [ir.TensorType((), np.dtype(bool))]
    assert [a.type for a in body.args] == [v.type for v in loop.operands]


def test_case_branches_may_use_outer_values(lower):
    module = lower(lambda p, x: lax.cond(p, jnp.sin, jnp.cos, x), True, X)
    false_branch, true_branch = the_op(module, "case").regions
    assert [op.name for op in true_branch.ops] == ["sine"]
    assert true_branch.ops[0].operands == [module.main.body.args[1]]


def test_calls_name_functions_of_the_module(lower):
    module = lower(lambda k: jax.random.uniform(k, (3,)), np.zeros(2, np.uint32))
    calls = ops_named(module, "call")
    assert calls
    for call in calls:
        callee = module.functions[call.attrs["callee"]]
        assert callee.arg_types == [v.type for v in call.operands]
        assert callee.result_types == [v.type for v in call.results]


def test_donated_arguments_alias_outputs(lower):
    module = lower(lambda x, y: (y * 2, x + 1), _ones(3), _ones(4), donate_argnums=0)
    assert module.main.arg_aliases == [1, None]
    assert module.main.arg_donors == [False, False]


def test_shardy_meshes_and_shardings(lower):
    sharding = NamedSharding(Mesh(np.array(jax.devices("cpu")[:1]), ("x",)), PartitionSpec("x"))

    def f(x, y):
        return lax.with_sharding_constraint(x, sharding) + y

    module = lower(f, _ones(4), _ones(4), in_shardings=(sharding, None), out_shardings=sharding)
    assert module.main.arg_shardings[0].startswith("#sdy.sharding<@mesh")
    assert module.main.arg_shardings[1] is None
    assert module.main.result_shardings[0].startswith("#sdy.sharding<@mesh")
    assert the_op(module, "sdy.sharding_constraint").attrs["sharding"].startswith("#sdy.sharding")


GSPMD_MODULE = """
module @jit_f attributes {mhlo.num_partitions = 2 : i32, mhlo.num_replicas = 4 : i32} {
  func.func public @main(%arg0: tensor<4xf32> {jax.buffer_donor = true, mhlo.sharding = "{replicated}"},
                         %arg1: tensor<ui8>) -> (tensor<4xf32> {mhlo.sharding = "{maximal device=0}"}) {
    %0 = stablehlo.abs %arg0 : tensor<4xf32> loc("my_script.py":12:4)
    return %0 : tensor<4xf32>
  }
}
"""


def test_function_attributes_from_text():
    module = import_module(GSPMD_MODULE)
    assert (module.num_replicas, module.num_partitions) == (4, 2)
    assert module.main.arg_donors == [True, False]
    assert module.main.arg_aliases == [None, None]
    assert module.main.arg_shardings == ["{replicated}", None]
    assert module.main.result_shardings == ["{maximal device=0}"]
    assert the_op(module, "abs").loc == "my_script.py:12:4"


def _located(x):
    return jnp.sin(x)  # test_locations_name_the_user_line looks for this line


def _outer(x):
    return _located(x) * 2


def test_locations_name_the_user_line(lower):
    sine = the_op(lower(_outer, X), "sine")
    line = _located.__code__.co_firstlineno + 1
    assert f"{THIS_FILE}:{line}:" in sine.loc
    assert "sin" in sine.loc and "_located" in sine.loc


@pytest.mark.parametrize("location, expected", [
    ('loc("jit(f)/sin"(callsite("g"("t.py":6:11 to :21) at callsite("f"("t.py":9:8 to :12) '
     'at "<module>"("t.py":12:10 to :70)))))', "t.py:6:11 (jit(f)/sin in g)"),
    ('loc("f"("t.py":3:1))', "t.py:3:1 (f)"),
    ('loc("t.py":3:1)', "t.py:3:1"),
    ('loc(fused["a.py":1:2, "b.py":3:4])', "a.py:1:2"),
    ('loc("transpose")', "transpose"),
    ("loc(unknown)", "unknown location"),
    (r'loc("my dir\\a\22b.py":5:6)', 'my dir\\a"b.py:5:6'),
])
def test_describe_location(location, expected):
    assert locations.describe(location) == expected


def test_format_module_prints_ops_regions_and_locations(lower):
    text = format_module(lower(_outer, X))
    assert "func @main(" in text
    assert "sine(" in text and THIS_FILE in text
    text = format_module(lower(jnp.sum, X))
    assert "reduce(" in text and "dimensions=[0, 1]" in text and "^(" in text


DYNAMIC = """
func.func @main(%a: tensor<?xf32>) -> tensor<?xf32> {
  %0 = stablehlo.abs %a : tensor<?xf32> loc("t.py":3:1)
  return %0 : tensor<?xf32>
}
"""
FLOAT8 = """
func.func @main(%a: tensor<2xf32>) -> tensor<2xf8E4M3FN> {
  %0 = stablehlo.convert %a : (tensor<2xf32>) -> tensor<2xf8E4M3FN> loc("t.py":3:1)
  return %0 : tensor<2xf8E4M3FN>
}
"""


@pytest.mark.parametrize("code, error, words", [
    (b"ML\xefRgarbage", IpuCompileError, ["cannot read"]),
    (b"ML\xefR\rStableHLO_v1.17.0\x00junk", IpuCompileError, ["cannot read"]),
    (b"\x00\xff\xfe", IpuCompileError, ["cannot read"]),
    ("module {", IpuCompileError, ["cannot read"]),
    (b"", IpuCompileError, ["main"]),
    (DYNAMIC, IpuUnimplementedError, ["tensor<?xf32>", "static shapes"]),
    (DYNAMIC.replace("%a: tensor<?xf32>", "%a: tensor<4xf32>").replace(
        "abs %a : tensor<?xf32>", "abs %a : (tensor<4xf32>) -> tensor<?xf32>"),
     IpuUnimplementedError, ["stablehlo.abs at t.py:3:1"]),
    (FLOAT8, IpuUnimplementedError, ["stablehlo.convert at t.py:3:1", "f8E4M3FN"]),
])
def test_bad_programs_raise_clear_errors(code, error, words):
    with pytest.raises(error) as raised:
        import_module(code)
    for word in words:
        assert word in str(raised.value)


def test_scalar_constants_of_bfloat16_are_read():
    """A 0-d bf16 constant (as jax.random.normal(..., bfloat16) has) is read
    into its 16 bits, not a numpy error; bfloat16 is emulated."""
    def f(x):
        return x.astype(ml_dtypes.bfloat16) * jnp.asarray(0.3, ml_dtypes.bfloat16)
    x = np.linspace(-3, 3, 7, dtype=np.float32)
    got = np.asarray(jax.jit(f)(jax.device_put(x, jax.devices("ipu")[0])))
    want = np.asarray(jax.jit(f)(jax.device_put(x, jax.devices("cpu")[0])))
    assert got.dtype == ml_dtypes.bfloat16 and (got.view(np.uint16) == want.view(np.uint16)).all()


def test_scalar_constants_of_absent_types_are_refused_clearly(ipu):
    """With emulation refused, the same program names the type."""
    with pytest.raises(Exception, match="the IPU has no bf16"):
        jax.jit(lambda x: x.astype(ml_dtypes.bfloat16) * jnp.asarray(0.5, ml_dtypes.bfloat16)).lower(
            jax.device_put(np.ones(3, np.float32), ipu)).compile(compiler_options={"emulate_types": False})
