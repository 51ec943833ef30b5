"""Serial splits of planned convolutions (compiler/planners/conv.py, as
poplin's outChanSplit.serial): when no partition's temporaries fit the
available_memory_proportion budget, the same tiles run the convolution in
steps over slices of the output channels. The planner's choice, the values
against XLA:CPU, the peak temporaries, the cost of the extra steps, and a
program that fits only thanks to them."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from helpers import SMALL, compile_fn, lower, on_cpu
from jax_ipu.compiler import compile_module
from jax_ipu.compiler.options import CompileOptions
from jax_ipu.compiler.planners import conv as planner
from jax_ipu.graph import programs as p
from jax_ipu.graph.codelets_conv import ConvPartials
from jax_ipu.model.engine import Engine
from jax_ipu.targets import get_target

NHWC = ("NHWC", "HWIO", "NHWC")
IPU2 = get_target("ipu2")


def rand(shape, dtype, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _problem(batch=8, chans=256, out_chans=512, field=28, window=3, dtype=np.float16, partials=np.float32):
    pad = window // 2
    return planner.ConvProblem(1, batch, chans, out_chans, (field, field), (window, window), (field, field),
                               (1, 1), ((pad, pad), (pad, pad)), (1, 1), (1, 1), np.dtype(dtype),
                               np.dtype(partials), np.dtype(dtype))


def _conv_steps(program) -> list:
    return [s.compute_set for s in p.leaves(program.body)
            if isinstance(s, p.Execute) and isinstance(s.compute_set.kernel, ConvPartials)]


@pytest.fixture
def without_serial_splits(monkeypatch):
    """The planner as it was without serial splits (its plans cached per
    problem, so the cache is emptied on the way in and out)."""
    planner.plan_conv.cache_clear()
    monkeypatch.setattr(planner, "MAX_SERIAL", 1)
    yield
    planner.plan_conv.cache_clear()


def test_serial_split_only_when_the_budget_is_short():
    """A ResNet stage-2 3x3 convolution's fastest partition fits 0.6 of a
    tile, so it runs in one step; under a budget its partitions cannot
    meet, it runs in serial steps that do, each step's temporaries within
    the budget and fewer than the least any single step could have."""
    problem = _problem()
    ample = planner.plan_conv(IPU2, problem, 0.6)
    assert ample.serial == 1 and planner.fits(ample, IPU2, 0.6)
    unsplit = planner._plan_parallel(IPU2, problem, 0.05)
    assert not planner.fits(unsplit, IPU2, 0.05)
    short = planner.plan_conv(IPU2, problem, 0.05)
    assert short.serial > 1, short
    assert planner.fits(short, IPU2, 0.05)
    assert short.temporary_bytes < unsplit.temporary_bytes
    # Slower than the unsplit plan: chosen for memory, not speed.
    assert short.cycles > ample.cycles


def test_the_fastest_fitting_split_is_chosen():
    """Among serial splits whose steps fit, the planner takes the fastest
    (poplin: cycles first under the memory limit), not the most steps."""
    problem, proportion = _problem(), 0.05
    chosen = planner.plan_conv(IPU2, problem, proportion)
    for serial in (2, 4, 8, 16):
        other = planner.serial_plan(IPU2, problem, proportion, serial)
        if planner.fits(other, IPU2, proportion) and other.serial <= 2 * chosen.serial:
            assert chosen.cycles <= other.cycles, (serial, chosen, other)


@pytest.mark.parametrize("serial", [2, 4, 8])
def test_serial_steps_add_their_exchange_and_syncs(serial):
    """A serial plan costs each step's own exchange, sync, vertices and
    reduction (poplin multiplies its per-step estimate by the split,
    ConvModel.cpp) and its copies of the kernel slice in and its result
    out, plus one copy of the steps' results into the output: an exchange
    of the output's share of a tile and its sync."""
    problem, proportion = _problem(), 0.05
    plan = planner.serial_plan(IPU2, problem, proportion, serial)
    block = -(-problem.out_chans // serial)
    step = planner._plan_parallel(IPU2, dataclasses.replace(problem, out_chans=block), proportion, spread=False)
    copy = (IPU2.exchange_fixed_cycles + IPU2.sync_cycles
            + planner.serial_output_bytes(IPU2, problem) / IPU2.exchange_bytes_per_cycle)
    per_step = planner.serial_step_copy_cycles(IPU2, problem, block)
    assert plan.serial == serial
    assert plan.cycles == pytest.approx(serial * (step.cycles + per_step) + copy)
    # Each step's copies: the kernel slice in (an exchange and a sync), the
    # result out (a sync).
    assert per_step > IPU2.exchange_fixed_cycles + 2 * IPU2.sync_cycles
    # Each step pays at least an exchange and a sync of its own.
    assert step.cycles > IPU2.exchange_fixed_cycles + IPU2.sync_cycles
    assert plan.temporary_bytes == step.temporary_bytes + planner.serial_output_bytes(IPU2, problem)


# (lhs shape, rhs shape, conv_general_dilated kwargs): strides, padding,
# input and kernel dilation, feature groups.
CASES = {
    "3x3-same": ((2, 10, 10, 16), (3, 3, 16, 40), dict(window_strides=(1, 1), padding="SAME")),
    "strided-padded": ((2, 11, 9, 8), (3, 2, 8, 24), dict(window_strides=(2, 3), padding=((2, 1), (0, 2)))),
    "dilated": ((1, 12, 12, 8), (3, 3, 8, 20), dict(window_strides=(1, 1), padding=((1, 1), (2, 2)),
                                                     lhs_dilation=(2, 1), rhs_dilation=(1, 2))),
    "groups": ((2, 8, 8, 12), (3, 3, 4, 24), dict(window_strides=(1, 1), padding="SAME",
                                                  feature_group_count=3)),
}


def _conv(kwargs):
    return lambda x, w: lax.conv_general_dilated(x, w, dimension_numbers=NHWC, **kwargs)


def _serial_names(program) -> list[str]:
    return [cs.name for cs in _conv_steps(program) if "serial step" in cs.name]


@pytest.fixture
def three_serial_steps(monkeypatch):
    """Every planned convolution split into three serial steps (the last
    smaller where the output channels do not divide by three), whatever
    the budget."""
    from jax_ipu.compiler.lowering import conv as lowering
    monkeypatch.setattr(lowering, "plan_conv", lambda target, problem, proportion: planner.serial_plan(
        target, problem, proportion, min(3, problem.out_chans)))


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", list(CASES), ids=lambda c: f"stablehlo.convolution-serial-{c}")
def test_serially_split_convolution_and_its_gradients_match_cpu(case, dtype, three_serial_steps):
    """Forward, input gradient and weight gradient in serial steps: the
    values of XLA:CPU (float32 within 1e-4, float16 within 2e-2 of each
    result's scale: float16 products summed in another order)."""
    lhs, rhs, kwargs = CASES[case]
    x, w = rand(lhs, dtype, 0), rand(rhs, dtype, 1)
    conv = _conv(kwargs)

    def loss(x, w):
        y = conv(x, w).astype(np.float32)
        return (y * y).sum()
    grad = jax.grad(loss, argnums=(0, 1))
    tol = dict(atol=2e-2, rtol=0) if dtype == np.float16 else dict(atol=1e-4, rtol=1e-4)
    for f, args in ((conv, (x, w)), (grad, (x, w))):
        program = compile_fn(f, *args)
        assert _serial_names(program), [cs.name for cs in _conv_steps(program)]
        assert all("serial step" in cs.name for cs in _conv_steps(program))
        got = Engine(SMALL).run(program, list(args))
        want = on_cpu(f, *args)
        for g, wv in zip(got, jax.tree.leaves(want), strict=True):
            wv = np.asarray(wv, np.float32)
            scale = max(1.0, float(np.abs(wv).max())) if dtype == np.float16 else 1.0
            np.testing.assert_allclose(np.asarray(g, np.float32), wv, rtol=tol["rtol"], atol=tol["atol"] * scale)


def test_serial_steps_lower_the_peak_temporaries(without_serial_splits, monkeypatch):
    """The same convolution under the same short budget: with serial steps
    each tile's peak of temporaries is lower than with the least-memory
    single step (whose input regions, kernel blocks and partials are all
    live at once)."""
    x, w = rand((4, 12, 12, 64), np.float16, 0), rand((3, 3, 64, 192), np.float16, 1)
    conv = _conv(dict(window_strides=(1, 1), padding="SAME"))
    unsplit = compile_fn(conv, x, w, available_memory_proportion=0.02)
    assert not _serial_names(unsplit)
    planner.plan_conv.cache_clear()
    monkeypatch.setattr(planner, "MAX_SERIAL", 64)
    split = compile_fn(conv, x, w, available_memory_proportion=0.02)
    assert _serial_names(split)
    assert split.memory.not_always_live_peak.max() < unsplit.memory.not_always_live_peak.max()
    assert split.memory.max_bytes < unsplit.memory.max_bytes
    # The same tiles, one step after another: one sync and exchange each,
    # every step but a smaller last one running the same compute set (its
    # vertices, and their state, held once).
    steps = _conv_steps(split)
    assert len(steps) == len(_serial_names(split)) > 1
    assert len({id(cs) for cs in steps}) <= 2 < len(steps)


def _two_layer_loss(w1, w2, x):
    y = jax.nn.relu(lax.conv_general_dilated(x, w1, (1, 1), "SAME", dimension_numbers=NHWC))
    z = lax.conv_general_dilated(y, w2, (1, 1), "SAME", dimension_numbers=NHWC)
    return (z.astype(jnp.float32) ** 2).sum()


def test_a_batch_fits_thanks_to_serial_splits(without_serial_splits, monkeypatch):
    """Two 3x3 convolutions of 128 and 512 channels over an 8x8 field and
    their gradients, float16, batch 12 on 16 tiles, available memory
    proportion 0.3: without serial splits the convolutions no partition
    fits take the least-memory one and the program does not fit; with
    them it does."""
    target = get_target("ipu2", num_tiles=16)
    x = np.zeros((12, 8, 8, 128), np.float16)
    w1, w2 = np.zeros((3, 3, 128, 512), np.float16), np.zeros((3, 3, 512, 128), np.float16)
    module = lower(jax.grad(_two_layer_loss, argnums=(0, 1)), w1, w2, x)
    options = CompileOptions(available_memory_proportion=0.3, allow_out_of_memory=True)
    before = compile_module(module, target, options)
    assert not before.memory.fits
    planner.plan_conv.cache_clear()
    monkeypatch.setattr(planner, "MAX_SERIAL", 64)
    after = compile_module(module, target, options)
    assert after.memory.fits, after.memory.max_bytes
    assert _serial_names(after)
