"""Independent compute sets next to each other run as two lanes on the
host's two cores (jax_ipu/model/fast/lanes.py): never compute sets that share a
tensor, and the same values whether or not the helper takes a lane."""
from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
from mlp_cases import mlp_inputs, mlp_step

from helpers import compile_fn, run_cpu, run_python
from jax_ipu.graph import programs as p
from jax_ipu.graph.records import tensor_ids
from jax_ipu.model.engine import Engine
from jax_ipu.model.fast import helper, lanes, loops
from jax_ipu.targets import get_target

IPU2 = get_target("ipu2")


def _plan(program):
    loaded = Engine(IPU2).load(program)
    steps = [s for s in program.body.steps if not (isinstance(s, p.Copy) and s.dst.id in loaded.lazy)]
    found = lanes.units(steps, [loaded.kernel(s) for s in steps], tensor_ids, loaded.aliases)
    return lanes.plan(found)


def _count_lanes(monkeypatch) -> list:
    """A list that gets an entry each time a run hands out lanes."""
    ran, real = [], helper.run_lanes

    def spy(first, second):
        ran.append(1)
        real(first, second)
    monkeypatch.setattr(helper, "run_lanes", spy)
    return ran


def test_a_training_step_runs_its_independent_products_and_updates_as_lanes():
    params, x = mlp_inputs()
    program = compile_fn(mlp_step, params, x, target=IPU2)
    pairs = [item for item in _plan(program) if isinstance(item, tuple)]
    assert pairs
    for first, second in pairs:
        written = set().union(*(u.writes for u in first))
        read = set().union(*(u.reads for u in first))
        for u in second:                      # the lanes share no tensor they write
            assert not (u.writes & read) and not (u.reads & written)
    lane_kernels = {type(k).__name__ for pair in pairs for lane in pair for u in lane for k in u.kernels}
    assert "MatMulPartials" in lane_kernels and "ElementwiseChain" in lane_kernels


def test_lanes_give_the_same_bits_with_and_without_the_helper(monkeypatch):
    params, x = mlp_inputs(1)
    program = compile_fn(mlp_step, params, x, target=IPU2)
    monkeypatch.setattr(helper, "spare_core", lambda: True)
    taken = _count_lanes(monkeypatch)
    with_helper = Engine(IPU2).run(program, params + [x])
    helper.end_session()
    assert taken
    monkeypatch.setattr(helper, "spinner", lambda: None)
    monkeypatch.setattr(helper, "helper_pool", lambda busy=False: None)
    alone = Engine(IPU2).run(program, params + [x])
    for a, b in zip(with_helper, alone, strict=True):
        np.testing.assert_array_equal(a, b)
    for got, want in zip(with_helper, run_cpu(mlp_step, params, x), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    monkeypatch.setattr(lanes, "LANES", False)
    for got, want in zip(Engine(IPU2).run(program, params + [x]), with_helper, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _unit(name, reads, writes, work=1e6):
    return lanes.Unit([name], [], set(reads), set(writes), work)


def test_dependent_or_small_or_lopsided_groups_stay_in_order():
    a, b = _unit("a", {1}, {2}), _unit("b", {2}, {3})           # b reads what a writes
    assert lanes.plan([a, b]) == [a, b]
    c, d = _unit("c", {1}, {2}), _unit("d", {3}, {1})           # d overwrites what c reads
    assert lanes.plan([c, d]) == [c, d]
    e, f = _unit("e", {1}, {2}, 10.0), _unit("f", {3}, {4}, 10.0)   # too little work for a hand-off
    assert lanes.plan([e, f]) == [e, f]
    g, h = _unit("g", {1}, {2}, 1e7), _unit("h", {3}, {4}, 1e5)     # one big compute set keeps its halves
    assert lanes.plan([g, h]) == [g, h]
    i, j, k = _unit("i", {1}, {2}), _unit("j", {3}, {4}), _unit("k", {5}, {6})
    barrier = object()
    plan = lanes.plan([i, j, barrier, k])
    assert plan[0] == ([i], [j]) and plan[1:] == [barrier, k]


def test_a_donated_buffer_written_in_place_counts_as_its_input():
    """An update written into a donated input's buffer conflicts with a
    compute set reading that input, though they name different tensors."""
    params, x = mlp_inputs(2)

    def f(w, x):
        return w - 0.01 * jnp.tanh(x[:, :512].T @ x[:, :512]), jnp.sum(w * w, axis=0)
    program = compile_fn(f, params[0], x, target=IPU2)
    loaded = Engine(IPU2).load(program)     # as if the caller donated w: its update is written into w
    out_id, in_id = program.outputs[0].tensor.id, program.inputs[0].id
    loaded.aliases[out_id].add(in_id)
    loaded.aliases[in_id].add(out_id)
    steps = [s for s in program.body.steps if not (isinstance(s, p.Copy) and s.dst.id in loaded.lazy)]
    found = [u for u in lanes.units(steps, [loaded.kernel(s) for s in steps], tensor_ids,
                                    loaded.aliases) if isinstance(u, lanes.Unit)]
    writers = [u for u in found if out_id in u.writes]
    readers = [u for u in found if in_id in u.reads and u not in writers]
    assert writers and readers
    assert all(in_id in u.writes for u in writers)
    assert not any(lanes.independent(w, r) for w in writers for r in readers)


def test_a_loop_body_runs_lanes_and_its_record_keeps_program_order(monkeypatch):
    """In a program with control flow each step is recorded as it runs (for
    profiles): lanes record theirs in program order, with the Copies the
    engine skips, so the record is the one of a run without lanes."""
    params, x = mlp_inputs(3)

    def train(params, x):
        return jax.lax.fori_loop(0, 3, lambda i, p: mlp_step(p, x), params)
    program = compile_fn(train, params, x, target=IPU2)
    monkeypatch.setattr(loops, "XLA_LOOPS", False)       # the loop on the engine's steps
    ran = _count_lanes(monkeypatch)
    eng = Engine(IPU2)
    got = eng.run(program, params + [x])
    with_lanes = list(eng.last_run.steps)
    assert len(ran) >= 3 * 2                      # both groups, in every iteration
    monkeypatch.setattr(lanes, "LANES", False)
    eng = Engine(IPU2)
    plain = eng.run(program, params + [x])
    assert list(eng.last_run.steps) == with_lanes
    for a, b, want in zip(got, plain, run_cpu(train, params, x), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(a, want, rtol=1e-4, atol=1e-5)


_FIRST_RUN = """
import numpy as np
from jax_ipu.model.fast import helper
from jax_ipu.model.engine import Engine
from jax_ipu.targets import get_target
from helpers import compile_fn
from mlp_cases import mlp_inputs, mlp_step
IPU2 = get_target("ipu2")
params, x = mlp_inputs(1)
program = compile_fn(mlp_step, params, x, target=IPU2)
helper.spare_core = lambda: True
first = Engine(IPU2).run(program, params + [x])
helper.end_session()
helper.spinner, helper.helper_pool = (lambda: None), (lambda busy=False: None)
again = Engine(IPU2).run(program, params + [x])
print(all(np.array_equal(a, b) for a, b in zip(first, again)))
"""


def test_the_first_run_of_a_process_gives_the_same_bits():
    """A fresh process's first run with lanes on two threads: OpenBLAS's
    thread count is process-wide, and one lane's end once gave the other
    lane two OpenBLAS threads mid-product (1-ulp differences)."""
    here = pathlib.Path(__file__).resolve().parent
    done = run_python(_FIRST_RUN, path=[here, here.parent])
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "True"


def test_openblas_goes_back_to_the_users_thread_count_only_when_no_engine_thread_needs_one():
    import threading

    from jax_ipu.model.fast import blas
    assert blas.set_local_threads is not None
    user = blas.set_local_threads(3)
    inside, left = threading.Event(), threading.Event()
    seen = {}

    def other():
        with blas._OneBlasThread():
            inside.set()
            left.wait(10)                                 # the first thread has left its block
            seen["during"] = blas.set_local_threads(1)    # the count this one computes with
    block = blas._OneBlasThread()
    block.__enter__()                                     # this thread enters first...
    t = threading.Thread(target=other)
    t.start()
    inside.wait(10)
    block.__exit__(None, None, None)                      # ... and leaves first
    left.set()
    t.join(10)
    assert seen["during"] == 1
    assert blas.set_local_threads(user) == 3              # given back once both left


def test_the_helper_takes_the_lane_of_fewer_units():
    """An MLP's updates: the biggest alone in one lane, the others in the
    other. The helper (second lane) gets the lone one: the caller's Python
    for many small units holds the GIL the helper would wait for."""
    w1, w2 = _unit("w1", {1}, {2}, 802_816.0), _unit("w2", {3}, {4}, 524_288.0)
    small = [_unit(f"b{i}", {10 + 2 * i}, {11 + 2 * i}, work) for i, work in enumerate([1024.0, 10240.0, 1024.0])]
    group = [small[0], w1, small[1], w2, small[2]]
    [(first, second)] = lanes.plan(group)
    assert second == [w1] and first == [small[0], small[1], w2, small[2]]     # program order in each
    p1, p2 = _unit("p1", {20}, {21}, 2e6), _unit("p2", {22}, {23}, 2e6)
    [(first, second)] = lanes.plan([p1, p2])                                # as many: as assigned
    assert (first, second) == ([p1], [p2])
