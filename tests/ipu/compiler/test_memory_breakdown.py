"""Where the memory goes at the peak (MemoryReport's breakdown fields,
profile.report.memory_breakdown) and the outputs an optimiser writes into
its donated inputs' memory: each held there, counted once."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax import lax

from helpers import SMALL, compile_fn
from jax_ipu.profile.report import memory_breakdown


def mlp(params, x):
    h = jnp.tanh(x @ params["w1"] + params["b1"])
    return jnp.sum((h @ params["w2"] + params["b2"]) ** 2)


def training_step(optimiser):
    def step(params, state, x):
        grads = jax.grad(mlp)(params, x)
        updates, state = optimiser.update(grads, state, params)
        return optax.apply_updates(params, updates), state
    return step


def mlp_args(rng, dtype=np.float32):
    params = {"w1": rng.standard_normal((64, 96)), "b1": rng.standard_normal(96),
              "w2": rng.standard_normal((96, 32)), "b2": rng.standard_normal(32)}
    return jax.tree.map(lambda a: (a * 0.1).astype(dtype), params), rng.standard_normal((16, 64)).astype(dtype)


def compile_donated(f, args, donate, **options):
    from jax_ipu.compiler import CompileOptions, compile_module
    from jax_ipu.stablehlo import import_module
    text = jax.jit(f, donate_argnums=donate).lower(*args).as_text()
    return compile_module(import_module(text), SMALL, CompileOptions(**options))


OPTIMISERS = {"sgd momentum": optax.sgd(0.1, momentum=0.9), "adam": optax.adam(1e-2),
              "adamw": optax.adamw(1e-2, weight_decay=0.1)}


@pytest.mark.parametrize("name", sorted(OPTIMISERS))
def test_an_optimisers_updates_are_held_by_their_donated_inputs(name, ipu):
    optimiser = OPTIMISERS[name]
    params, x = mlp_args(np.random.default_rng(0))
    state = optimiser.init(params)
    step = training_step(optimiser)
    program = compile_donated(step, (params, state, x), (0, 1))
    m = program.memory
    # Every parameter and every state array (adam's counter too) is updated
    # in place, and every one of those outputs is held by its input.
    donated = len(jax.tree.leaves((params, state)))
    assert len(program.aliases) == donated
    assert len(program.in_place) == donated
    held = {program.outputs[o].tensor.id for o in program.in_place}
    assert set(m.held_by_inputs) == held
    # The bound: the arguments' bytes are always live once, and no output
    # takes bytes of its own beside them at any step. At the all-tile peak
    # the live bytes are the arguments, code, vertex state, exchange
    # buffers and the temporaries, none of them an output.
    arguments = sum(t.nbytes for t in program.inputs)
    assert m.argument_bytes == arguments
    assert int(m.always_live.sum()) == arguments + int(m.code.sum())
    assert not held & set(m.live_at_peak) and not held & set(m.live_on_max_tile)
    b = memory_breakdown(program, busiest=False)
    assert b["parts"]["arguments"] == arguments
    assert b["total"] == arguments + int(m.code.sum()) + int(m.liveness[m.peak_step])
    # The values, the inputs donated: as XLA:CPU computes them.
    got = jax.jit(step, donate_argnums=(0, 1))(*jax.device_put((params, state, x), ipu))
    want = jax.jit(step)(*jax.device_put((params, state, x), jax.devices("cpu")[0]))
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=2e-5, atol=2e-6)


def test_updates_of_several_inputs_in_one_cluster_share_their_mapping(ipu):
    # A parameter and its momentum of a small shape (on few tiles: the
    # shape a small tensor's mapping rotates over the tiles with) are
    # updated by one fused cluster.
    optimiser = optax.sgd(0.1, momentum=0.9)
    params = {f"b{i}": np.full(7 + i, 0.5 + i, np.float32) for i in range(5)}
    state = optimiser.init(params)

    def step(params, state, x):
        grads = jax.grad(lambda p: sum(jnp.sum(jnp.sin(v * x)) for v in p.values()))(params)
        updates, state = optimiser.update(grads, state, params)
        return optax.apply_updates(params, updates), state
    x = np.float32(0.3)
    program = compile_donated(step, (params, state, x), (0, 1))
    assert len(program.in_place) == 10 and len(program.memory.held_by_inputs) == 10
    for o, i in program.in_place.items():
        assert program.outputs[o].tensor.mapping is program.inputs[i].mapping
    got = jax.jit(step, donate_argnums=(0, 1))(*jax.device_put((params, state, x), ipu))
    want = jax.jit(step)(*jax.device_put((params, state, x), jax.devices("cpu")[0]))
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=2e-6, atol=1e-6)


def loop_program(x, w):
    def body(i, c):
        return jnp.tanh(c @ w) * (i + 1.0) + c
    y = lax.fori_loop(0, 4, body, x)
    return jnp.sum(y * y), y.T @ x


@pytest.mark.parametrize("case", ["mlp step", "loop"])
def test_the_breakdowns_parts_add_up_to_the_peaks(case):
    rng = np.random.default_rng(1)
    if case == "loop":
        program = compile_fn(loop_program, rng.standard_normal((128, 48)).astype(np.float32),
                             rng.standard_normal((48, 48)).astype(np.float32))
    else:
        params, x = mlp_args(rng, np.float16)
        optimiser = optax.sgd(0.1, momentum=0.9)
        program = compile_donated(training_step(optimiser), (params, optimiser.init(params), x), (0, 1))
    m = program.memory
    busiest = memory_breakdown(program, busiest=True)
    assert busiest["tile"] == m.max_tile
    assert busiest["total"] == m.max_bytes == int(m.peak[m.max_tile])
    assert busiest["live"] == int(m.not_always_live_peak[m.max_tile])
    everywhere = memory_breakdown(program, busiest=False)
    assert everywhere["step"] == int(np.argmax(m.liveness))
    assert everywhere["total"] == int(m.always_live.sum()) + int(m.liveness.max())
    for b in (busiest, everywhere):
        parts = b["parts"]
        assert sum(parts.values()) == b["total"]
        assert parts["exchange buffers"] + parts["tensors"] == b["live"]
        assert sum(b["kinds"].values()) == parts["tensors"]
        assert sum(row[0] for row in b["tensors"].values()) == parts["tensors"]
        assert sum(b["arguments_by_index"]) == parts["arguments"]
        assert parts["vertex state"] > 0 and parts["code"] > 0
    code, state = _from_the_table(program)
    assert np.array_equal(m.vertex_state, state)
    assert np.array_equal(m.code, code + state)


def _from_the_table(program):
    """([tiles] code, [tiles] vertex state) summed vertex by vertex from
    targets.codelet_memory: each vertex's state, each tile's distinct
    codelets' code once."""
    from jax_ipu.graph.programs import Execute, leaves
    from jax_ipu.targets import codelet_code_key, codelet_memory
    state = np.zeros(program.num_tiles, np.int64)
    codelets = [set() for _ in range(program.num_tiles)]
    sets = {id(step.compute_set): step.compute_set for step in leaves(program.body) if isinstance(step, Execute)}
    for cs in sets.values():
        for v in cs.vertices:
            state[v.tile] += codelet_memory(v.codelet, len(v.reads), len(v.writes))[1]
            codelets[v.tile].add(v.codelet)
    code = np.array([sum(codelet_memory(c, 0, 0)[0] for c in {codelet_code_key(c): c for c in on}.values())
                     for on in codelets], np.int64)
    return code, state


def test_code_and_vertex_state_of_a_convolution_step_are_poplibs_figures():
    """A float16 3x3 convolution's training step: its convolution, reduction
    and element-wise vertices hold PopLibs' figures (docs/ipu.md), the
    plan's code and vertex state the sum of them over its vertices."""
    from jax_ipu.targets import codelet_memory
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 8, 8, 16)).astype(np.float16)
    w = (rng.standard_normal((3, 3, 16, 16)) * 0.1).astype(np.float16)

    def loss(w, x):
        y = lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return jnp.sum(jnp.maximum(y, 0).astype(jnp.float32) ** 2)
    program = compile_fn(jax.grad(loss), w, x)
    m = program.memory
    code, state = _from_the_table(program)
    assert np.array_equal(m.vertex_state, state) and np.array_equal(m.code, code + state)
    codelets = {v.codelet.split("[")[0] for step in _executes(program) for v in step.compute_set.vertices}
    assert any(c.startswith("ConvPartial") for c in codelets), codelets
    # The figures themselves (PopLibs 7eac0f26, counted in docs/ipu.md).
    assert codelet_memory("ConvPartialnx1<float16,float16>", 2, 1) == (1526, 52)
    assert codelet_memory("ConvPartial1x1Out<float16,float32>", 2, 1) == (998, 28)
    assert codelet_memory("ReduceAdd<float32,float16>", 1, 1) == (320, 12)
    assert codelet_memory("ReducePartial<add,float32>", 1, 1) == (740, 20)
    assert codelet_memory("ElementwiseChain<float16>[multiply,add]", 3, 1) == (60 + 179 + 16, 3 * 4 + 8)
    assert codelet_memory("ElementwiseChain<float32>[convert]", 1, 2) == (60 + 179, 4 + 2 * 8)


def _executes(program):
    from jax_ipu.graph.programs import Execute, leaves
    return [step for step in leaves(program.body) if isinstance(step, Execute)]


def test_an_offloaded_optimiser_state_is_on_the_tiles_only_around_its_update():
    """SGD-momentum with its state in streaming memory (pinned_host), moved
    to the device for the update and back: each leaf's load, update and
    store run together, moved up to where its gradient is ready (within the
    backward pass), not all after it."""
    from jax_ipu.compiler import CompileOptions, compile_module
    from jax_ipu.compiler.passes.schedule import reads
    from jax_ipu.graph.programs import Copy, Execute, leaves
    from jax_ipu.stablehlo import import_module
    optimiser = optax.sgd(0.1, momentum=0.9)

    def step(params, state, x):
        grads = jax.grad(mlp)(params, x)
        state = jax.device_put(state, jax.memory.Space.Device)
        updates, state = optimiser.update(grads, state, params)
        return optax.apply_updates(params, updates), jax.device_put(state, jax.memory.Space.Host)

    params, x = mlp_args(np.random.default_rng(0))
    ipu = jax.devices("ipu")[0]

    def shapes(tree, kind=None):
        sharding = jax.sharding.SingleDeviceSharding(ipu, memory_kind=kind)
        return jax.tree.map(lambda v: jax.ShapeDtypeStruct(np.shape(v), np.asarray(v).dtype, sharding=sharding), tree)
    text = jax.jit(step, donate_argnums=(0, 1)).lower(shapes(params), shapes(optimiser.init(params), "pinned_host"),
                                                      shapes(x)).as_text()
    steps = list(leaves(compile_module(import_module(text), SMALL, CompileOptions()).body))
    loads = [i for i, s in enumerate(steps) if isinstance(s, Copy) and s.src.tensor.streaming and not s.dst.streaming]
    assert len(loads) == len(jax.tree.leaves(params))
    for i in loads:
        update, store = steps[i + 1], steps[i + 2]
        assert isinstance(update, Execute) and steps[i].dst.id in reads(update)
        assert isinstance(store, Copy) and store.dst.streaming and store.src.tensor.id in {
            t.id for _, t in update.compute_set.kernel.outputs}
    matmuls = [i for i, s in enumerate(steps) if isinstance(s, Execute) and s.compute_set.name.startswith("matmul")]
    assert min(loads) < max(matmuls)      # the first update runs before the backward pass ends
