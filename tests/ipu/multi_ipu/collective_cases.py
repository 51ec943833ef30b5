"""Programs over several devices, run in a subprocess by test_collectives.py
on one platform (PLATFORM: ipu or cpu) with N devices; saves every result
to OUT (an .npz) under the case's name, or the error's text."""
import os
import traceback

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

PLATFORM, N, OUT = os.environ["PLATFORM"], int(os.environ["N"]), os.environ["OUT"]
devices = jax.devices(PLATFORM)[:N]
rng = np.random.default_rng(0)
x = rng.standard_normal((N, 8, 6)).astype(np.float32)
ints = rng.integers(-50, 50, size=(N, 12)).astype(np.int32)
ring = [(i, (i + 1) % N) for i in range(N)]
mesh = Mesh(np.array(devices), ("i",))

COLLECTIVES = {
    "psum": lambda a: jax.lax.psum(a, "i"),
    "pmean": lambda a: jax.lax.pmean(a, "i"),
    "pmax": lambda a: jax.lax.pmax(a, "i"),
    "pmin": lambda a: jax.lax.pmin(a, "i"),
    "all_gather": lambda a: jax.lax.all_gather(a, "i"),
    "all_gather_tiled": lambda a: jax.lax.all_gather(a, "i", axis=1, tiled=True),
    "all_to_all": lambda a: jax.lax.all_to_all(a, "i", 0, 0, tiled=True),
    "ppermute": lambda a: jax.lax.ppermute(a, "i", ring),
    "psum_scatter": lambda a: jax.lax.psum_scatter(a, "i", scatter_dimension=0, tiled=True),
    "axis_index": lambda a: a * jax.lax.axis_index("i").astype(a.dtype),
    "psum_in_loop": lambda a: jax.lax.fori_loop(0, 3, lambda k, c: c + jax.lax.psum(c, "i") * 0.5 + k, a),
    "ppermute_in_loop": lambda a: jax.lax.fori_loop(0, N, lambda k, c: jax.lax.ppermute(c, "i", ring) + 1.0, a),
}
INT_COLLECTIVES = {
    "psum_int": lambda a: jax.lax.psum(a, "i"),
    "pmax_int": lambda a: jax.lax.pmax(a, "i"),
}


def mlp_loss(params, xb, yb):
    h = jnp.tanh(xb @ params["w1"] + params["b1"])
    return jnp.mean((h @ params["w2"] - yb) ** 2)


params = {"w1": rng.standard_normal((6, 16)).astype(np.float32) * 0.3, "b1": np.zeros(16, np.float32),
          "w2": rng.standard_normal((16, 3)).astype(np.float32) * 0.3}
batch_x = rng.standard_normal((N * 8, 6)).astype(np.float32)
batch_y = rng.standard_normal((N * 8, 3)).astype(np.float32)


def train_step(p, xb, yb):
    loss, grads = jax.value_and_grad(mlp_loss)(p, xb, yb)
    grads = jax.lax.pmean(grads, "i")
    return jax.tree.map(lambda w, g: w - 0.1 * g, p, grads), jax.lax.pmean(loss, "i")


BATCH, REPLICATED = NamedSharding(mesh, P("i")), NamedSharding(mesh, P())


def cases():
    for name, fn in COLLECTIVES.items():
        yield "pmap_" + name, lambda fn=fn: jax.pmap(fn, axis_name="i", devices=devices)(x)
        yield "shard_map_" + name, lambda fn=fn: jax.jit(jax.shard_map(
            lambda a: fn(a[0])[None], mesh=mesh, in_specs=P("i"), out_specs=P("i")))(x)
    for name, fn in INT_COLLECTIVES.items():
        yield "pmap_" + name, lambda fn=fn: jax.pmap(fn, axis_name="i", devices=devices)(ints)
    yield "pmap_train_step", lambda: jax.pmap(train_step, axis_name="i", devices=devices)(
        jax.tree.map(lambda w: np.stack([w] * N), params), batch_x.reshape(N, 8, 6), batch_y.reshape(N, 8, 3))
    yield "shard_map_train_step", lambda: jax.jit(jax.shard_map(
        train_step, mesh=mesh, in_specs=(P(), P("i"), P("i")), out_specs=(P(), P())))(params, batch_x, batch_y)
    yield "shard_map_named_shardings", lambda: jax.jit(jax.shard_map(
        train_step, mesh=mesh, in_specs=(P(), P("i"), P("i")), out_specs=(P(), P())),
        in_shardings=(REPLICATED, BATCH, BATCH), out_shardings=REPLICATED)(params, batch_x, batch_y)
    full = jax.device_put((params, batch_x, batch_y), devices[0])
    yield "full_batch_step", lambda: jax.jit(lambda p, a, b: (
        jax.tree.map(lambda w, g: w - 0.1 * g, p, jax.grad(mlp_loss)(p, a, b)), mlp_loss(p, a, b)))(*full)
    # jit of sharded arrays: batch over the devices, replicated parameters.
    xs, ys = jax.device_put(batch_x, BATCH), jax.device_put(batch_y, BATCH)
    ps = jax.device_put(params, REPLICATED)
    yield "jit_sharded_forward", lambda: jax.jit(lambda p, a: jnp.tanh(a @ p["w1"] + p["b1"]) @ p["w2"])(ps, xs)
    yield "jit_sharded_loss", lambda: jax.jit(mlp_loss)(ps, xs, ys)
    yield "jit_sharded_grad", lambda: jax.jit(jax.grad(mlp_loss))(ps, xs, ys)
    yield "jit_sharded_train_step", lambda: jax.jit(
        lambda p, a, b: jax.tree.map(lambda w, g: w - 0.1 * g, p, jax.grad(mlp_loss)(p, a, b)))(ps, xs, ys)
    # Ops with no partitioning rule run on gathered operands.
    yield "jit_sharded_sort", lambda: jax.jit(lambda a: jnp.sort(a, axis=0))(xs)
    yield "jit_sharded_cumsum", lambda: jax.jit(lambda a: jnp.cumsum(a, axis=0) + 1.0)(xs)
    yield "jit_sharded_concatenate", lambda: jax.jit(lambda a: jnp.concatenate([a, 2 * a], axis=1).T @ a)(xs)
    yield "jit_sharded_out_shardings", lambda: jax.jit(
        lambda p, a: jnp.tanh(a @ p["w1"]), out_shardings=REPLICATED)(ps, xs)
    yield "jit_sharded_layouts", lambda: [str(o.sharding.spec) for o in jax.tree.leaves(
        jax.jit(lambda p, a, b: (jnp.tanh(a @ p["w1"]), mlp_loss(p, a, b)))(ps, xs, ys))]

    # Control flow in jit of sharded arrays: the loops' bounds and constants
    # (hoisted out of their bodies by JAX) read on every IPU.
    yield "jit_sharded_fori_loop", lambda: jax.jit(
        lambda a: jax.lax.fori_loop(0, 3, lambda i, c: c * 0.5 + i, a))(xs)
    yield "jit_replicated_fori_loop", lambda: jax.jit(
        lambda p: jax.lax.fori_loop(0, 3, lambda i, c: jax.tree.map(lambda w: w * 0.9 + 0.1, c), p))(ps)
    yield "jit_sharded_scan", lambda: jax.jit(lambda p, a: jax.lax.scan(
        lambda c, row: (c + jnp.tanh(row @ p["w1"]), c.sum()), jnp.zeros(16), a))(ps, xs)
    yield "jit_sharded_while", lambda: jax.jit(lambda a: jax.lax.while_loop(
        lambda c: c[1] < 4, lambda c: (c[0] * 1.5 + a.mean(), c[1] + 1), (a, 0)))(xs)
    yield "jit_sharded_cond", lambda: jax.jit(lambda a: jax.lax.cond(
        a.sum() > 0, lambda: a * 2.0, lambda: a - 3.0))(xs)
    # Host callbacks in jit of sharded arrays run once, on the whole value.
    calls = []

    def count(v):
        calls.append(float(v))
        return np.float32(len(calls))
    from jax.experimental import io_callback

    def once():
        out = jax.jit(lambda a: a * io_callback(count, jax.ShapeDtypeStruct((), np.float32), a.sum()))(xs)
        return np.asarray(out), np.array(len(calls), np.int32)      # (the count once the run is done)
    yield "jit_sharded_io_callback", once
    ordered = []

    def log(v):
        ordered.append(float(v))
        return np.float32(len(ordered))

    def in_order():
        out = jax.jit(lambda a: jax.lax.fori_loop(0, 3, lambda i, c: c + io_callback(
            log, jax.ShapeDtypeStruct((), np.float32), c.sum(), ordered=True), a))(xs)
        return np.asarray(out), np.array(ordered, np.float32)
    yield "jit_sharded_ordered_io_callback", in_order
    seen = []

    def only_effect():
        jax.jit(lambda a: jax.debug.callback(lambda v: seen.append(float(v)), a.sum()))(xs)
        jax.effects_barrier()
        return np.array(seen, np.float32)
    yield "jit_sharded_debug_callback_only", only_effect
    # jax_ipu's feeds (portable: io_callback on cpu) on every IPU or once.
    import functools

    import jax_ipu

    def pmap_infeed():
        q = jax_ipu.InfeedQueue(jax.ShapeDtypeStruct((), np.float32), timeout=30)
        for k in range(N):
            q.put(np.float32(k))
        return np.sort(np.asarray(jax.pmap(lambda v: v + jax_ipu.infeed(q), devices=devices)(np.zeros(N, np.float32))))
    yield "pmap_infeed", pmap_infeed

    def shard_map_infeed():
        q = jax_ipu.InfeedQueue(jax.ShapeDtypeStruct((1,), np.float32), timeout=30)
        for k in range(N):
            q.put(np.float32([k]))
        g = jax.jit(functools.partial(jax.shard_map, mesh=mesh, in_specs=P("i"), out_specs=P("i"))(
            lambda v: v + jax_ipu.infeed(q)))
        return np.sort(np.asarray(g(jax.device_put(np.zeros(N, np.float32), BATCH))))
    yield "shard_map_infeed", shard_map_infeed

    def jit_sharded_infeed_loop():
        q = jax_ipu.InfeedQueue(jax.ShapeDtypeStruct((6,), np.float32), timeout=30)
        for k in range(3):
            q.put(np.full(6, k + 1, np.float32))
        return jax.jit(lambda a: jax.lax.fori_loop(0, 3, lambda i, c: c + jax_ipu.infeed(q), a))(xs)
    yield "jit_sharded_infeed_loop", jit_sharded_infeed_loop

    # A dimension moved from one mesh axis to another (gathered, split anew).
    grid = Mesh(np.array(devices).reshape(N // 2, 2), ("a", "b"))
    xa = jax.device_put(x, NamedSharding(grid, P("a")))
    yb = jax.device_put(np.swapaxes(x, 1, 2).copy(), NamedSharding(grid, P("b")))
    yield "jit_resharded_between_axes", lambda: jax.jit(lambda p, q: jnp.einsum("bij,bjk->bik", p, q))(xa, yb)
    yield "jit_out_sharding_other_axis", lambda: jax.jit(
        lambda p: p * 2.0, out_shardings=NamedSharding(grid, P("b")))(xa)


results = {}
for name, run in cases():
    try:
        out = jax.tree.leaves(run())
        for i, leaf in enumerate(out):
            results[f"{name}/{i}"] = np.asarray(leaf)
    except Exception as exc:  # noqa: BLE001  (reported by the test that reads it)
        results[f"{name}/error"] = np.array(f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-600:]}")
np.savez(OUT, **results)
