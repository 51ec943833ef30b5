"""The differential fuzzer's threshold-sized programs (tests/fuzz,
programs.generate_sized) reach every size at which the IPU Model runs an op
another way (model/, model/fast/), on both sides of it: element-wise chains
and conversions of float32 and float16, reductions over short axes, and
products by their multiply-adds. (tests/ipu/user_programs/test_fuzz.py runs such programs
against XLA:CPU.)"""
from __future__ import annotations

import collections
import functools
import re

import numpy as np

import programs
from jax_ipu.model.fast import reduce as model_reduce
from run import program

SEEDS = range(700)


@functools.cache
def _sized():
    return [p for p in (programs.generate_sized(s) for s in SEEDS) if p is not None]


def test_element_wise_programs_cross_every_threshold_in_both_float_types():
    sizes = collections.defaultdict(set)
    for p in _sized():
        for v in p.inputs.values():
            sizes[str(v.dtype)].add(v.size)
    for dtype in (np.float32, np.float16):
        seen = sizes[np.dtype(dtype).name]
        for t in programs.elementwise_thresholds(dtype):
            below = any(t - 8 <= n < t for n in seen)
            at_or_above = any(t <= n <= t + 8 for n in seen)
            assert below and at_or_above, (np.dtype(dtype).name, t)


def test_reductions_cross_the_short_axis_and_its_row_count():
    shapes = {v.shape[-2:] for p in _sized() for v in p.inputs.values() if v.ndim >= 2}
    rows, axis = model_reduce.SHORT_AXIS_ROWS, model_reduce.SHORT_AXIS
    assert any(r >= rows and a <= axis for r, a in shapes)       # element after element
    assert any(r >= rows and a == axis + 1 for r, a in shapes)   # one axis longer: numpy's reduce
    assert any(r == rows - 1 and a <= axis for r, a in shapes)   # one row fewer
    reduced_last = [expr for p in _sized() for _, expr, family in p.lines
                    if family == "reduce" and re.search(r"axis=\((1|2),\)", expr)]
    assert len(reduced_last) > 20


def test_products_cross_every_multiply_add_threshold():
    macs = []
    for p in _sized():
        for _, expr, family in p.lines:
            if family == "dot":
                a, b = re.findall(r"\bv\d+\b", expr)[:2]
                lhs, rhs = p.vars[a].shape, p.vars[b].shape
                macs.append(int(np.prod(lhs, dtype=np.int64)) * rhs[-1])
    for t in programs.DOT_MACS:
        assert any(0.5 * t <= m < t for m in macs) and any(t <= m <= 1.5 * t for m in macs), t


def test_a_share_of_the_fuzzers_programs_is_threshold_sized():
    made = [program(s) for s in range(200)]
    sized = sum(max((v.size for v in p.inputs.values()), default=0) > 20000 for p in made if p is not None)
    assert 5 <= sized <= 40
