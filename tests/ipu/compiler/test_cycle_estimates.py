"""The cycle model: workers, vector and AMP rates, exchange and sync, and
the static estimate of loops and branches."""
from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from helpers import SMALL, compile_fn
from jax_ipu.compiler import cost
from jax_ipu.graph.mapping import TileMapping
from jax_ipu.graph.programs import (
    Copy,
    DeviceToHost,
    Execute,
    HostToDevice,
    If,
    Repeat,
    RepeatWhileTrue,
    Switch,
    children,
    leaves,
)
from jax_ipu.model.engine import Engine
from jax_ipu.targets import get_target

IPU2 = get_target("ipu2")


def test_six_workers_leave_issue_slots_empty_on_small_work():
    per = cost.worker_cycles
    # f32 vectors of 2: 12 elements fill each of six workers once, as do 7.
    assert per(IPU2, 12, 1, 2) == per(IPU2, 7, 1, 2) == 6
    assert per(IPU2, 13, 1, 2) == 12
    assert per(IPU2, 0, 1, 2) == 0
    assert cost.elementwise_cycles(IPU2, 1200, np.dtype(np.float32), ["add"]) == 11 + 600
    assert cost.elementwise_cycles(IPU2, 1200, np.dtype(np.float16), ["add"]) == 11 + 300


def test_amp_matches_the_measured_4n_plus_330():
    """[N,16]x[16,16]: 4N + 330 with float16 partials (the measurement's
    accumulators, docs/ipu.md), twice the AMP cycles with float32 partials
    (8 conv units, not 16), float32 at the datasheet's 16 a cycle."""
    f16, f32 = np.dtype(np.float16), np.dtype(np.float32)
    for rows in (16, 128, 2048):
        macs = rows * 16 * 16
        assert cost.matmul_cycles(IPU2, macs, f16, f16) == 4 * rows + 330
        assert cost.matmul_cycles(IPU2, macs, f16, f32) == cost.matmul_cycles(IPU2, macs, f16) == 8 * rows + 330
        assert cost.matmul_cycles(IPU2, macs, f32, f32) == 16 * rows + 330


def test_exchange_is_bounded_by_the_busiest_tile():
    sent = np.array([400, 0, 0, 0])
    received = np.array([0, 100, 100, 200])
    assert cost.exchange_cycles(IPU2, sent, received) == IPU2.exchange_fixed_cycles + 100
    assert cost.exchange_cycles(IPU2, np.zeros(4), np.zeros(4)) == 0


def test_sync_cost_is_a_target_parameter():
    x = np.ones((64, 48), np.float32)
    f = lambda a: a.T * 2  # noqa: E731
    slow = dataclasses.replace(SMALL, sync_cycles=10_000)
    base, synced = compile_fn(f, x), compile_fn(f, x, target=slow)
    steps = [s for s in leaves(base.body) if isinstance(s, (Copy, Execute))]
    assert synced.cycles - base.cycles == len(steps) * (10_000 - SMALL.sync_cycles)


def test_compute_set_takes_its_slowest_tile():
    x = np.ones(1001, np.float32)
    program = compile_fn(lambda a: a * 3, x)
    (step,) = [s for s in leaves(program.body) if isinstance(s, Execute)]
    slowest = max(v.cycles for v in step.compute_set.vertices)
    assert step.cycles == slowest + SMALL.sync_cycles and step.exchange_bytes == 0


# -- loops and branches in the static estimate (Program.cycles) --

def _loop_cycles(program):
    """(cycles outside the top-level loop, the loop's body cycles)."""
    (loop,) = [s for s in program.body.steps if isinstance(s, (Repeat, RepeatWhileTrue))]
    body = sum(s.cycles for s in leaves(loop.body))
    outside = sum(getattr(s, "cycles", 0) for s in program.body.steps
                  if not isinstance(s, (Repeat, RepeatWhileTrue, HostToDevice, DeviceToHost)))
    return loop, outside, body


@pytest.mark.parametrize("count", [1, 2, 10])
def test_repeat_counts_its_body_times_its_count(count):
    x = np.ones(64, np.float32)
    program = compile_fn(lambda a: lax.fori_loop(0, count, lambda i, y: jnp.sin(y) * 2, a), x)
    loop, outside, body = _loop_cycles(program)
    assert isinstance(loop, Repeat) and loop.count == count and body > 0
    assert loop.cycles == SMALL.branch_cycles                # its counter and branch on each tile
    assert program.cycles == outside + count * (body + loop.cycles)
    assert program.unknown_trip_loops == []
    engine = Engine(SMALL)
    engine.run(program, [x])
    assert engine.last_run.cycles == program.cycles      # the run agrees


def test_loop_of_unknown_trip_count_is_named_with_its_cycles_per_iteration():
    x = np.ones(64, np.float32)
    program = compile_fn(lambda a, n: lax.fori_loop(0, n, lambda i, y: jnp.sin(y) * 2, a), x, np.int32(3))
    loop, outside, body = _loop_cycles(program)
    assert isinstance(loop, RepeatWhileTrue)
    # Each test of the predicate: a sync, its broadcast from one tile to all
    # (an exchange of one word), the branch.
    assert loop.cycles == SMALL.sync_cycles + SMALL.exchange_fixed_cycles + 1 + SMALL.branch_cycles
    assert loop.sync_cycles == SMALL.sync_cycles and loop.exchange_bytes == 4 * (SMALL.num_tiles - 1)
    condition = sum(s.cycles for s in leaves(loop.condition)) + loop.cycles
    assert program.cycles == outside + condition          # no iteration counted
    (record,) = program.unknown_trip_loops
    assert record["cycles_per_iteration"] == condition + body and record["entered"] == 1
    assert record["name"].startswith("while@")
    cost_analysis = program.cost_analysis()
    assert cost_analysis["loops_with_unknown_trip_count"] == 1
    assert cost_analysis["estimated_cycles_per_unknown_loop_iteration"] == condition + body
    assert "trip count is unknown at compile time" in program.summary()
    engine = Engine(SMALL)
    for n in (0, 3, 7):     # the run counts the real iterations
        engine.run(program, [x, np.array(n, np.int32)])
        assert engine.last_run.cycles == program.cycles + n * record["cycles_per_iteration"]


def test_unknown_loop_inside_a_counted_loop_is_entered_count_times():
    def f(a, n):
        return lax.fori_loop(0, 4, lambda i, y: lax.fori_loop(0, n, lambda j, z: z * 2, y) + 1, a)
    program = compile_fn(f, np.ones(64, np.float32), np.int32(3))
    (record,) = program.unknown_trip_loops
    assert record["entered"] == 4
    assert program.cost_analysis()["estimated_cycles_per_unknown_loop_iteration"] == 4 * record["cycles_per_iteration"]


def test_a_branch_counts_its_longer_side():
    x = np.ones(256, np.float32)
    program = compile_fn(lambda a, p: lax.cond(p, lambda y: jnp.tanh(jnp.exp(y)) * 3, lambda y: y, a),
                         x, np.bool_(True))
    (branch,) = [s for s in program.body.steps if isinstance(s, (If, Switch))]   # lax.cond: a case
    sides = [sum(s.cycles for s in leaves(b)) for b in children(branch)]
    outside = sum(getattr(s, "cycles", 0) for s in program.body.steps
                  if not isinstance(s, (If, Switch, HostToDevice, DeviceToHost)))
    assert branch.cycles == SMALL.sync_cycles + SMALL.exchange_fixed_cycles + 1 + SMALL.branch_cycles
    assert sides[0] != sides[1] and program.cycles == outside + branch.cycles + max(sides)


def _per_element_exchange(target, owners, readers, itemsize, sources):
    """A Copy's exchange counted element by element: (sent, received) bytes
    per tile, sends capped by what each tile holds (multicast)."""
    remote = owners != readers
    sent = np.bincount(owners[remote], minlength=target.num_tiles) * itemsize
    held = sum(t.mapping.elements_per_tile(target.num_tiles) for t in set(sources)) * itemsize
    return np.minimum(sent, held), np.bincount(readers[remote], minlength=target.num_tiles) * itemsize


def _assert_costs_as_per_element(target, src, dst):
    """cost_copy of src into dst gives the exchange counted element by element."""
    from jax_ipu.graph.views import source_tiles
    itemsize = dst.dtype.itemsize
    step = Copy(src, dst)
    received = cost.cost_copy(target, step)
    owners, readers = source_tiles(src).astype(np.int64), dst.mapping.element_tiles().astype(np.int64)
    sent_want, received_want = _per_element_exchange(target, owners, readers, itemsize, src.tensors)
    np.testing.assert_array_equal(received, received_want)
    local = np.bincount(readers[owners == readers], minlength=target.num_tiles) * itemsize
    assert step.exchange_cycles == cost.exchange_cycles(target, sent_want, received_want) + \
        -(-int(local.max(initial=0)) // target.sram_write_bytes_per_cycle)


def _random_mapping(rng, size, tiles):
    cuts = np.unique(rng.integers(1, size, size=rng.integers(0, 6))) if size > 1 else np.zeros(0, int)
    starts = np.r_[0, cuts]
    return TileMapping.from_runs(size, rng.integers(0, tiles, len(starts)), starts)


@pytest.mark.parametrize("seed", range(12))
def test_copy_exchange_of_transposes_and_concatenations_counts_every_element(seed):
    """The copy costing's shortcut for views reading each element once (no
    per-element pass over the owners) agrees with counting every element."""
    from jax_ipu.graph.tensors import Tensor
    from jax_ipu.graph.views import Concat, View
    rng = np.random.default_rng(seed)
    target = get_target("ipu2", num_tiles=8)
    shape = (int(rng.integers(1, 5)), int(rng.integers(1, 6)), int(rng.integers(1, 7)))
    axis, parts = int(rng.integers(0, 3)), []
    for i in range(int(rng.integers(1, 4))):
        part = list(shape)
        part[axis] = int(rng.integers(1, 4))
        perm = tuple(int(a) for a in rng.permutation(3))
        inverse = np.argsort(perm)
        stored = tuple(part[inverse[j]] for j in range(3))
        t = Tensor(i, f"t{i}", stored, np.dtype(np.float32), _random_mapping(rng, int(np.prod(stored)), 8))
        view = View(t).then("transpose", perm)
        assert view.shape == tuple(part)
        parts.append(view)
    src = Concat(tuple(parts), axis) if len(parts) > 1 else parts[0]
    dst = Tensor(9, "dst", src.shape, np.dtype(np.float32), _random_mapping(rng, src.size, 8))
    _assert_costs_as_per_element(target, src, dst)


@pytest.mark.parametrize("seed", range(12))
def test_copy_exchange_of_whole_tensors_in_order_counts_every_element(seed):
    """Concatenations of whole tensors (a serial matmul's column blocks)
    are costed from their runs, cut where each part's chunks land, and
    agree with counting every element."""
    from jax_ipu.graph.tensors import Tensor
    from jax_ipu.graph.views import Concat, View
    rng = np.random.default_rng(seed)
    target = get_target("ipu2", num_tiles=8)
    shape = (int(rng.integers(1, 4)), int(rng.integers(1, 5)), int(rng.integers(30, 90)))
    axis = int(rng.integers(0, 3))
    parts = []
    for i in range(int(rng.integers(1, 4))):
        part = list(shape)
        part[axis] = int(rng.integers(1, shape[axis] + 1))
        t = Tensor(i, f"t{i}", (int(np.prod(part)),), np.dtype(np.float16),
                   _random_mapping(rng, int(np.prod(part)), 8))
        parts.append(View(t).then("reshape", tuple(part)))
    src = Concat(tuple(parts), axis) if len(parts) > 1 else parts[0]
    dst = Tensor(9, "dst", src.shape, np.dtype(np.float16), _random_mapping(rng, src.size, 8))
    assert cost._kept_in_order(dst, tuple(parts), axis if len(parts) > 1 else 0, 8) is not None
    _assert_costs_as_per_element(target, src, dst)


@pytest.mark.parametrize("seed", range(6))
def test_shared_read_ranges_cost_as_the_same_reads_listed_per_vertex(seed):
    """A VertexArray whose vertices name shared ranges of read intervals
    (offsets [v, 2], as a matmul's row blocks) costs, expands and indexes as
    the same reads listed vertex by vertex (CSR offsets)."""
    from jax_ipu.graph.compute import ComputeSet, VertexArray, region_arrays
    from jax_ipu.graph.tensors import Tensor
    rng = np.random.default_rng(seed)
    target = get_target("ipu2", num_tiles=8)
    t = Tensor(0, "x", (200,), np.dtype(np.float16), _random_mapping(rng, 200, 8))
    groups = []
    for _ in range(int(rng.integers(1, 5))):
        starts = np.sort(rng.integers(0, 190, int(rng.integers(1, 4))))
        groups.append(np.stack([starts, starts + rng.integers(1, 10, len(starts))], axis=1))
    bounds = np.r_[0, np.cumsum([len(g) for g in groups])]
    vertices = int(rng.integers(1, 12))
    of = rng.integers(0, len(groups), vertices)
    tiles, cycles = rng.integers(0, 8, vertices), np.full(vertices, 10)
    shared = VertexArray("V", tiles, cycles, ((t, np.concatenate(groups), np.stack([bounds[of], bounds[of + 1]], 1)),))
    listed = VertexArray("V", tiles, cycles, ((t, np.concatenate([groups[g] for g in of]),
                                               np.r_[0, np.cumsum([len(groups[g]) for g in of])]),))
    steps = [Execute(ComputeSet("cs", vs, None)) for vs in (shared, listed)]
    received = [cost.cost_execute(target, s) for s in steps]
    np.testing.assert_array_equal(received[0], received[1])
    assert (steps[0].cycles, steps[0].exchange_bytes) == (steps[1].cycles, steps[1].exchange_bytes)
    (_, a, ia), = region_arrays(shared, "reads")
    (_, b, ib), = region_arrays(listed, "reads")
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(ia, ib)
    for i in range(vertices):
        np.testing.assert_array_equal(shared[i].reads[0].intervals, listed[i].reads[0].intervals)


def test_repeated_layers_share_vertex_patterns_and_cost_as_if_alone():
    """The same product in each layer has the same tiles and vertex arrays
    (a plan on over half the tiles starts where the first started), and
    counting each pattern's exchange once gives every step the cycles it
    has costed alone. The numerics stay XLA:CPU's."""
    from helpers import run_ipu
    from jax_ipu.graph.compute import VertexArray

    def layers(x, ws):
        for i in range(ws.shape[0]):
            x = jnp.tanh(x @ ws[i])
        return x
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 96)).astype(np.float32)
    ws = (rng.standard_normal((4, 96, 96)) / 10).astype(np.float32)
    target = get_target("ipu2", num_tiles=20)
    program = compile_fn(layers, x, ws, target=target)
    products = [s for s in leaves(program.body) if isinstance(s, Execute)
                and isinstance(s.compute_set.vertices, VertexArray)
                and s.compute_set.vertices.codelet.startswith("MatMulPartial")]
    assert len(products) == 4
    first = products[0].compute_set.vertices
    assert target.num_tiles // 2 < len(np.unique(first.tiles)) < target.num_tiles
    for step in products[1:]:
        v = step.compute_set.vertices
        assert v.tiles is first.tiles and all(a[1] is b[1] for a, b in zip(v.reads, first.reads, strict=True))
    for step in leaves(program.body):
        if isinstance(step, Execute):
            stored = (step.cycles, step.exchange_cycles, step.exchange_bytes)
            cost.cost_execute(target, step)
            assert (step.cycles, step.exchange_cycles, step.exchange_bytes) == stored
    want = x.astype(np.float64)
    for w in ws:
        want = np.tanh(want @ w)
    np.testing.assert_allclose(run_ipu(layers, x, ws, target=target)[0], want, rtol=1e-5, atol=1e-5)
