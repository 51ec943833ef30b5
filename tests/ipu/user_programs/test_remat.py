"""Recomputation (activation checkpointing) as a JAX user writes it:
jax.checkpoint of each block of a network, or flax.linen.remat of a module.
JAX emits the recomputed forward ops inside the backward pass, after an
optimization_barrier that takes the values they recompute from and the
incoming cotangent. The compiler keeps program order and fuses no
element-wise op across the barrier, so the recomputation runs late and the
block's activations live only while its backward pass runs: numerics match
XLA:CPU's, and the planned peak memory drops as recomputation promises."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax

from helpers import SMALL, assert_matches_cpu, compile_fn

BLOCKS, WIDTH, BATCH = 8, 32, 512


def _mlp_block(params, x):
    w1, w2 = params
    return x + jnp.sin(jnp.tanh(x @ w1)) @ w2


def _mlp_grad(remat: bool):
    block = jax.checkpoint(_mlp_block) if remat else _mlp_block

    def loss(params, x):
        for p in params:
            x = block(p, x)
        return (x ** 2).sum()
    return jax.grad(loss)


def _mlp_args(blocks=BLOCKS, width=WIDTH, batch=BATCH):
    rng = np.random.default_rng(0)
    params = [((rng.standard_normal((width, 4 * width)) / np.sqrt(width)).astype(np.float32),
               (rng.standard_normal((4 * width, width)) / np.sqrt(4 * width)).astype(np.float32))
              for _ in range(blocks)]
    return params, rng.standard_normal((batch, width)).astype(np.float32)


def _cpu_bytes(f, *args) -> int:
    """XLA:CPU's buffer assignment for f: arguments + outputs - aliased + temporaries."""
    m = jax.jit(f).lower(*args).compile().memory_analysis()
    return m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes + m.temp_size_in_bytes


def test_checkpointed_mlp_gradients_match_xla_cpu():
    params, x = _mlp_args(blocks=3, batch=64)
    # Planned matmuls sum in another order than XLA:CPU's.
    assert_matches_cpu(_mlp_grad(True), params, x, rtol=1e-4, atol=1e-4)


def test_recomputation_lowers_the_planned_peak():
    """Without jax.checkpoint the backward pass reads each block's saved
    activations (x, tanh, sin and cos of it: [512, 128] floats, 256 KiB
    each, for each of the 8 blocks); with it only each block's input
    ([512, 32], 64 KiB) is kept, and one block's activations at a time are
    recomputed. The plan (all tiles' peaks, code aside) must show that.

    Reference: XLA:CPU runs the same pair of programs but merges the
    recomputation with the forward ops it repeats (its optimizing passes
    drop the barrier and CSE the two), so its buffer assignment for the
    checkpointed program is within a few percent of the plain one: that is
    what a compiler needs that hoists or merges the recomputation. Ours must
    need well under it, and well under its own plain program; measured,
    2.35 MB against XLA:CPU's 5.57 MB and its own 9.69 MB. A recomputation
    hoisted next to the forward pass, or merged with it, keeps every
    block's activations alive as the plain program does, and fails both."""
    params, x = _mlp_args()
    peaks = {}
    for remat in (False, True):
        program = compile_fn(_mlp_grad(remat), params, x, target=SMALL, allow_out_of_memory=True)
        peaks[remat] = program.memory.total_bytes - int(program.memory.code.sum())
    cpu_plain, cpu_remat = _cpu_bytes(_mlp_grad(False), params, x), _cpu_bytes(_mlp_grad(True), params, x)
    assert cpu_remat > 0.9 * cpu_plain, "XLA:CPU no longer merges the recomputation: restate this test's reference"
    assert peaks[True] < 0.4 * peaks[False], peaks
    assert peaks[True] < 0.6 * cpu_remat, (peaks, cpu_remat)


class _Block(nn.Module):
    """A bottleneck-style block: 1x1, 3x3 and 1x1 convolutions with
    BatchNorm and ReLU, and the residual."""
    @nn.compact
    def __call__(self, x, train):
        norm = lambda: nn.BatchNorm(use_running_average=not train, momentum=0.9)
        y = nn.relu(norm()(nn.Conv(4, (1, 1), use_bias=False)(x)))
        y = nn.relu(norm()(nn.Conv(4, (3, 3), use_bias=False)(y)))
        y = norm()(nn.Conv(x.shape[-1], (1, 1), use_bias=False)(y))
        return nn.relu(x + y)


class _Net(nn.Module):
    remat: bool

    @nn.compact
    def __call__(self, x, train):
        block = nn.remat(_Block, static_argnums=(2,)) if self.remat else _Block
        x = nn.Conv(8, (3, 3), use_bias=False)(x)
        for _ in range(3):
            x = block()(x, train)
        return nn.Dense(4)(x.mean((1, 2)))


def _train_step(remat: bool):
    model, tx = _Net(remat), optax.sgd(0.1, momentum=0.9)
    x = np.random.default_rng(1).standard_normal((2, 8, 8, 3)).astype(np.float32)
    y = np.array([1, 3], np.int32)
    with jax.default_device(jax.devices("cpu")[0]):
        variables = jax.jit(lambda: model.init(jax.random.PRNGKey(0), x, False))()

    def step(params, stats, opt_state, x, y):
        def loss_fn(params):
            logits, updates = model.apply({"params": params, "batch_stats": stats}, x, True,
                                          mutable=["batch_stats"])
            return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean(), updates["batch_stats"]
        (loss, stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), stats, opt_state, loss
    return step, (variables["params"], variables["batch_stats"], tx.init(variables["params"]), x, y)


def test_flax_remat_training_step_matches_xla_cpu():
    """nn.remat of each block of a small conv net with BatchNorm: the
    training step (new parameters, statistics, momentum, loss) through the
    plugin matches XLA:CPU's."""
    step, args = _train_step(True)
    assert_matches_cpu(step, *args, rtol=1e-4, atol=1e-5, scaled=True)


def _fused_compute_sets(program) -> int:
    from jax_ipu.graph.programs import Execute, leaves
    return sum(isinstance(s, Execute) and s.compute_set.name.startswith("fused") for s in leaves(program.body))


def test_no_fusion_across_an_optimization_barrier():
    """sin before the barrier and cos after it are two compute sets, not one
    fused chain: a value made after a barrier is not computed before it
    (jax.checkpoint relies on that to keep the recomputation in the backward
    pass). Without the barrier they fuse into one."""
    x = np.linspace(-3, 3, 64, dtype=np.float32)
    barrier = lambda v: jnp.cos(lax.optimization_barrier(jnp.sin(v)) * 2)
    plain = lambda v: jnp.cos(jnp.sin(v) * 2)
    assert _fused_compute_sets(compile_fn(plain, x)) == 1
    assert _fused_compute_sets(compile_fn(barrier, x)) == 2
    assert_matches_cpu(barrier, x, rtol=1e-6, atol=1e-6, target=SMALL)


def _lower_donating(f, donate, *args):
    """f as the plugin receives it when jitted with donate_argnums."""
    from jax._src.lib import _jax
    from jaxlib.mlir.dialects import stablehlo

    from jax_ipu.stablehlo import import_module
    text = jax.jit(f, donate_argnums=donate).lower(*args).as_text(debug_info=True)
    return import_module(_jax.mlir.serialize_portable_artifact(text, stablehlo.get_current_version()))


def _sgd_step():
    tx = optax.sgd(0.1, momentum=0.9)

    def step(params, opt_state, x):
        def loss(params):
            y = x
            for w1, w2 in params:
                y = y + jnp.tanh(y @ w1) @ w2
            return (y ** 2).mean()
        value, grads = jax.value_and_grad(loss)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value
    params, _ = _mlp_args(blocks=4, width=128, batch=16)
    x = np.random.default_rng(2).standard_normal((16, 128)).astype(np.float32)
    # On the host, so that each device_put copies (donation deletes what it is given).
    return step, jax.tree.map(np.asarray, (params, tx.init(params), x))


def test_updates_of_donated_parameters_run_as_their_gradients_are_ready(ipu):
    """A training step with its parameters and momentum donated: each
    update is written in place into its parameter's (momentum's) memory,
    so it takes no memory of its own, and is scheduled as soon as its
    gradient is ready, not after the whole backward pass as JAX emits it,
    so no gradient waits for the end. Without donation the plan holds the
    new parameters and momentum (2 x 2 MiB) and the gradients at the end;
    with it the peak is the forward pass's activations: measured, 1.06 MB
    against 4.59 MB."""
    from jax_ipu.compiler import CompileOptions, compile_module
    step, args = _sgd_step()
    param_bytes = sum(w.nbytes for pair in args[0] for w in pair)
    peaks = {}
    for donate in ((), (0, 1)):
        program = compile_module(_lower_donating(step, donate, *args), SMALL,
                                 CompileOptions(allow_out_of_memory=True))
        peaks[donate] = int(program.memory.liveness.max())
    assert len(program.in_place) == 2 * len(jax.tree.leaves(args[0]))
    assert peaks[()] >= 2 * param_bytes
    assert peaks[(0, 1)] < peaks[()] - 1.5 * param_bytes, (peaks, param_bytes)
    # Numerics with the updates moved up: the donated step on the IPU against XLA:CPU's.
    cpu = jax.devices("cpu")[0]
    want = jax.jit(step, donate_argnums=(0, 1))(*jax.device_put(args, cpu))
    got = jax.jit(step, donate_argnums=(0, 1))(*jax.device_put(args, ipu))
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4, atol=1e-5)
