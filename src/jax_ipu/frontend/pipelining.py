"""Pipelined model parallelism in plain JAX: consecutive stages of a model
on consecutive devices of a mesh axis, micro-batches flowing through them
(GPipe: fill, steady state, drain), written with `jax.shard_map` and
`lax.ppermute` as JAX users write pipelines. Nothing here is IPU-specific:
the same code runs on CPU devices (XLA_FLAGS=--xla_force_host_platform_device_count=4)
and on any backend; on IPUs each ppermute is an IPU-Link transfer.

    stages = stack_stages([layer_params(k) for k in range(4)])   # leading axis: stage
    def loss(stages, x, y):
        out = gpipe(layer, stages, microbatches(x, 8), mesh=mesh, axis="stage")
        return jnp.mean((out - microbatches(y, 8)) ** 2)
    grads = jax.grad(loss)(stages, x, y)     # accumulated over the 8 micro-batches

Every stage runs `stage_fn(params, activation) -> activation` of one shape
(embeddings and heads go before and after the pipeline). The backward pass
is JAX's transpose of the forward loop: the drain runs backwards, the
ppermutes reverse, and each stage's gradient is accumulated over the
micro-batches in the loop's carry (gradient accumulation). GPipe keeps
every micro-batch's stage inputs for the backward pass; `remat=True`
recomputes the inside of each stage instead (jax.checkpoint), so a stage
holds one micro-batch's intermediate activations at a time.

`one_f_one_b` is the schedule that bounds what a stage keeps (PipeDream's
1F1B, with a flush): it returns the loss and the gradients itself, each
stage running at every tick the forward pass of one micro-batch and the
backward pass of an earlier one (recomputing that stage's inside from its
stashed input), so stage k keeps the inputs of at most 2(S - 1 - k) + 1
micro-batches in flight, whatever their number M, where GPipe keeps M.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

__all__ = ["gpipe", "one_f_one_b", "microbatches", "stack_stages", "bubble_fraction", "ticks",
           "ticks_1f1b", "stash_slots"]


def microbatches(x, count: int):
    """[B, ...] -> [count, B // count, ...] (each leaf of a pytree)."""
    def split(a):
        if a.shape[0] % count:
            raise ValueError(f"a batch of {a.shape[0]} does not split into {count} micro-batches; "
                             "choose a count that divides the batch")
        return a.reshape(count, a.shape[0] // count, *a.shape[1:])
    return jax.tree.map(split, x)


def stack_stages(per_stage: list):
    """A list of per-stage parameter pytrees (alike in structure and shape)
    -> one pytree whose leaves have a leading stage axis."""
    return jax.tree.map(lambda *leaves: jnp.stack(leaves), *per_stage)


def ticks(stages: int, count: int) -> int:
    """Steps of a GPipe forward pass: every micro-batch enters, the last
    one leaves after passing all stages."""
    return count + stages - 1


def bubble_fraction(stages: int, count: int) -> float:
    """The share of each stage's time spent idle in fill and drain:
    (S - 1) / (M + S - 1) for S stages and M micro-batches."""
    return (stages - 1) / ticks(stages, count)


def _check_stage_params(stage_params, stages: int, axis: str) -> None:
    for leaf in jax.tree.leaves(stage_params):
        if leaf.shape[:1] != (stages,):
            raise ValueError(f"stage parameters need a leading axis of {stages} (mesh axis {axis!r}); "
                             f"one leaf has shape {leaf.shape}: use stack_stages")


def gpipe(stage_fn, stage_params, inputs, *, mesh, axis: str = "stage", remat: bool = False):
    """Runs `inputs` ([M, micro-batch, ...], see microbatches) through the
    stages; stage k (parameters stage_params[k], a leading axis of the size
    of mesh axis `axis`) runs on the k-th device along `axis`. Returns the
    last stage's outputs for every micro-batch, [M, micro-batch, ...],
    replicated on the mesh. Differentiable; call it inside jax.jit."""
    stages = mesh.shape[axis]
    count = inputs.shape[0]
    _check_stage_params(stage_params, stages, axis)
    others = [a for a in mesh.axis_names if a != axis and mesh.shape[a] > 1]
    if others:
        raise ValueError(f"gpipe maps over mesh axis {axis!r} only; mesh axes {others} have more than one "
                         "device: make a mesh of the pipeline's devices")
    fn = jax.checkpoint(stage_fn) if remat else stage_fn
    forward = [(k, k + 1) for k in range(stages - 1)]     # stage k sends to stage k + 1

    def per_stage(params, xs):
        params = jax.tree.map(lambda p: p[0], params)
        k = lax.axis_index(axis)
        first, last = k == 0, k == stages - 1

        def tick(carry, t):
            received, outs = carry
            fresh = lax.dynamic_index_in_dim(xs, jnp.minimum(t, count - 1), keepdims=False)
            y = fn(params, jnp.where(first, fresh, received))
            if y.shape != received.shape or y.dtype != received.dtype:
                raise ValueError(f"a pipeline stage must return its input's shape and type: got "
                                 f"{y.dtype}{list(y.shape)} from {received.dtype}{list(received.shape)}")
            done = t - (stages - 1)             # the micro-batch leaving the last stage now
            slot = jnp.clip(done, 0, count - 1)
            keep = last & (done >= 0)
            outs = lax.dynamic_update_index_in_dim(
                outs, jnp.where(keep, y, lax.dynamic_index_in_dim(outs, slot, keepdims=False)), slot, 0)
            return (lax.ppermute(y, axis, forward), outs), None

        start = (jnp.zeros_like(xs[0]), jnp.zeros_like(xs))
        (_, outs), _ = lax.scan(tick, start, jnp.arange(ticks(stages, count)))
        # Only the last stage holds outputs: the sum hands them to every stage.
        return lax.psum(outs, axis)

    spec = jax.tree.map(lambda _: P(axis), stage_params)
    return jax.shard_map(per_stage, mesh=mesh, in_specs=(spec, P()), out_specs=P(),
                         check_vma=False)(stage_params, inputs)


def ticks_1f1b(stages: int, count: int) -> int:
    """Steps of one_f_one_b: micro-batch i's forward pass is at stage k at
    tick i + k, its backward pass at tick i + 2(S - 1) - k."""
    return count + 2 * (stages - 1)


def stash_slots(stages: int, count: int) -> int:
    """Stage inputs a one_f_one_b stage keeps (stage 0 keeps the most)."""
    return min(count, 2 * stages - 1)


def one_f_one_b(stage_fn, loss_fn, stage_params, inputs, targets, *, mesh, axis: str = "stage"):
    """The 1F1B schedule: (mean over the micro-batches of
    loss_fn(last stage's output, target), its gradient with respect to
    stage_params), for `inputs` and `targets` split into micro-batches
    ([M, micro-batch, ...], see microbatches). Stage k (stage_params[k])
    runs on the k-th device along mesh axis `axis`; activations go forward
    and their gradients back by lax.ppermute. The gradients come back
    split over `axis` like stage_params. Call it inside jax.jit (not under
    jax.grad: it is its own backward pass)."""
    stages = mesh.shape[axis]
    count = inputs.shape[0]
    _check_stage_params(stage_params, stages, axis)
    if targets.shape[0] != count:
        raise ValueError(f"{count} micro-batches of inputs but {targets.shape[0]} of targets")
    others = [a for a in mesh.axis_names if a != axis and mesh.shape[a] > 1]
    if others:
        raise ValueError(f"one_f_one_b maps over mesh axis {axis!r} only; mesh axes {others} have more than "
                         "one device: make a mesh of the pipeline's devices")
    forward = [(k, k + 1) for k in range(stages - 1)]
    backward = [(k + 1, k) for k in range(stages - 1)]
    slots = stash_slots(stages, count)

    def per_stage(params, xs, ts):
        params = jax.tree.map(lambda p: p[0], params)
        k = lax.axis_index(axis)
        first, last = k == 0, k == stages - 1

        def tick(carry, t):
            received, grad_in, stash, grads, loss = carry
            # Forward: micro-batch f enters this stage.
            f = t - k
            f_ok = (f >= 0) & (f < count)
            fc = jnp.clip(f, 0, count - 1)
            x = jnp.where(first, lax.dynamic_index_in_dim(xs, fc, keepdims=False), received)
            y = stage_fn(params, x)
            if y.shape != x.shape or y.dtype != x.dtype:
                raise ValueError(f"a pipeline stage must return its input's shape and type: got "
                                 f"{y.dtype}{list(y.shape)} from {x.dtype}{list(x.shape)}")
            kept = lax.dynamic_index_in_dim(stash, fc % slots, keepdims=False)
            stash = lax.dynamic_update_index_in_dim(stash, jnp.where(f_ok, x, kept), fc % slots, 0)
            # The last stage's loss, and its gradient, for micro-batch f.
            micro_loss, dy_last = jax.value_and_grad(loss_fn)(y, lax.dynamic_index_in_dim(ts, fc, keepdims=False))
            loss = loss + jnp.where(last & f_ok, micro_loss, 0.0)
            # Backward: micro-batch b leaves this stage backwards (at the
            # last stage, b is f: its backward pass follows its forward).
            b = t - (2 * (stages - 1) - k)
            b_ok = (b >= 0) & (b < count)
            xb = lax.dynamic_index_in_dim(stash, jnp.clip(b, 0, count - 1) % slots, keepdims=False)
            dy = jnp.where(last, dy_last, grad_in)
            _, vjp = jax.vjp(stage_fn, params, xb)
            dparams, dx = vjp(dy)
            grads = jax.tree.map(lambda a, g: a + jnp.where(b_ok, g, jnp.zeros_like(g)), grads, dparams)
            dx = jnp.where(b_ok, dx, jnp.zeros_like(dx))
            return (lax.ppermute(y, axis, forward), lax.ppermute(dx, axis, backward), stash, grads, loss), None

        zero = jnp.zeros_like(xs[0])
        start = (zero, zero, jnp.zeros((slots, *xs.shape[1:]), xs.dtype),
                 jax.tree.map(jnp.zeros_like, params), jnp.zeros((), jnp.float32))
        (_, _, _, grads, loss), _ = lax.scan(tick, start, jnp.arange(ticks_1f1b(stages, count)))
        scale = 1.0 / count
        grads = jax.tree.map(lambda g: (g * scale)[None], grads)
        return lax.psum(loss, axis) * scale, grads

    spec = jax.tree.map(lambda _: P(axis), stage_params)
    return jax.shard_map(per_stage, mesh=mesh, in_specs=(spec, P(), P()), out_specs=(P(), spec),
                         check_vma=False)(stage_params, inputs, targets)
