"""Serial splits of planned convolutions (compiler/planners/conv.py, as
poplin's outChanSplit.serial and inChanSplit.serial): when no partition's
temporaries fit the available_memory_proportion budget, the same tiles run
the convolution in steps over slices of the output channels or of the
input channels. The planner's choice, the values against XLA:CPU, the
peak temporaries, the cost of the extra steps, and programs that fit only
thanks to them."""
from __future__ import annotations

import dataclasses
import re
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import test_conv_random as conv_random
from hypothesis import given, settings
from hypothesis import strategies as st
from jax import lax

from helpers import SMALL, compile_fn, lower, on_cpu
from jax_ipu.compiler import compile_module, cost, cost_conv
from jax_ipu.compiler.options import CompileOptions
from jax_ipu.compiler.planners import conv as planner
from jax_ipu.graph import programs as p
from jax_ipu.graph.codelets_conv import ConvPartials
from jax_ipu.model.engine import Engine
from jax_ipu.ops import cycles_per_vector
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
    monkeypatch.setattr(planner, "MAX_IN_SERIAL", 1)
    yield
    planner.plan_conv.cache_clear()


@pytest.fixture
def without_in_serial_splits(monkeypatch):
    """The planner with serial splits over output channels only."""
    planner.plan_conv.cache_clear()
    monkeypatch.setattr(planner, "MAX_IN_SERIAL", 1)
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


def _conv_and_grad(case, dtype):
    """CASES[case]'s convolution, the gradient of the sum of its squares
    with respect to both operands, and random operands of `dtype`."""
    lhs, rhs, kwargs = CASES[case]
    conv = _conv(kwargs)

    def loss(x, w):
        y = conv(x, w).astype(np.float32)
        return (y * y).sum()
    return conv, jax.grad(loss, argnums=(0, 1)), rand(lhs, dtype, 0), rand(rhs, dtype, 1)


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", list(CASES), ids=lambda c: f"stablehlo.convolution-serial-{c}")
def test_serially_split_convolution_and_its_gradients_match_cpu(case, dtype, three_serial_steps):
    """Forward, input gradient and weight gradient in serial steps: the
    values of XLA:CPU (float32 within 1e-4, float16 within 2e-2 of each
    result's scale: float16 products summed in another order)."""
    conv, grad, x, w = _conv_and_grad(case, dtype)
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


# -- serial splits over input channels ------------------------------------

def test_in_channel_split_only_where_it_is_needed():
    """A 3x3 convolution of 512 channels into 8 over a 28x28 field: its
    fastest partition fits 0.6 of a tile, so it runs in one step; under a
    budget no partition meets and splitting its 8 output channels cannot
    (every step still receives the whole input region), it runs in steps
    over input channels, each within the budget, fewer temporaries than
    any single step, and faster than any output-channel split that fits."""
    problem = _problem(batch=32, chans=512, out_chans=8)
    ample = planner.plan_conv(IPU2, problem, 0.6)
    assert ample.serial == ample.in_serial == 1
    proportion = 0.05
    unsplit = planner._plan_parallel(IPU2, problem, proportion)
    assert not planner.fits(unsplit, IPU2, proportion)
    short = planner.plan_conv(IPU2, problem, proportion)
    assert short.in_serial > 1 and short.serial == 1, short
    assert planner.fits(short, IPU2, proportion)
    assert short.temporary_bytes < unsplit.temporary_bytes
    assert short.cycles > ample.cycles
    for serial in (2, 4, 8):
        other = planner.serial_plan(IPU2, problem, proportion, serial)
        assert not planner.fits(other, IPU2, proportion) or other.cycles > short.cycles
    # Where splitting the output channels is the faster way into the
    # budget (a stage-2 3x3 convolution of 256 into 512 channels), it is
    # the one taken.
    assert planner.plan_conv(IPU2, _problem(), 0.05).in_serial == 1


@pytest.mark.parametrize("serial", [2, 3, 4, 8])
def test_in_channel_steps_cost_their_slices_accumulation_and_cast(serial):
    """An input-channel serial plan costs, per step, its convolution (its
    own exchange, sync, vertices and reduction, planned for its slice with
    the result in the partials' type), the input's and kernel's slices
    copied in (two exchanges and syncs) and the add into the accumulator
    (a sync and an add over the output's share of a tile); then once the
    accumulator cast to the output's type (an exchange, a sync and the
    cast): poplin's per-step estimate times the split plus its output
    cast (ConvModel.cpp). Its temporaries: a step's, the two slices' and
    the accumulator's (poplin's addInPlaceTempBytes)."""
    problem, proportion = _problem(batch=32, chans=512, out_chans=8), 0.05
    plan = planner.in_serial_plan(IPU2, problem, proportion, serial)
    block = -(-problem.in_chans // serial)
    steps = -(-problem.in_chans // block)
    step_problem = dataclasses.replace(problem, in_chans=block, out_dtype=np.dtype(np.float32),
                                       batch_outer_in_place=True, batch_inner_in_place=True)
    step = planner._plan_parallel(IPU2, step_problem, proportion, spread=False)
    tiles = IPU2.num_tiles
    per_tile_out = -(-32 * 28 * 28 * 8 // tiles)
    in_slice = -(-32 * 28 * 28 * block * 2 // tiles)
    w_slice = -(-9 * block * 8 * 2 // tiles)
    add = IPU2.supervisor_cycles + cost.worker_cycles(IPU2, per_tile_out, cycles_per_vector(["add"]),
                                                      IPU2.vector_width(np.float32))
    per_step = (2 * (IPU2.exchange_fixed_cycles + IPU2.sync_cycles) + (in_slice + w_slice) / IPU2.exchange_bytes_per_cycle
                + IPU2.sync_cycles + add)
    cast = float(cost_conv.reduce_cycles(IPU2, per_tile_out, 1, False, True))
    final = IPU2.exchange_fixed_cycles + IPU2.sync_cycles + 4 * per_tile_out / IPU2.exchange_bytes_per_cycle + cast
    assert plan.in_serial == steps and plan.serial == 1
    assert plan.cycles == pytest.approx(steps * (step.cycles + per_step) + final)
    assert cast > 0 and add > IPU2.supervisor_cycles
    assert plan.temporary_bytes == step.temporary_bytes + in_slice + w_slice + 4 * per_tile_out
    # The step's convolution keeps its sums in float32 for the accumulator.
    assert step.in_chans[0] * step.in_chans[1] == block


@pytest.fixture
def input_channel_steps(monkeypatch):
    """Every planned convolution of more than one input channel split into
    three serial steps over its input channels (the last smaller where
    they do not divide by three), whatever the budget; the problems seen."""
    from jax_ipu.compiler.lowering import conv as lowering
    seen = []

    def plan(target, problem, proportion):
        seen.append(problem)
        return planner.in_serial_plan(target, problem, proportion, min(3, problem.in_chans))
    monkeypatch.setattr(lowering, "plan_conv", plan)
    return seen


def _in_serial_convs(program) -> int:
    """How many convolutions run in input-channel steps (each has one
    compute set its full steps rerun)."""
    return len({id(cs) for cs in _conv_steps(program)
                if "serial steps of" in cs.name and "over input channels" in cs.name})


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", list(CASES), ids=lambda c: f"stablehlo.convolution-in-serial-{c}")
def test_input_channel_steps_and_their_gradients_match_cpu(case, dtype, input_channel_steps):
    """Forward, input gradient and weight gradient (whose input channels
    are the batch) in serial steps over input channels, uneven last slices
    among them: the values of XLA:CPU (float32 within 1e-4, float16 within
    2e-2 of each result's scale)."""
    conv, grad, x, w = _conv_and_grad(case, dtype)
    for f, args in ((conv, (x, w)), (grad, (x, w))):
        input_channel_steps.clear()
        program = compile_fn(f, *args)
        split = [problem for problem in input_channel_steps if problem.in_chans > 1]
        assert split and _in_serial_convs(program) == len(split), [cs.name for cs in _conv_steps(program)]
        # A last, smaller slice of its own where the channels do not divide
        # into steps of a third of them.
        uneven = [problem for problem in split if problem.in_chans % -(-problem.in_chans // 3)]
        assert len([cs for cs in _conv_steps(program) if re.search(r"serial step \d+ of \d+ over input", cs.name)]) \
            == len(uneven)
        got = Engine(SMALL).run(program, list(args))
        want = on_cpu(f, *args)
        for g, wv in zip(got, jax.tree.leaves(want), strict=True):
            wv = np.asarray(wv, np.float32)
            scale = max(1.0, float(np.abs(wv).max()))
            tol = 2e-2 if dtype == np.float16 else 1e-4
            np.testing.assert_allclose(np.asarray(g, np.float32), wv, rtol=0, atol=tol * scale)


@pytest.mark.parametrize("dtype", [np.int32, np.int8], ids=lambda d: np.dtype(d).name)
def test_integer_convolution_in_input_channel_steps(dtype, input_channel_steps):
    """An integer convolution (int32 sums, no AMP) in steps of 4, 4 and 3
    of its 11 input channels, strided: exactly XLA:CPU's values."""
    rng = np.random.default_rng(0)
    x, w = rng.integers(-3, 4, (2, 9, 9, 11)).astype(dtype), rng.integers(-3, 4, (3, 3, 11, 5)).astype(dtype)

    def conv(x, w):
        return lax.conv_general_dilated(x, w, (2, 1), "SAME", dimension_numbers=NHWC,
                                        preferred_element_type=np.int32)
    program = compile_fn(conv, x, w)
    assert _in_serial_convs(program) == 1
    np.testing.assert_array_equal(np.asarray(Engine(SMALL).run(program, [x, w])[0]), np.asarray(on_cpu(conv, x, w)))


@settings(max_examples=6, derandomize=True, **conv_random.SETTINGS)
@given(conv_random.convolutions(), st.integers(0, 2 ** 31), st.integers(2, 4))
def test_random_convolutions_in_input_channel_steps(case, seed, steps):
    """Random convolutions over every attribute (test_conv_random's), with
    their gradients, each convolution of more than one input channel in
    2 to 4 serial steps over them: XLA:CPU's values."""
    from jax_ipu.compiler.lowering import conv as lowering
    with mock.patch.object(lowering, "plan_conv", lambda target, problem, proportion: planner.in_serial_plan(
            target, problem, proportion, min(steps, problem.in_chans))):
        conv_random.check(case, seed)


@pytest.mark.parametrize("chans, distinct", [(24, 1), (16, 2)])
def test_input_channel_steps_rerun_one_compute_set(chans, distinct, input_channel_steps):
    """A convolution in three steps over its input channels (24: steps of
    8; 16: of 6, 6 and 4): the full steps run one convolution compute set
    (its vertex state held once), a smaller last its own; the second and
    later steps' sums are added into the accumulator by one compute set,
    rerun (a smaller last step's sum, of its own tensor, by another); the
    accumulator is cast to float16 once."""
    x, w = rand((2, 10, 10, chans), np.float16, 0), rand((3, 3, chans, 40), np.float16, 1)
    program = compile_fn(_conv(dict(window_strides=(1, 1), padding="SAME")), x, w)
    steps = _conv_steps(program)
    assert len(steps) == 3 and len({id(cs) for cs in steps}) == distinct
    adds = [s.compute_set for s in p.leaves(program.body)
            if isinstance(s, p.Execute) and "serial accumulate" in s.compute_set.name]
    assert len(adds) == 2 and len({id(cs) for cs in adds}) == distinct
    casts = [s for s in p.leaves(program.body) if isinstance(s, p.Execute) and "conv cast" in s.compute_set.name]
    assert len(casts) == 1


def test_a_batch_fits_thanks_to_input_channel_splits(without_in_serial_splits, monkeypatch):
    """A 3x3 convolution of 512 channels into 8 over a 16x16 field and its
    gradients, float16, batch 16 on 16 tiles, available memory proportion
    0.2: with serial splits over output channels only (8 channels: every
    step still receives the whole input region) the program does not fit;
    with splits over input channels too it does, in fewer cycles (the
    least-memory plan that did not fit was also slow)."""
    target = get_target("ipu2", num_tiles=16)
    x, w = np.zeros((16, 16, 16, 512), np.float16), np.zeros((3, 3, 512, 8), np.float16)

    def loss(w, x):
        z = lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=NHWC)
        return (z.astype(jnp.float32) ** 2).sum()
    module = lower(jax.grad(loss), w, x)
    options = CompileOptions(available_memory_proportion=0.2, allow_out_of_memory=True)
    before = compile_module(module, target, options)
    assert not before.memory.fits
    assert not _in_serial_convs(before)
    planner.plan_conv.cache_clear()
    monkeypatch.setattr(planner, "MAX_IN_SERIAL", 64)
    after = compile_module(module, target, options)
    assert after.memory.fits, after.memory.max_bytes
    assert _in_serial_convs(after)
    assert after.cycles < before.cycles
