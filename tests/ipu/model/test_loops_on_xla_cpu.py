"""Loops run as one XLA:CPU executable (model/fast/loops.py) give the
reference executors' values and the same run record: random programs
with loops (nested, of data-dependent trip counts, carrying tuples of
several types, reading and writing dynamic slices, scattering, branching)
run on an Engine with the fast machinery and on one with the reference
executors alone (Engine(fast=False), which runs every step of every
iteration).

The values must be the same bits. The differences model-speed.md
documents ("Loops") are kept out of these programs and tested on their
own below: transcendental functions are XLA:CPU's, float sums and
products over an axis are added in XLA's order, and XLA:CPU flushes
float32 subnormals (the programs here keep their values far from them)."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from jax import lax

from helpers import SMALL, compile_fn
from jax_ipu.graph import codelets
from jax_ipu.graph import codelets_indexing as ci
from jax_ipu.graph import programs as p
from jax_ipu.model import registry
from jax_ipu.model.engine import Engine
from jax_ipu.model.fast import loops

EXAMPLES = dict(deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
N, ROWS = 6, 5


@pytest.fixture(autouse=True)
def every_loop_translated(monkeypatch):
    """Every loop an executable from the start, however short (by default
    only loops of loops.MIN_ITERATIONS iterations or more)."""
    monkeypatch.setattr(loops, "MIN_ITERATIONS", 0)


def run_both(f, *args, calls: list | None = None):
    """f's program on both Engines: (fast results, reference results, the
    fast Engine's loaded program, both run records). calls: the list the
    program's host callbacks append to; both runs must make the same calls,
    in the same order, given the same values."""
    program = compile_fn(f, *args, keep_unused=True)
    if calls is not None:
        assert any(isinstance(s, p.HostCall) for s in p.leaves(program.body))
        calls.clear()
    inputs = [np.asarray(a) for a in args]
    fast, reference = Engine(SMALL), Engine(SMALL, fast=False)
    got = fast.run(program, [a.copy() for a in inputs])
    if calls is not None:
        fast_calls, calls[:] = list(calls), []
    want = reference.run(program, [a.copy() for a in inputs])
    if calls is not None:
        assert fast_calls == calls
    return got, want, fast.load(program), fast.last_run, reference.last_run


def assert_same_bits(got, want):
    for g, w in zip(got, want, strict=True):
        g, w = np.asarray(g), np.asarray(w)
        assert g.dtype == w.dtype and g.shape == w.shape
        assert np.array_equal(g.reshape(-1).view(np.uint8), w.reshape(-1).view(np.uint8)), \
            f"not the reference's bits: {np.count_nonzero(g != w)} of {g.size} differ\n{g}\n{w}"


# -- random programs


def _body_step(name: str, i, c: dict) -> dict:
    """One step of a loop body on the carried values c (v: float32[N],
    h: float16[N], k: int32, buf: float32[ROWS, N], ints: int32[N])."""
    v, h, k, buf, ints = c["v"], c["h"], c["k"], c["buf"], c["ints"]
    if name == "affine":
        v = v * 0.75 + buf[0] - 0.5             # a multiply XLA would contract into the add
    elif name == "divide":
        v = v / (jnp.abs(buf[1]) + 1.0) + jnp.float32(1.5)
    elif name == "divide_broadcast":            # XLA would multiply by the divisor's reciprocal
        v = v / jnp.float32(3) + buf[0] / (jnp.abs(buf[1:2, 0]) + 1.0)
    elif name == "clamp":
        v = jnp.clip(jnp.maximum(v, -jnp.float32(3)) + jnp.minimum(buf[2], 1.0), -50.0, 50.0)
    elif name == "select":
        v = jnp.where(v > buf[3], v - 1.0, v * 0.5 + 2.0)
    elif name == "half":
        h = (h * jnp.float16(0.75) + v.astype(jnp.float16) / jnp.float16(3)).astype(jnp.float16)
    elif name == "integers":
        k = (k * 5 + 3) % 97 - (k >> 2) + (k // 3)
        ints = (ints ^ k) + ints * 3 - (ints >> 1)
    elif name == "read_row":
        v = v + lax.dynamic_slice(buf, (i * 2 - 1, 0), (1, N))[0]        # clamped starts
    elif name == "write_row":
        buf = lax.dynamic_update_slice(buf, (v * 0.5)[None], ((i * 3 + k) % (ROWS + 2), 0))
    elif name == "scatter_add":
        ints = ints.at[jnp.abs(ints) % (N + 2)].add(k, mode="drop")       # duplicates, some out of bounds
    elif name == "scatter_set":
        buf = buf.at[jnp.abs(ints[:2]) % ROWS, 1:4].set(v[:3] + 1.0)
    elif name == "gather":
        v = v + v[jnp.abs(ints) % N] * 0.25
    elif name == "maximum":
        v = v - jnp.max(v) * 0.5 + jnp.min(buf[4])                        # max and min: any order
    elif name == "int_sum":
        k = k + jnp.sum(ints % 7)
    elif name == "int_dot":                     # an integer product: exact in any order
        k = k + (ints % 11) @ (buf[0] > 0).astype(jnp.int32)
        ints = ints + (jnp.abs(ints[:, None]) % 5 * (ints % 3)[None, :]) @ jnp.ones(N, jnp.int32)
    elif name == "argmax":                      # a variadic reduction: the first of equal maxima
        k = k + jnp.argmax(jnp.round(v)).astype(jnp.int32) - jnp.argmin(ints).astype(jnp.int32)
    elif name == "branch":
        v, k = lax.cond(k % 3 == 0, lambda: (v * 0.5, k + 1), lambda: (v + 1.0, k - 2))
    elif name == "switch":
        v = lax.switch(jnp.abs(k) % 4, [lambda: v, lambda: v + 2.0, lambda: -v, lambda: v * 0.25], )
    elif name == "inner_repeat":
        v = lax.fori_loop(0, 3, lambda j, v: v * 0.5 + buf[j % ROWS] + j.astype(jnp.float32), v)
    elif name == "inner_while":                 # a trip count the data decide
        def cond(d):
            return d[1] < jnp.abs(k) % 4

        def step(d):
            return d[0] * 0.75 + 1.0, d[1] + 1
        v, _ = lax.while_loop(cond, step, (v, jnp.int32(0)))
    v = jnp.clip(v, -1e4, 1e4)                  # far from overflow and from subnormals
    return {"v": v, "h": h, "k": k, "buf": buf, "ints": ints}


BODY_STEPS = ["affine", "divide", "divide_broadcast", "clamp", "select", "half", "integers", "read_row", "write_row", "scatter_add",
              "scatter_set", "gather", "maximum", "int_sum", "int_dot", "argmax", "branch", "switch", "inner_repeat", "inner_while"]


@st.composite
def loop_programs(draw):
    outer = draw(st.sampled_from(["repeat", "fori_dynamic", "while_data"]))
    steps = draw(st.lists(st.sampled_from(BODY_STEPS), min_size=1, max_size=5))
    count = draw(st.sampled_from([0, 1, 4, 9]))
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 16)))
    v = rng.standard_normal(N).astype(np.float32)
    h = rng.standard_normal(N).astype(np.float16)
    buf = rng.standard_normal((ROWS, N)).astype(np.float32)
    ints = rng.integers(-50, 50, N).astype(np.int32)
    k = np.int32(draw(st.integers(-20, 20)))
    limit = np.int32(count)

    def body(i, c):
        for name in steps:
            c = _body_step(name, i, c)
        return c
    return _loop_program(outer, count, body), (v, h, k, buf, ints, limit), steps, outer != "repeat" or count > 0


def _loop_program(outer: str, count: int, body):
    """The program running `body` (i, carry) in a loop of kind `outer`:
    a repeat of `count` trips, a fori_loop to the `limit` argument, a
    while loop whose trips the data also decide, or (nested) a repeat of
    2 of the fori_loop."""
    def f(v, h, k, buf, ints, limit):
        c = {"v": v, "h": h, "k": k, "buf": buf, "ints": ints}
        if outer == "repeat":
            c = lax.fori_loop(0, count, body, c)
        elif outer == "fori_dynamic":
            c = lax.fori_loop(0, limit, body, c)
        elif outer == "nested":
            c = lax.fori_loop(0, 2, lambda j, c: lax.fori_loop(0, limit, body, c), c)
        else:
            def cond(d):
                return (d[0] < limit) & (jnp.max(jnp.abs(d[1]["v"])) < 5e3)

            def step(d):
                return d[0] + 1, body(d[0], d[1])
            _, c = lax.while_loop(cond, step, (jnp.int32(0), c))
        return c["v"], c["h"], c["k"], c["buf"], c["ints"]
    return f


def _random_loop_both_ways(case, calls: list | None = None):
    f, args, steps, has_loop = case
    got, want, loaded, fast_run, reference_run = run_both(f, *args, calls=calls)
    assert not loaded.engine_loops, f"a loop ran on the engine's steps ({steps})"
    assert loaded.xla_loops or not has_loop
    assert_same_bits(got, want)
    assert fast_run.cycles == reference_run.cycles
    assert fast_run.exchange_bytes == reference_run.exchange_bytes
    assert sorted(fast_run.steps) == sorted(reference_run.steps)       # the same steps, as many times


@given(loop_programs())
@settings(max_examples=15, **EXAMPLES)
def test_random_loops_give_the_reference_bits_and_record(case):
    _random_loop_both_ways(case)


@pytest.mark.slow
@pytest.mark.timeout(1800)
@given(loop_programs())
@settings(max_examples=300, **EXAMPLES, database=None)
def test_many_random_loops_give_the_reference_bits_and_record(case):
    """As above, more programs (pytest -m slow)."""
    _random_loop_both_ways(case)


def test_every_kernel_the_random_loops_reach_has_a_translation():
    """The kernels of the programs above are the ones lax_kernels translates."""
    reached = set()
    for name in BODY_STEPS:
        def f(v, h, k, buf, ints, name=name):
            return tuple(lax.fori_loop(0, 2, lambda i, c: _body_step(name, i, c),
                                       {"v": v, "h": h, "k": k, "buf": buf, "ints": ints}).values())
        program = compile_fn(f, np.ones(N, np.float32), np.ones(N, np.float16), np.int32(1),
                             np.ones((ROWS, N), np.float32), np.ones(N, np.int32))
        reached |= {type(s.compute_set.kernel) for s in p.leaves(program.body) if isinstance(s, p.Execute)}
    assert {codelets.ElementwiseChain, codelets.Fill, codelets.MatMulPartials, codelets.ReducePartials,
            codelets.TreeReduce, ci.DynamicSlice, ci.DynamicUpdateSlice, ci.Scatter, ci.Gather} <= reached
    assert reached <= set(registry.TRACED)


def test_the_steps_in_order_follow_the_iterations():
    """A loop's record lists its steps iteration after iteration (counted
    by the executable), as the engine's own run lists them."""
    def f(x, n):
        def outer(i, x):
            return lax.fori_loop(0, n, lambda j, y: y * 0.5 + 1.0, x) + 1.0
        return lax.fori_loop(0, 3, outer, x)
    got, want, loaded, fast_run, reference_run = run_both(f, np.ones(8, np.float32), np.int32(2))
    assert_same_bits(got, want)
    assert fast_run.steps == reference_run.steps


def test_a_long_loop_runs_in_chunks_and_stops_when_cancelled(monkeypatch):
    """A loop of more iterations than a chunk runs chunk after chunk, its
    values the same; cancel_runs() stops it at a chunk's end."""
    from jax_ipu.errors import IpuRunCancelled
    from jax_ipu.model import engine

    monkeypatch.setattr(loops, "FIRST_CHUNK", 4)
    monkeypatch.setattr(loops, "GROWTH", 2)

    def f(x, n):
        return lax.while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, c[1] * 0.5 + 1.0), (jnp.int32(0), x))[1]
    x = np.ones(8, np.float32)
    got, want, loaded, fast_run, _ = run_both(f, x, np.int32(50))
    assert_same_bits(got, want)
    program = compile_fn(f, x, np.int32(10 ** 9))
    eng = Engine(SMALL)
    calls = []
    real = loops._Loop.run

    def cancel_after_first_chunk(self, state):
        calls.append(1)
        engine.cancel_runs()
        return real(self, state)
    monkeypatch.setattr(loops._Loop, "run", cancel_after_first_chunk)
    eng.load(program)
    with pytest.raises(IpuRunCancelled):
        eng.run(program, [x, np.array(10 ** 9, np.int32)])


def test_loops_moving_windows_of_streaming_memory():
    """Loops that load and store windows of values in streaming memory
    (StreamingCopy steps: a scan reading offloaded rows and stacking its
    outputs there, a while reading rows at data-dependent offsets) run as
    executables, with the reference's bits and record."""
    import jax
    from jax.sharding import SingleDeviceSharding

    ipu = jax.devices("ipu")[0]
    host, device = jax.memory.Space.Host, jax.memory.Space.Device

    def f(xs, n):
        def body(carry, x):
            x = jax.device_put(x, device)
            return carry * 0.5 + x, jax.device_put(x * 2 + carry, host)
        c, ys = lax.scan(body, jnp.zeros((16, 8), jnp.float32), xs)

        def row(c):
            i, acc = c
            return i + 1, acc + jax.device_put(lax.dynamic_index_in_dim(ys, i * 5 - 3, keepdims=False), device)
        return c, ys, lax.while_loop(lambda c: c[0] < n, row, (jnp.int32(0), jnp.zeros((16, 8), jnp.float32)))[1]
    xs = np.random.default_rng(0).standard_normal((12, 16, 8)).astype(np.float32)
    args = jax.device_put(xs, SingleDeviceSharding(ipu, memory_kind="pinned_host")), jax.device_put(np.int32(7), ipu)
    got, want, loaded, fast_run, reference_run = run_both(f, *args)
    assert len(loaded.xla_loops) == 2 and not loaded.engine_loops
    assert any(isinstance(s, p.StreamingCopy) for s in p.leaves(compile_fn(f, *args).body))
    assert_same_bits(got, want)
    assert fast_run.cycles == reference_run.cycles and sorted(fast_run.steps) == sorted(reference_run.steps)


def test_short_loops_stay_on_the_engine_and_long_whiles_move_to_xla(monkeypatch):
    """By default a Repeat shorter than MIN_ITERATIONS runs on the engine's
    steps, and a RepeatWhileTrue moves to its executable at the iteration
    that reaches MIN_ITERATIONS (the condition first), with the same bits
    and record as a run of the engine's steps; later runs use it from the
    start."""
    monkeypatch.setattr(loops, "MIN_ITERATIONS", 16)

    def f(x, n):
        x = lax.fori_loop(0, 5, lambda i, y: y * 0.5 + 1.0, x)
        return lax.while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, c[1] * 0.75 + c[0].astype(jnp.float32)),
                              (jnp.int32(0), x))
    x = np.linspace(-1, 1, 8, dtype=np.float32)
    program = compile_fn(f, x, np.int32(40))
    fast, reference = Engine(SMALL), Engine(SMALL, fast=False)
    loaded = fast.load(program)
    assert loaded.xla_loops == [] and len(loaded.engine_loops) == 0
    for n in (10, 40, 40):          # under the threshold, across it, from the start
        args = [x, np.array(n, np.int32)]
        got, want = fast.run(program, [a.copy() for a in args]), reference.run(program, [a.copy() for a in args])
        assert_same_bits(got, want)
        assert fast.last_run.steps == reference.last_run.steps and fast.last_run.cycles == reference.last_run.cycles
    assert len(loaded.xla_loops) == 1       # the while, translated once


# -- host callbacks

CALLS: list = []         # what the callbacks below were given, in order


def _log(name):
    def log(*args):
        CALLS.append((name, *(np.asarray(a).tobytes() for a in args)))
    return log


def _several_types(v, h, k, ints):
    _log("pure")(v, h, k, ints)
    v, h, k, ints = (np.asarray(a) for a in (v, h, k, ints))
    return (v * np.float32(2), (h + np.float16(1)).astype(np.float16), k * np.int32(3), ints > 0,
            (ints % 7).astype(np.uint8), np.int16(k % 100))


def _never(v):
    raise AssertionError("a branch never taken called the host")


def _callback_step(name: str, i, c: dict) -> dict:
    """A loop body's step calling the host (the callbacks log what they get)."""
    import jax
    from jax.experimental import io_callback

    v, h, k, ints = c["v"], c["h"], c["k"], c["ints"]
    if name == "debug_callback":
        jax.debug.callback(_log("debug"), i, k, v)
    elif name == "pure_several_types":
        specs = (jax.ShapeDtypeStruct((N,), jnp.float32), jax.ShapeDtypeStruct((N,), jnp.float16),
                 jax.ShapeDtypeStruct((), jnp.int32), jax.ShapeDtypeStruct((N,), jnp.bool_),
                 jax.ShapeDtypeStruct((N,), jnp.uint8), jax.ShapeDtypeStruct((), jnp.int16))
        v2, h2, k3, positive, small, k16 = jax.pure_callback(_several_types, specs, v, h, k, ints)
        v = v + v2 * 0.25
        h = (h2 * jnp.float16(0.5)).astype(jnp.float16)
        k = k3 % 1000 - k16.astype(jnp.int32)
        ints = ints + positive.astype(jnp.int32) - small.astype(jnp.int32)
    elif name == "io_callback":
        k = k + io_callback(lambda k: (_log("io")(k), np.int32(k % 5))[1], jax.ShapeDtypeStruct((), jnp.int32), k)
    elif name == "taken_branch":         # taken in some iterations
        v = lax.cond(k % 2 == 0, lambda: jax.pure_callback(lambda a: (_log("taken")(a), a * np.float32(0.5))[1],
                                                           jax.ShapeDtypeStruct(v.shape, v.dtype), v),
                     lambda: v + 1.0)
    elif name == "never_taken_branch":   # as Equinox's error_if: a check that never fails
        v = lax.cond(jnp.max(jnp.abs(v)) > 1e6, lambda: jax.pure_callback(
            _never, jax.ShapeDtypeStruct(v.shape, v.dtype), v), lambda: v)
    return {**c, "v": v, "h": h, "k": k, "ints": ints}


CALLBACK_STEPS = ["debug_callback", "pure_several_types", "io_callback", "taken_branch", "never_taken_branch"]


@st.composite
def callback_loop_programs(draw):
    """As loop_programs, with steps calling the host among the others; the
    arguments on the ipu device, so that the callbacks are lowered as
    HostCall steps."""
    import jax

    ipu = jax.devices("ipu")[0]
    f, args, _, has_loop = draw(loop_programs())
    steps = draw(st.lists(st.sampled_from(BODY_STEPS + CALLBACK_STEPS), min_size=2, max_size=6)
                 .filter(lambda s: set(s) & set(CALLBACK_STEPS)))
    outer = draw(st.sampled_from(["repeat", "fori_dynamic", "while_data", "nested"]))
    count = int(args[-1])
    # A repeat of no trips is no loop: JAX drops it with the host calls in it.
    assume(outer != "repeat" or count > 0)

    def body(i, c):
        for name in steps:
            c = (_callback_step if name in CALLBACK_STEPS else _body_step)(name, i, c)
        return c
    g = _loop_program(outer, count, body)
    return g, tuple(jax.device_put(a, ipu) for a in args), steps, outer != "repeat" or count > 0


@given(callback_loop_programs())
@settings(max_examples=10, **EXAMPLES)
def test_loops_calling_the_host_give_the_reference_bits_calls_and_record(case):
    """Loops holding host callbacks (debug callbacks, pure_callback of
    several result types, io_callback, callbacks in branches taken in some
    iterations and never) run as executables: the reference's values,
    the same calls in the same order, the same record."""
    _random_loop_both_ways(case, CALLS)


@pytest.mark.slow
@pytest.mark.timeout(1800)
@given(callback_loop_programs())
@settings(max_examples=150, **EXAMPLES, database=None)
def test_many_loops_calling_the_host(case):
    """As above, more programs (pytest -m slow)."""
    _random_loop_both_ways(case, CALLS)


def _on_ipu(f, *args, xla_loops=True, monkeypatch=None, devices=None):
    """f run by jax.jit (on the first ipu device, or on `devices`: a
    sharded jit with its arguments split over them), with loops.XLA_LOOPS
    set: (its results, whether loops.translated gave an executable, per
    loop it was asked for)."""
    import jax
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    translations = []
    real = loops.translated

    def spy(step, *a, **k):
        fn = real(step, *a, **k)
        translations.append(fn is not None)
        return fn
    with monkeypatch.context() as m:
        m.setattr(loops, "translated", spy)
        m.setattr(loops, "XLA_LOOPS", xla_loops)
        if devices is None:
            placed = [jax.device_put(a, jax.devices("ipu")[0]) for a in args]
        else:
            mesh = Mesh(np.array(devices), ("i",))
            placed = [jax.device_put(a, NamedSharding(mesh, P("i") if np.ndim(a) else P())) for a in args]
        out = jax.tree.map(np.asarray, jax.jit(f)(*placed))
    return out, translations


def test_debug_print_and_ordered_io_callbacks_in_a_loop(monkeypatch, capfd):
    """jax.debug.print and ordered io_callbacks in a loop run as an
    executable print and call in the engine's order, with its values."""
    import jax
    from jax.experimental import io_callback

    def f(x, n):
        def body(i, x):
            jax.debug.print("step {i}: {x}", i=i, x=x[0])
            got = io_callback(lambda i: (CALLS.append(("first", int(i))), np.float32(i))[1],
                              jax.ShapeDtypeStruct((), np.float32), i, ordered=True)
            x = x * 0.5 + got
            io_callback(lambda x: CALLS.append(("second", float(x[0]))), None, x, ordered=True)
            return x
        return lax.fori_loop(0, n, body, x)
    x, n = np.arange(4, dtype=np.float32), np.int32(5)
    outs = {}
    for xla in (True, False):
        CALLS.clear()
        capfd.readouterr()
        out, translations = _on_ipu(f, x, n, xla_loops=xla, monkeypatch=monkeypatch)
        outs[xla] = (out, list(CALLS), capfd.readouterr().out)
        assert translations == ([True] if xla else [])
    assert outs[True][2] == outs[False][2] and outs[True][2].count("step") == 5
    assert outs[True][1] == outs[False][1] and len(outs[True][1]) == 10
    assert [c[0] for c in outs[True][1]] == ["first", "second"] * 5
    np.testing.assert_array_equal(outs[True][0], outs[False][0])


@pytest.mark.parametrize("error", [ValueError, KeyboardInterrupt])
def test_a_callback_raising_in_a_loop_is_the_callers_exception(monkeypatch, error):
    """A callback that raises in iteration 3 of a loop run as an executable
    stops it; the call raises the callback's error (Ctrl-C: the caller is
    interrupted), as from the engine's steps, and the device runs the next
    program."""
    import signal

    import jax

    # Python's own Ctrl-C handler, as in a terminal (a process started with
    # SIGINT ignored never gets the interrupt the call raises again).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)

    calls = []

    def check(i):
        calls.append(int(i))
        if i == 3:
            raise error("iteration 3 is not allowed")
        return np.int32(i)

    def f(x):
        return lax.fori_loop(0, 6, lambda i, x: x + jax.pure_callback(check, jax.ShapeDtypeStruct((), np.int32), i),
                             x)
    try:
        for xla in (True, False):
            calls.clear()
            with pytest.raises(error if error is KeyboardInterrupt else jax.errors.JaxRuntimeError) as info:
                _on_ipu(f, np.int32(0), xla_loops=xla, monkeypatch=monkeypatch)
            if error is ValueError:
                assert "ValueError: iteration 3 is not allowed" in str(info.value)
            assert calls == [0, 1, 2, 3]
    finally:
        signal.signal(signal.SIGINT, previous)
    out, _ = _on_ipu(lambda x: x + 1, np.int32(1), monkeypatch=monkeypatch)
    assert out == 2


def test_a_callback_cancelling_the_run_stops_the_loop(monkeypatch):
    """A callback that cancels the runs (as Ctrl-C does) stops a loop run
    as an executable at the end of its chunk, with IpuRunCancelled, as on
    the engine's steps it stops at the next iteration."""
    import jax

    from jax_ipu.errors import IpuRunCancelled
    from jax_ipu.model import engine

    monkeypatch.setattr(loops, "FIRST_CHUNK", 4)
    calls = []

    def host(i):
        calls.append(int(i))
        if i == 5:
            engine.cancel_runs()
        return np.int32(1)

    def f(n):
        return lax.while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, c[1] + jax.pure_callback(
            host, jax.ShapeDtypeStruct((), np.int32), c[0])), (jnp.int32(0), jnp.int32(0)))
    n = jax.device_put(np.int32(10 ** 6), jax.devices("ipu")[0])
    program = compile_fn(f, n)
    for fast in (True, False):
        calls.clear()
        eng = Engine(SMALL, fast=fast)
        with pytest.raises(IpuRunCancelled):
            eng.run(program, [np.asarray(n)])
        assert len(eng.load(program).xla_loops) == fast
        # The executable stops at its second chunk's end (of at most 4 * GROWTH iterations).
        assert 6 <= len(calls) <= (4 + 4 * loops.GROWTH if fast else 6)


def test_a_loop_the_executable_cannot_hold_runs_its_callbacks_on_the_engine(monkeypatch, caplog):
    """A loop holding a kernel without a translation (a sort) and a
    callback runs on the engine's steps, named in the log; a loop inside
    it still runs as an executable; the values are the callback's."""
    import logging

    import jax

    def f(x):
        def body(i, x):
            x = lax.fori_loop(0, 4, lambda j, y: y * 0.5 + 1.0, jnp.sort(x))
            return jax.pure_callback(lambda a: a + 1, jax.ShapeDtypeStruct(x.shape, x.dtype), x)
        return lax.fori_loop(0, 2, body, x)
    x = np.arange(4, dtype=np.float32)[::-1].copy()
    with caplog.at_level(logging.INFO, logger=loops.__name__):
        out, translations = _on_ipu(f, x, monkeypatch=monkeypatch)
    assert sorted(translations) == [False, True]
    assert any("runs on the engine's steps" in r.getMessage() and "Sort" in r.getMessage() for r in caplog.records)
    want = np.sort(x)                  # and sorted from then on: the steps keep the order
    for _ in range(2):
        for _ in range(4):
            want = want * np.float32(0.5) + np.float32(1)
        want = want + np.float32(1)
    np.testing.assert_array_equal(out, want)


def test_loops_calling_the_host_on_several_ipus(monkeypatch, ipus):
    """A sharded jit over two IPUs whose loop calls the host once for
    both (its first partition calls, the other gets the results): as an
    executable on each IPU, the same
    values and calls as on the engine's steps; a failing callback fails
    both IPUs clearly, without a hang."""
    import jax
    from jax.experimental import io_callback

    def f(x, n):
        def body(i, x):
            # (on the loop's index: a sum of x would be a collective, which
            # keeps a loop on the engine's steps)
            got = io_callback(lambda i: (CALLS.append(("once", int(i))), np.float32(i % 3))[1],
                              jax.ShapeDtypeStruct((), np.float32), i)
            return x * 0.5 + got
        return lax.fori_loop(0, n, body, x)
    x, n = np.arange(8, dtype=np.float32), np.int32(6)
    outs = {}
    for xla in (True, False):
        CALLS.clear()
        out, translations = _on_ipu(f, x, n, xla_loops=xla, monkeypatch=monkeypatch, devices=ipus[:2])
        outs[xla] = out, list(CALLS)
        assert translations == ([True, True] if xla else [])      # the loop on each IPU
    np.testing.assert_array_equal(outs[True][0], outs[False][0])
    assert outs[True][1] == outs[False][1] and len(outs[True][1]) == 6

    def fails(s):
        raise ValueError("no such total")

    def g(x, n):
        return lax.fori_loop(0, n, lambda i, x: x + io_callback(fails, jax.ShapeDtypeStruct((), np.float32), i), x)
    with pytest.raises(jax.errors.JaxRuntimeError, match="no such total"):
        _on_ipu(g, x, n, monkeypatch=monkeypatch, devices=ipus[:2])
    out, _ = _on_ipu(lambda x: x + 1, x, monkeypatch=monkeypatch, devices=ipus[:2])
    np.testing.assert_array_equal(out, x + 1)


def test_loops_calling_the_host_on_every_replica(monkeypatch, ipus):
    """pmap over two IPUs, each replica's loop calling the host on its
    own values (in the iterations its data choose): the callbacks see
    their replica (jax_ipu.frontend.callbacks.caller()), the values are
    the engine's."""
    import jax

    from jax_ipu.frontend import callbacks

    def host(v):
        launch, rank, count = callbacks.caller()
        CALLS.append((rank, count, float(v)))
        return np.float32(rank + 1)

    def f(x):
        def body(i, x):
            return lax.cond(x > 2, lambda: x * 0.5 + jax.pure_callback(host, jax.ShapeDtypeStruct((), np.float32), x),
                            lambda: x + 1.5)
        return lax.fori_loop(0, 5, body, x)
    x = np.array([0.0, 3.0], np.float32)
    outs = {}
    for xla in (True, False):
        CALLS.clear()
        with monkeypatch.context() as m:
            m.setattr(loops, "XLA_LOOPS", xla)
            outs[xla] = np.asarray(jax.pmap(f, devices=ipus[:2])(x)), sorted(CALLS)
    np.testing.assert_array_equal(outs[True][0], outs[False][0])
    assert outs[True][1] == outs[False][1]
    assert {c[0] for c in outs[True][1]} == {0, 1} and all(c[1] == 2 for c in outs[True][1])


# -- the documented differences


def test_library_functions_and_float_sums_are_within_float_tolerance():
    """tanh is XLA:CPU's; a product's sum over K and a float sum over an
    axis are added in XLA's order."""
    rng = np.random.default_rng(1)
    h, w = rng.standard_normal((8, 64)).astype(np.float32), (rng.standard_normal((64, 64)) / 8).astype(np.float32)
    xs = rng.standard_normal((6, 8, 64)).astype(np.float32)

    def f(h, w, xs):
        h, ys = lax.scan(lambda h, x: (jnp.tanh(h @ w + x),) * 2, h, xs)
        return h, ys, lax.fori_loop(0, 3, lambda i, s: s + jnp.sum(h * s), jnp.float32(0.5))
    got, want, loaded, fast_run, reference_run = run_both(f, h, w, xs)
    assert len(loaded.xla_loops) == 2 and fast_run.cycles == reference_run.cycles
    for g, r in zip(got, want, strict=True):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-5)


def test_training_steps_in_a_fori_loop():
    """An MLP's SGD steps (forward, gradients, update) inside one
    fori_loop: within float tolerance of the reference (XLA's order of a product's
    sums, its tanh and exp), the same cycles, and the loop on XLA:CPU."""
    import jax

    rng = np.random.default_rng(2)
    x, y = rng.standard_normal((32, 16)).astype(np.float32), rng.standard_normal((32, 4)).astype(np.float32)
    w1, w2 = (rng.standard_normal((16, 32)) / 4).astype(np.float32), (rng.standard_normal((32, 4)) / 6).astype(np.float32)

    def loss(ws, x, y):
        h = jnp.tanh(x @ ws[0])
        return jnp.mean((jax.nn.softmax(h @ ws[1]) - y) ** 2)

    def train(w1, w2, x, y):
        def step(i, ws):
            g = jax.grad(loss)(ws, x, y)
            return tuple(w - 0.1 * d for w, d in zip(ws, g, strict=True))
        return lax.fori_loop(0, 5, step, (w1, w2))
    got, want, loaded, fast_run, reference_run = run_both(train, w1, w2, x, y)
    assert len(loaded.xla_loops) == 1 and not loaded.engine_loops
    assert fast_run.cycles == reference_run.cycles
    for g, r in zip(got, want, strict=True):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)


def test_xla_cpu_flushes_float32_subnormals_in_loops():
    """The accepted difference of docs/fuzzing.md, in loops: XLA:CPU
    flushes a subnormal float32 result to zero, the reference keeps it."""
    def f(x):
        return lax.fori_loop(0, 3, lambda i, y: y * jnp.float32(1e-13), x)
    got, want, *_ = run_both(f, np.full(4, 1.0, np.float32))
    assert np.all(want[0] > 0) and np.all(want[0] < np.finfo(np.float32).tiny)      # 1e-39: subnormal
    assert np.all(got[0] == 0)
