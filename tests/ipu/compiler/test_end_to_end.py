"""jax_ipu.compiler end to end on the IPU Model: real JAX programs, lowered
and imported, compiled, validated and run, against JAX's CPU backend.

The helpers (compile_fn, run_ipu, assert_matches_cpu) are helpers.py's."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from helpers import SMALL, assert_matches_cpu, compile_fn, lower, run_ipu
from jax_ipu.compiler import CompileOptions, compile_module
from jax_ipu.errors import IpuUnimplementedError
from jax_ipu.model.engine import Engine


def test_scale_and_shift_runs_as_one_compute_set():
    program = compile_fn(lambda x: x * 2 + 1, np.zeros(4, np.float32))
    out = Engine(SMALL).run(program, [np.arange(4, dtype=np.float32)])
    np.testing.assert_array_equal(out[0], [1, 3, 5, 7])
    assert "1 compute sets" in program.summary()


def test_program_interface():
    x = np.ones((3, 4), np.float32)
    program = compile_fn(lambda x, y: (x @ y.T, x + 1), x, x)
    assert [str(t) for t in program.input_types] == ["tensor<3x4xf32>"] * 2
    assert [str(t) for t in program.output_types] == ["tensor<3x3xf32>", "tensor<3x4xf32>"]
    costs = program.cost_analysis()
    assert set(costs) == {"flops", "bytes accessed", "transcendentals", "estimated_cycles",
                          "loops_with_unknown_trip_count", "estimated_cycles_per_unknown_loop_iteration"}
    assert costs["flops"] >= 2 * 3 * 3 * 4 and costs["estimated_cycles"] == program.cycles > 0
    assert program.memory.max_bytes <= SMALL.bytes_per_tile
    assert set(program.memory_stats()) == {"code", "arguments", "outputs", "aliased", "temporary", "peak", "streaming",
                                           "streaming_arguments", "streaming_outputs", "streaming_temporary"}
    assert "matmul" in program.summary()


def test_inlined_calls_and_identities():
    @jax.jit
    def inner(x):
        return jnp.sin(x) + 1

    def f(x):
        y = lax.optimization_barrier(inner(x) * 2)
        return inner(y), jnp.where(x > 0, x, -x)
    assert_matches_cpu(f, np.linspace(-3, 3, 11, dtype=np.float32), rtol=1e-5, target=SMALL)


@pytest.mark.parametrize("shardy", [True, False], ids=["sdy", "gspmd"])
def test_sharding_constraints_are_identities(shardy):
    from jax.sharding import Mesh, NamedSharding, PartitionSpec
    mesh = Mesh(np.array(jax.devices("cpu")[:1]), ("x",))
    sharding = NamedSharding(mesh, PartitionSpec("x"))

    def f(a):
        return lax.with_sharding_constraint(a * 2, sharding) + 1
    previous = jax.config.jax_use_shardy_partitioner
    jax.config.update("jax_use_shardy_partitioner", shardy)
    try:
        module = lower(f, np.ones(8, np.float32))
    finally:
        jax.config.update("jax_use_shardy_partitioner", previous)
    names = {op.name for op in module.main.body.ops}
    assert names & {"sdy.sharding_constraint", "custom_call"}
    program = compile_module(module, SMALL)
    out = Engine(SMALL).run(program, [np.arange(8, dtype=np.float32)])
    np.testing.assert_array_equal(out[0], np.arange(8) * 2 + 1)


def test_composites_run_their_decomposition():
    x = np.linspace(-3, 3, 101, dtype=np.float32)
    assert {op.name for op in lower(jax.scipy.special.erf, x).main.body.ops} == {"composite"}
    assert_matches_cpu(lambda a: (jax.scipy.special.erf(a), jax.nn.gelu(a, approximate=False),
                                  jnp.square(a)), x, rtol=1e-5, atol=1e-6, target=SMALL)


def test_outputs_that_are_inputs_or_repeated():
    x = np.arange(5, dtype=np.int32)
    out = run_ipu(lambda x: (x, x + 1, x + 1, jnp.int32(7)), x)
    np.testing.assert_array_equal(out[0], x)
    assert out[0] is not x
    np.testing.assert_array_equal(out[1], x + 1)
    assert out[1] is not out[2]
    assert out[3] == 7


@pytest.mark.parametrize("dtype", [np.float64, np.int64, np.uint64, "bfloat16", np.complex64])
def test_types_the_ipu_lacks_fail_naming_op_and_type(dtype):
    """(bfloat16 and complex64 when a program asks for native types only:
    they are emulated by default.)"""
    import ml_dtypes
    dtype = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    with jax.enable_x64(True) if dtype.itemsize == 8 and dtype.kind != "c" else _nothing():
        module = lower(lambda x: x + x, np.ones(3, dtype))
    with pytest.raises(IpuUnimplementedError) as info:
        compile_module(module, SMALL, CompileOptions(emulate_types=False))
    message = str(info.value)
    assert "stablehlo.add at" in message and "test_end_to_end.py" in message
    if dtype.itemsize == 8 and dtype.kind in "fiu":
        assert "JAX_ENABLE_X64" in message


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_unsupported_op_names_op_location_and_advice():
    module = lower(lambda x: jnp.sin(x), np.ones(5, np.float32))
    op = module.main.body.ops[-1]
    op.name = "real_dynamic_slice"  # a StableHLO op jax-ipu does not support
    with pytest.raises(IpuUnimplementedError) as info:
        compile_module(module, SMALL)
    message = str(info.value)
    assert message.startswith("stablehlo.real_dynamic_slice at ") and "test_end_to_end.py" in message
    assert "not supported by jax-ipu yet" in message and "issue" in message


def test_unknown_custom_call_is_named():
    module = lower(lambda x: x + 1, np.ones(3, np.float32))
    op = module.main.body.ops[-1]
    op.name, op.attrs = "custom_call", {"call_target_name": "lapack_sgesdd"}
    with pytest.raises(IpuUnimplementedError, match="custom_call @lapack_sgesdd is not supported"):
        compile_module(module, SMALL)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32, np.uint8], ids=lambda d: np.dtype(d).name)
def test_argmax_and_argmin_reduce_two_operands(dtype):
    x = np.random.default_rng(0).integers(-50, 50, (37, 300)).astype(dtype)
    if np.dtype(dtype).kind == "f":
        x[3, 7] = np.nan
    assert_matches_cpu(lambda a: (jnp.argmax(a), jnp.argmax(a, axis=1), jnp.argmin(a, axis=0),
                                  jnp.argmax(a[:5, :5])), x, target=SMALL)


def test_unsupported_reduction_body_is_a_clear_error():
    module = lower(lambda x: jnp.argmax(x), np.ones(5, np.float32))
    (reduce,) = [op for op in module.main.body.ops if op.name == "reduce"] or [
        op for f in module.functions.values() for op in f.body.ops if op.name == "reduce"]
    reduce.regions[0].ops[0].name = "cholesky"
    with pytest.raises(IpuUnimplementedError, match=r"stablehlo.reduce at .*test_end_to_end.py.*cholesky"):
        compile_module(module, SMALL)

def test_mlp_training_step():
    """Forward and backward of a small MLP (relu called per layer, so the
    same function is inlined twice), against JAX's CPU backend."""
    rng = np.random.default_rng(0)
    sizes = [20, 16, 16, 4]
    params = [((rng.standard_normal((m, n)) / np.sqrt(m)).astype(np.float32), np.zeros(n, np.float32))
              for m, n in zip(sizes[:-1], sizes[1:], strict=True)]
    x = rng.standard_normal((8, 20)).astype(np.float32)
    y = np.eye(4, dtype=np.float32)[rng.integers(0, 4, 8)]

    def loss(params, x, y):
        h = x
        for w, b in params[:-1]:
            h = jax.nn.relu(h @ w + b)
        w, b = params[-1]
        return -jnp.mean(jnp.sum(jax.nn.log_softmax(h @ w + b) * y, axis=-1))

    leaves, tree = jax.tree.flatten(params)

    def step(*args):
        value, grads = jax.value_and_grad(loss)(jax.tree.unflatten(tree, args[:-2]), *args[-2:])
        return [value] + [p - 0.1 * g for p, g in zip(args[:-2], jax.tree.leaves(grads), strict=True)]
    assert_matches_cpu(step, *leaves, x, y, rtol=1e-5, atol=1e-6, target=SMALL)


def test_compiling_leaves_the_garbage_collector_as_it_found_it(monkeypatch):
    """The cyclic collector is paused while compiling (gc_pause), and left
    as it was afterwards, also when compiling fails."""
    import gc

    from jax_ipu import compiler
    module = lower(lambda x: jnp.tanh(x) * 2, np.ones(8, np.float32))
    seen = []
    monkeypatch.setattr(compiler, "PASSES", compiler.PASSES + [("probe", lambda c: seen.append(gc.isenabled()))])
    assert gc.isenabled()
    compile_module(module, SMALL)
    assert seen == [False] and gc.isenabled()

    def fail(c):
        raise IpuUnimplementedError("probe")
    monkeypatch.setattr(compiler, "PASSES", [("fail", fail)])
    with pytest.raises(IpuUnimplementedError):
        compile_module(module, SMALL)
    assert gc.isenabled()
    gc.disable()
    try:
        monkeypatch.setattr(compiler, "PASSES", [("probe", lambda c: seen.append(gc.isenabled()))])
        compile_module(module, SMALL)
        assert seen == [False, False] and not gc.isenabled()
    finally:
        gc.enable()
