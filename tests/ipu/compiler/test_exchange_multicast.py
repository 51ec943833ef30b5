"""The exchange multicasts: a tile sends each element it holds once and
every tile that needs it receives it, so a broadcast (LayerNorm's mean and
variance over a [batch, tokens, width] activation, and its scale and bias,
read by the fused vertices as broadcast views) costs what its busiest
receiver takes, not what the few tiles holding the statistics would send
to every reader one by one."""
from __future__ import annotations

import flax.linen as nn
import jax
import numpy as np

from helpers import compile_fn, run_cpu
from jax_ipu.graph.programs import Copy, Execute, leaves
from jax_ipu.graph.views import View
from jax_ipu.model.engine import Engine
from jax_ipu.targets import get_target


def test_broadcast_copies_cost_their_busiest_receiver():
    target = get_target("ipu2", num_tiles=64)
    x = np.random.default_rng(0).standard_normal((4, 32, 768)).astype(np.float32)
    ln = nn.LayerNorm()
    params = ln.init(jax.random.PRNGKey(0), x)
    w = np.ones((768, 16), np.float32) / 768

    def f(scale, bias, x):
        return ln.apply({"params": {"scale": scale, "bias": bias}}, x) @ w

    scale, bias = params["params"]["scale"], params["params"]["bias"]
    program = compile_fn(f, scale, bias, x, target=target)
    assert not [s for s in leaves(program.body)
                if isinstance(s, Copy) and any(op[0] == "broadcast" for op in getattr(s.src, "ops", ()))]
    fused = [s for s in leaves(program.body) if isinstance(s, Execute)
             and any(isinstance(v, View) and v.ops and v.ops[-1][0] == "broadcast"
                     for v in getattr(s.compute_set.kernel, "inputs", ()))]
    assert fused
    for step in fused:
        out = step.compute_set.kernel.outputs[0][1]
        per_tile = out.mapping.elements_per_tile(target.num_tiles) * out.dtype.itemsize
        sources = sum(v.tensor.size * v.dtype.itemsize for v in step.compute_set.kernel.inputs
                      if isinstance(v, View) and v.ops and v.ops[-1][0] == "broadcast")
        # At most a tile's part of the result and the broadcast sources
        # received: with the statistics' tiles sending to each reader one by
        # one, this was ~50x more.
        bound = target.exchange_fixed_cycles + -(-(int(per_tile.max()) + sources) // target.exchange_bytes_per_cycle)
        assert 0 < step.exchange_cycles <= bound, (step.compute_set.name, step.exchange_cycles, bound)
    got = Engine(target).run(program, [np.asarray(scale), np.asarray(bias), x])[0]
    want = run_cpu(f, scale, bias, x)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
