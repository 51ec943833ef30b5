"""The per-tile memory plan, out-of-memory errors and buffer donation."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import SMALL, compile_fn, lower
from jax_ipu.compiler import CompileOptions, compile_module
from jax_ipu.errors import IpuOutOfMemoryError
from jax_ipu.model.engine import Engine
from jax_ipu.targets import get_target

TINY = get_target("ipu2", num_tiles=4)


def test_big_tensor_on_four_tiles_is_out_of_memory():
    x = np.zeros(1 << 20, np.float32)   # 4 MiB over 4 x 624 KiB tiles
    module = lower(lambda a: a * 2 + 1, x)
    with pytest.raises(IpuOutOfMemoryError) as info:
        compile_module(module, TINY)
    message = str(info.value)
    assert "out of memory on tile" in message
    assert f"has {TINY.bytes_per_tile}" in message
    assert "needs" in message and "argument 0 float32[1048576]" in message
    assert "JAX_IPU_MODEL_NUM_TILES" in message
    report = info.value.report
    assert report.max_bytes > TINY.bytes_per_tile and not report.fits
    needed = int(message.split("needs ")[1].split(" bytes")[0])
    assert needed == report.max_bytes


def test_allow_out_of_memory_keeps_the_report():
    x = np.zeros(1 << 20, np.float32)
    program = compile_module(lower(lambda a: a * 2 + 1, x), TINY, CompileOptions(allow_out_of_memory=True))
    assert not program.memory.fits
    assert program.memory.max_bytes > TINY.bytes_per_tile


def test_memory_report_counts_arguments_and_liveness():
    x = np.zeros(4096, np.float32)
    program = compile_fn(lambda a: jnp.sum(a * 2) + a[0], x)
    m = program.memory
    assert m.argument_bytes == x.nbytes
    assert int(m.always_live.sum()) >= x.nbytes     # arguments stay resident
    assert m.peak.shape == (SMALL.num_tiles,)
    assert (m.peak >= m.always_live).all() and m.total_bytes == int(m.peak.sum())
    assert m.max_bytes == m.peak[m.max_tile]
    assert program.memory_stats()["arguments"] == x.nbytes


def test_donated_argument_is_aliased_and_written_in_place():
    x = np.arange(1000, dtype=np.float32)
    module = jax.jit(lambda a: a * 2 + 1, donate_argnums=0).lower(x).as_text()
    from jax_ipu.stablehlo import import_module
    program = compile_module(import_module(module), SMALL)
    assert program.aliases == {0: 0} and program.in_place == {0: 0}
    engine = Engine(SMALL)
    kept = x.copy()
    out = engine.run(program, [kept], donated=frozenset())[0]
    assert out is not kept and (kept == x).all()
    donated = x.copy()
    out = engine.run(program, [donated], donated=frozenset({0}))[0]
    assert out is donated
    np.testing.assert_array_equal(out, x * 2 + 1)


def test_donors_pair_with_first_free_output_of_same_type():
    x = np.ones(8, np.float32)
    module = lower(lambda a, b: (a.sum(), b + 1, a * 3), x, x)
    module.main.arg_donors[:] = [True, False]
    program = compile_module(module, SMALL)
    assert program.aliases == {1: 0}
    assert program.in_place == {}     # argument 0 is still read after output 1 is written


def test_a_loop_body_holds_its_intermediates_over_their_own_steps():
    """A fori_loop's weights are read where they lie (no carried copy), and
    a body of k matmuls in a row holds each intermediate only from the step
    that writes it to the one that reads it: the temporaries' peak does not
    grow with k. The values stay numpy's."""
    from jax import lax

    from jax_ipu.graph import programs as p

    rng = np.random.default_rng(0)
    w = (rng.standard_normal((256, 256)) / 16).astype(np.float32)
    x = rng.standard_normal((64, 256)).astype(np.float32)
    peaks = {}
    for k in (1, 6):
        def f(x, w, k=k):
            def body(i, h):
                for _ in range(k):
                    h = jnp.tanh(h @ w)
                return h
            return lax.fori_loop(0, 3, body, x)
        program = compile_fn(f, x, w)
        weights = program.inputs[1]
        assert not [s for s in p.leaves(program.body) if isinstance(s, p.Copy) and weights in s.src.tensors]
        peaks[k] = int(program.memory.temporary_bytes)
        want = x
        for _ in range(3 * k):
            want = np.tanh(want @ w)
        got = Engine(SMALL).run(program, [x, w])[0]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    # Six intermediates of 64 KiB each held over the whole loop would add 320 KiB.
    assert peaks[6] < peaks[1] + 64 * 256 * 4
