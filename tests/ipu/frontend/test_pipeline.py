"""jax_ipu.pipeline: GPipe and 1F1B over IPUs with shard_map and ppermute. Loss and
accumulated gradients match the same layers run one after the other on
XLA:CPU and the same pipeline on XLA:CPU devices; the run's estimate
shows the IPU-Link transfers and the bubble."""
import os

import numpy as np
import pipeline_cases as pc
import pytest

import jax_ipu
from helpers import run_python
from jax_ipu import pipeline

HERE = os.path.dirname(os.path.abspath(__file__))


def test_two_stage_pipeline_matches_xla_cpu(ipus):
    stacked, (x, y) = pc.params(2), pc.data()
    want = pc.sequential(stacked, x, y)
    pc.close(pc.pipelined(ipus, stacked, x, y, count=4), want)
    pc.close(pc.pipelined(ipus, stacked, x, y, count=4, remat=True), want)


def test_one_f_one_b_matches_xla_cpu(ipus):
    """1F1B's own backward pass: loss and gradients as jax.grad of the
    layers run one after the other on XLA:CPU, for M below, at and above
    the stash's 2S - 1 slots."""
    stacked, (x, y) = pc.params(2), pc.data()
    want = pc.sequential(stacked, x, y)
    for count in (1, 4, 8):
        pc.close(pc.one_f_one_b(ipus, stacked, x, y, count=count), want)
    assert pipeline.stash_slots(2, 8) == 3 and pipeline.ticks_1f1b(2, 8) == 10


def test_one_f_one_b_keeps_a_bounded_stash_where_gpipe_keeps_every_micro_batch(ipus):
    """With the micro-batch fixed and 4 times as many of them, GPipe's SRAM
    peak grows by what it keeps per micro-batch; 1F1B's only by the larger
    batch of inputs itself."""
    stacked = pc.params(2)
    rng = np.random.default_rng(2)
    peaks = {}
    for count in (4, 16):
        x, y = (rng.standard_normal((count * 8, pc.D)).astype(np.float32) for _ in range(2))
        pc.pipelined(ipus, stacked, x, y, count=count)
        gpipe_peak = jax_ipu.last_profile(ipus[0])["memory"]["total_bytes"]
        pc.one_f_one_b(ipus, stacked, x, y, count=count)
        peaks[count] = (gpipe_peak, jax_ipu.last_profile(ipus[0])["memory"]["total_bytes"])
    gpipe_growth = peaks[16][0] - peaks[4][0]
    growth = peaks[16][1] - peaks[4][1]
    assert growth < gpipe_growth / 2, peaks


def test_pipeline_estimate_shows_link_transfers_and_bubble(ipus):
    stacked, (x, y) = pc.params(2), pc.data()
    counts = {}
    for count in (2, 8):
        pc.pipelined(ipus, stacked, x, y, count=count)
        report = jax_ipu.last_profile(ipus[0])
        breakdown = report["time_breakdown"]
        assert sum(breakdown.values()) == report["cycles"]["device"]
        permutes = [s for s in report["steps"] if s["name"].startswith("CollectivePermute")]
        # A forward transfer per tick, one backward per tick of the drain run backwards.
        assert len(permutes) == 2 * pipeline.ticks(2, count)
        target = jax_ipu.target(ipus[0])
        activation = pc.BATCH // count * pc.D * 4
        assert min(s["cycles"] for s in permutes) >= \
            activation / (target.ipu_link_bytes_per_second / target.clock_hz) + target.ipu_sync_cycles
        assert breakdown["ipu_link"] >= sum(s["cycles"] for s in permutes)
        counts[count] = report["cycles"]["device"]
    # The same batch in 8 micro-batches: more ticks, a smaller bubble share.
    assert pipeline.bubble_fraction(2, 8) < pipeline.bubble_fraction(2, 2)
    assert counts[8] > counts[2]


def test_bad_stage_parameters_are_refused(ipus):
    stacked, (x, y) = pc.params(4), pc.data()
    with pytest.raises(ValueError, match="leading axis of 2"):
        pc.pipelined(ipus, stacked, x, y, count=4)
    with pytest.raises(ValueError, match="does not split into 3 micro-batches"):
        pipeline.microbatches(x, 3)


def test_bubble_fraction():
    assert pipeline.bubble_fraction(4, 4) == pytest.approx(3 / 7)
    assert pipeline.bubble_fraction(1, 5) == 0
    assert pipeline.ticks(4, 8) == 11


def test_four_stages_on_ipus_and_cpu_devices_match():
    code = """
import jax, numpy as np
import pipeline_cases as pc
stacked, (x, y) = pc.params(4), pc.data()
want = pc.sequential(stacked, x, y)
on_cpus = pc.pipelined(jax.devices("cpu")[:4], stacked, x, y, count=4)
on_ipus = pc.pipelined(jax.devices("ipu")[:4], stacked, x, y, count=4)
pc.close(on_cpus, want)
pc.close(on_ipus, want)
pc.close(on_ipus, on_cpus)
pc.close(pc.pipelined(jax.devices("ipu")[:4], stacked, x, y, count=8, remat=True), want)
for count in (4, 8):
    on_cpus = pc.one_f_one_b(jax.devices("cpu")[:4], stacked, x, y, count=count)
    on_ipus = pc.one_f_one_b(jax.devices("ipu")[:4], stacked, x, y, count=count)
    pc.close(on_cpus, want)
    pc.close(on_ipus, want)
print("OK")
"""
    proc = run_python(code, path=[HERE], JAX_IPU_DEVICE_COUNT="4", XLA_FLAGS="--xla_force_host_platform_device_count=4")
    assert "OK" in proc.stdout, proc.stdout + proc.stderr[-3000:]
