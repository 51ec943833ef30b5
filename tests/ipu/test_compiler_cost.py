"""The cycle model: workers, vector and AMP rates, exchange and sync."""
from __future__ import annotations

import dataclasses

import numpy as np

from jax_ipu.compiler import cost
from jax_ipu.graph.programs import Copy, Execute, leaves
from jax_ipu.model.targets import get_target
from test_compiler import SMALL, compile_fn

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
    for rows in (16, 128, 2048):
        macs = rows * 16 * 16
        assert cost.matmul_cycles(IPU2, macs, np.dtype(np.float16)) == 4 * rows + 330
        assert cost.matmul_cycles(IPU2, macs, np.dtype(np.float32)) == 16 * rows + 330


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
