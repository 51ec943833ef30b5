"""jax_ipu.model: targets, and the engine running Programs (compiled ones
and hand-built ones with control flow), checking inputs and recording runs."""
from __future__ import annotations

import time

import numpy as np
import pytest

from helpers import SMALL, compile_fn
from jax_ipu.compiler import CompileOptions
from jax_ipu.compiler.builder import Builder
from jax_ipu.errors import IpuInvalidArgument, IpuRuntimeError
from jax_ipu.graph import codelets
from jax_ipu.graph.program import Program
from jax_ipu.graph.programs import Call, Copy, DeviceToHost, HostToDevice, If, Repeat, RepeatWhileTrue, Sequence, Switch
from jax_ipu.graph.views import View
from jax_ipu.model.engine import Engine
from jax_ipu.targets import IPU_DTYPES, get_target


def test_targets():
    ipu2 = get_target()
    assert ipu2.describe() == "IPU Model ipu2 (1472 tiles, 624 KiB/tile, 1.33 GHz)"
    assert get_target("ipu1").num_tiles == 1216 and get_target("ipu1").bytes_per_tile == 256 * 1024
    assert get_target("ipu21").clock_hz == 1.85e9
    assert get_target("ipu2", num_tiles=8).num_tiles == 8
    assert ipu2.workers_per_tile == 6 and ipu2.vector_width(np.float16) == 4
    assert np.dtype(np.float64) not in IPU_DTYPES and len(IPU_DTYPES) == 9
    with pytest.raises(IpuInvalidArgument, match="unknown IPU target"):
        get_target("ipu3")
    with pytest.raises(IpuInvalidArgument):
        get_target("ipu2", num_tiles=5000)


def test_inputs_are_checked():
    program = compile_fn(lambda a: a + 1, np.zeros((2, 3), np.float32))
    engine = Engine(SMALL)
    with pytest.raises(IpuRuntimeError, match="takes 1 inputs, got 2"):
        engine.run(program, [np.zeros((2, 3), np.float32)] * 2)
    with pytest.raises(IpuRuntimeError, match=r"expected float32\[2, 3\], got int32\[2, 3\]"):
        engine.run(program, [np.zeros((2, 3), np.int32)])
    with pytest.raises(IpuRuntimeError, match=r"expected float32\[2, 3\], got float32\[3, 2\]"):
        engine.run(program, [np.zeros((3, 2), np.float32)])
    for other in (get_target("ipu1", num_tiles=16), get_target("ipu2", num_tiles=32)):
        with pytest.raises(IpuRuntimeError, match="compiled for ipu2 with 16 tiles"):
            Engine(other).run(program, [np.zeros((2, 3), np.float32)])


def test_last_run_records_steps_cycles_and_exchange():
    program = compile_fn(lambda a, b: (a @ b).T + 1, np.ones((8, 64), np.float32), np.ones((64, 8), np.float32))
    engine = Engine(SMALL)
    engine.run(program, [np.ones((8, 64), np.float32), np.ones((64, 8), np.float32)])
    record = engine.last_run
    assert record.cycles == program.cycles
    assert any("matmul" in name for name in record.compute_sets)
    assert record.exchange_bytes > 0
    assert [s[0] for s in record.steps].count("Copy") == 1


def test_small_call_is_fast():
    program = compile_fn(lambda a: a * 2 + 1, np.zeros(4, np.float32))
    engine, x = Engine(SMALL), [np.arange(4, dtype=np.float32)]
    engine.run(program, x)
    start = time.perf_counter()
    for _ in range(1000):
        engine.run(program, x)
    assert (time.perf_counter() - start) / 1000 < 200e-6   # a few tens of microseconds, with slack


def _chain(b: Builder, name, inputs, ops, out):
    """A compute set evaluating ops (op, arg registers) into `out`."""
    instructions = tuple(codelets.Instruction(op, args, out.dtype, attrs) for op, args, attrs in ops)
    kernel = codelets.ElementwiseChain(tuple(inputs), instructions,
                                       ((len(inputs) + len(ops) - 1, out),), out.shape)
    views = [i for i in inputs if isinstance(i, View)]
    b.execute(name, kernel, b.vertices_over("Chain", [out], views, lambda n: 11 + n))
    return b.steps.pop()


def _program(b: Builder, inputs, outputs, steps) -> Program:
    body = Sequence([HostToDevice(i, t) for i, t in enumerate(inputs)] + steps
                    + [DeviceToHost(i, v) for i, v in enumerate(outputs)])
    return Program("hand-built", SMALL.name, SMALL.num_tiles, b.tensors, body, inputs, outputs,
                   [None] * len(inputs), [None] * len(outputs), aliases={})


def test_control_flow_programs():
    """x doubled while a counter counts to n; then Switch / If / Call / Repeat."""
    b = Builder(SMALL, CompileOptions())
    x = b.tensor("x", (5,), np.float32)
    n = b.tensor("n", (), np.int32)
    acc = b.tensor("acc", (5,), np.float32)
    count = b.tensor("count", (), np.int32)
    going = b.tensor("going", (), np.bool_)
    one = np.ones((), np.int32)
    lt = (("comparison_direction", "LT"), ("compare_type", "SIGNED"))
    steps = [
        Copy(View(x), acc),
        _chain(b, "zero", [View(n)], [("subtract", (0, 0), ())], count),
        RepeatWhileTrue(
            Sequence([_chain(b, "cond", [View(count), View(n)], [("compare", (0, 1), lt)], going)]), going,
            Sequence([_chain(b, "double", [View(acc)], [("add", (0, 0), ())], acc),
                      _chain(b, "count", [View(count), one], [("add", (0, 1), ())], count)])),
        Switch(count, {3: Sequence([Repeat(2, Sequence([_chain(b, "+1", [View(acc), np.float32(1)],
                                                                [("add", (0, 1), ())], acc)]))])},
               Sequence([])),
        If(going, Sequence([]), Call(Sequence([_chain(b, "neg", [View(acc)], [("negate", (0,), ())], acc)]))),
    ]
    # Switch/If/Call nest sequences; the engine takes a Call where a Sequence goes.
    steps[-1].else_body = Sequence([steps[-1].else_body])
    program = _program(b, [x, n], [View(acc), View(count)], steps)
    engine = Engine(SMALL)
    x_value = np.arange(5, dtype=np.float32)
    acc_out, count_out = engine.run(program, [x_value, np.array(3, np.int32)])
    np.testing.assert_array_equal(acc_out, -(x_value * 8 + 2))
    assert count_out == 3
    assert engine.last_run.compute_sets.count("double") == 3
    acc_out, _ = engine.run(program, [x_value, np.array(1, np.int32)])
    np.testing.assert_array_equal(acc_out, -(x_value * 2))
    assert (x_value == np.arange(5)).all()    # inputs are never written


def test_a_run_drops_intermediates_after_their_last_reader(monkeypatch):
    """A straight-line run holds its live values, not every value the
    program made: before the last step of a chain of products and sorts
    only the last intermediate is held; with FREE_DEAD off, all of them.
    The results are the same."""
    import jax.numpy as jnp

    from jax_ipu.model import engine as engine_module
    from jax_ipu.model.fast import straight_line

    def chain(x, w):
        for i in range(8):
            x = jnp.sort(x, axis=0) if i % 2 else x @ w
        return x
    x = np.random.default_rng(0).standard_normal((4096, 4)).astype(np.float32)
    w = np.eye(4, dtype=np.float32)[::-1].copy()
    program = compile_fn(chain, x, w)
    held, results = {}, {}
    for free in (True, False):
        monkeypatch.setattr(straight_line, "FREE_DEAD", free)
        loaded = engine_module._Loaded(program)
        last = loaded.steps[-1]

        def spy(state, last=last, free=free):
            held[free] = sum(a.nbytes for a in state if isinstance(a, np.ndarray))
            last(state)
        loaded.steps[-1] = spy
        results[free], = straight_line.straight_line(loaded)([x, w])
    np.testing.assert_array_equal(results[True], results[False])
    np.testing.assert_allclose(results[True], np.asarray(chain(x, w)), rtol=1e-6)
    assert held[True] <= 2 * x.nbytes + w.nbytes, held
    assert held[False] >= 8 * x.nbytes, held
