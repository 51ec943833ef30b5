"""Matmuls' partials type (Poplar's partialsType, the partials_type option):
float32 partials by default, float16 ones with partials_type="half" when
the result is float16, summed as docs/semantics.md says: each K-chunk's
products summed in float32 and rounded once to float16 (a matmul is a
convolution of one kernel position, its K-chunk the input channels), the
chunks then added in float16 in the plan's order."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import SMALL, compile_fn, on_cpu
from jax_ipu.compiler import cost
from jax_ipu.graph import codelets
from jax_ipu.graph.programs import Execute, leaves
from jax_ipu.model.engine import Engine
from jax_ipu.targets import get_target

F16, F32 = np.dtype(np.float16), np.dtype(np.float32)


def _products(program) -> list[Execute]:
    return [s for s in leaves(program.body)
            if isinstance(s, Execute) and isinstance(s.compute_set.kernel, codelets.MatMulPartials)]


def _model(a: np.ndarray, b: np.ndarray, chunks: int, size: int) -> np.ndarray:
    """The numpy model of float16 partials: per chunk the exact sum (float64:
    the data below keep every float32 sum exact) rounded to float16, the
    chunks then added in order, each addition rounded to float16."""
    out = None
    for j in range(chunks):
        part = (a[..., j * size:(j + 1) * size].astype(np.float64)
                @ b[..., j * size:(j + 1) * size, :].astype(np.float64)).astype(F16)
        out = part if out is None else (out.astype(np.float32) + part.astype(np.float32)).astype(F16)
    return out


def _integer_operands(m, k, n, seed=0):
    """Small integers: every product and every float32 sum exact, sums past
    2048 (float16's last exact integer) rounded by float16, none past its
    largest finite value."""
    rng = np.random.default_rng(seed)
    return (rng.integers(0, 3, (m, k)).astype(F16), rng.integers(0, 3, (k, n)).astype(F16))


@pytest.mark.parametrize("k", [96, 3000, 8192])
def test_half_partials_match_the_numpy_model_bit_for_bit(k):
    a, b = _integer_operands(4, k, 6)
    program = compile_fn(lambda x, y: x @ y, a, b, partials_type="half")
    (step,) = _products(program)
    partials = step.compute_set.kernel.out
    assert partials.dtype == F16
    assert "MatMulPartial<float16,float16>" in step.compute_set.vertices.codelet
    chunks = partials.shape[0]
    size = step.compute_set.kernel.lhs.shape[2] // chunks
    if k == 8192:
        # The chunks' float16 sum is exercised and rounds otherwise than
        # float32 partials would (one rounding of the exact sum).
        assert chunks > 1
        once = (a.astype(np.float64) @ b.astype(np.float64)).astype(F16)
        assert not np.array_equal(_model(a, b, chunks, size), once)
    for fast in (True, False):
        (got,) = Engine(SMALL, fast=fast).run(program, [a, b])
        np.testing.assert_array_equal(got.view(np.uint16), _model(a, b, chunks, size).view(np.uint16))


def test_float_partials_by_default_and_for_float32_results():
    a, b = _integer_operands(4, 8192, 6)
    default = compile_fn(lambda x, y: x @ y, a, b)
    wide = compile_fn(lambda x, y: jnp.matmul(x, y, preferred_element_type=jnp.float32), a, b, partials_type="half")
    for program in (default, wide):
        (step,) = _products(program)
        assert step.compute_set.kernel.out.dtype == F32
    # Float32 partials: the exact sum rounded once to float16.
    (got,) = Engine(SMALL).run(default, [a, b])
    want = (a.astype(np.float64) @ b.astype(np.float64)).astype(F16)
    np.testing.assert_array_equal(got, want)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 40), st.sampled_from([16, 300, 2000, 5000]), st.integers(1, 24), st.booleans(),
       st.integers(0, 2 ** 16))
def test_half_partials_within_float16_error_of_xla_cpu(m, k, n, batched, seed):
    """Random products (batched or not): within the error float16 partials
    may add to XLA:CPU's float16 result, one rounding of float16 (2^-11
    relative) per chunk and per addition of chunks, of the sum of the
    terms' magnitudes, plus XLA:CPU's own final rounding."""
    rng = np.random.default_rng(seed)
    shape = (3,) if batched else ()
    a = rng.standard_normal((*shape, m, k)).astype(F16)
    b = rng.standard_normal((*shape, k, n)).astype(F16)
    f = lambda x, y: x @ y  # noqa: E731
    program = compile_fn(f, a, b, partials_type="half")
    (step,) = _products(program)
    chunks = step.compute_set.kernel.out.shape[0]
    (got,) = Engine(SMALL).run(program, [a, b])
    want = on_cpu(f, a, b)
    magnitude = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))
    bound = (2 * chunks + 1) * 2.0 ** -11 * magnitude + 2.0 ** -24
    assert got.dtype == want.dtype == F16
    assert np.all(np.abs(got.astype(np.float64) - want.astype(np.float64)) <= bound)


def test_fast_executors_give_the_reference_bits_on_a_dense_layers_training_step():
    """The forward and both gradients of a float16 dense layer with float16
    partials (the products JAX's backward pass emits, transposed operands
    included): the fast executors' bits are the reference's."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((24, 700)).astype(F16)
    w = (rng.standard_normal((700, 40)) * 0.05).astype(F16)

    def step(x, w):
        y, pull = jax.vjp(lambda x, w: jnp.tanh(x @ w), x, w)
        return (y, *pull(jnp.ones_like(y)))
    program = compile_fn(step, x, w, partials_type="half")
    assert all(s.compute_set.kernel.out.dtype == F16 for s in _products(program))
    fast = Engine(SMALL).run(program, [x, w])
    reference = Engine(SMALL, fast=False).run(program, [x, w])
    for got, want in zip(fast, reference, strict=True):
        np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))


def test_amp_rates_are_poplibs_conv_units_worked_by_hand():
    """PopLibs' matmul is its 1x1 convolution: per output position a conv
    unit takes 4 cycles for its chain of four 64-bit loads, 16 float16
    inputs; ipu2 has 16 conv units with float16 partials, 8 with float32
    ones: 16 x 16 / 4 = 64 and 8 x 16 / 4 = 32 multiply-adds a cycle. ipu1
    has 8 either way (32). Float32 inputs: the datasheet's 32 flops a cycle,
    16 multiply-adds."""
    ipu1, ipu2 = get_target("ipu1"), get_target("ipu2")
    assert cost.amp_macs_per_cycle(ipu2, F16, F16) == 64
    assert cost.amp_macs_per_cycle(ipu2, F16, F32) == cost.amp_macs_per_cycle(ipu2, F16) == 32
    assert cost.amp_macs_per_cycle(ipu2, F32, F32) == 16
    assert cost.amp_macs_per_cycle(ipu1, F16, F16) == cost.amp_macs_per_cycle(ipu1, F16, F32) == 32
    # The planner and the vertices charge it: a one-tile [512,16]x[16,16].
    one = get_target("ipu2", num_tiles=1)
    a, b = np.ones((512, 16), F16), np.ones((16, 16), F16)
    for partials, rate in (("half", 64), ("float", 32)):
        (step,) = _products(compile_fn(lambda x, y: x @ y, a, b, target=one, partials_type=partials))
        assert step.cycles - step.exchange_cycles - step.sync_cycles == 330 + 512 * 16 * 16 // rate
