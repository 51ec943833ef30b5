"""Sharded programs that once gave wrong answers or were refused on several
IPUs, each run on 8 IPUs and on 8 XLA:CPU devices with the same mesh, and
compared: values, and the shardings of the results. Run as a script by
test_sharded_programs_match_xla_cpu.py (it needs 8 devices of each platform, which
only a fresh process can have): prints one JSON line per case.

Each case is fn(devices) -> (results, expect) where `devices` are the
platform's first 8 devices; `expect` optionally maps a result's index to
the sharding spec it must have."""
from __future__ import annotations

import json
import os
import sys
import traceback

os.environ.setdefault("JAX_IPU_DEVICE_COUNT", "8")
os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import AxisType, Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P

CASES = {}


def case(fn):
    CASES[fn.__name__] = fn
    return fn


def mesh_of(devices, shape, names, explicit=False):
    kinds = {"axis_types": (AxisType.Explicit,) * len(shape)} if explicit else {}
    return Mesh(np.array(devices[:int(np.prod(shape))]).reshape(shape), names, **kinds)


def put(x, mesh, spec):
    return jax.device_put(np.asarray(x), NamedSharding(mesh, spec))


def normal(seed, *shape):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@case
def matmul_output_split_along_another_axis(devices):
    """x split (None, x, y) @ y split (y,), the product asked split over x
    along its first dimension: the result of the contraction is split over
    x along its second, and must be gathered before it is split anew."""
    mesh = mesh_of(devices, (2, 2), ("x", "y"))
    f = jax.jit(lambda a, b: a @ b, out_shardings=NamedSharding(mesh, P("x")))
    out = f(put(normal(0, 8, 6, 8), mesh, P(None, "x", "y")), put(normal(1, 8, 2), mesh, P("y")))
    return [out], {0: P("x")}


@case
def matmul_with_one_axis_split_on_both_dimensions_of_an_operand(devices):
    """Both operands split over (x, y) along their first dimension: the
    contraction may not use the axes that already split the lhs's rows."""
    mesh = mesh_of(devices, (4, 2), ("x", "y"))
    s = NamedSharding(mesh, P(("x", "y")))
    x = np.arange(64, dtype=np.int32).reshape(8, 8)
    f = jax.jit(lambda a, b: a @ b, in_shardings=(s, s), out_shardings=s)
    return [f(x, x)], {0: P(("x", "y"))}


@case
def matmul_resharded_between_two_dimensional_layouts(devices):
    mesh = mesh_of(devices, (2, 4), ("x", "y"))
    f = jax.jit(lambda a, b: jnp.tanh(a @ b) @ b.T, out_shardings=NamedSharding(mesh, P("y", "x")))
    return [f(put(normal(2, 16, 8), mesh, P("y", "x")), put(normal(3, 8, 16), mesh, P("x", "y")))], {0: P("y", "x")}


@case
def constraint_moves_an_axis_between_dimensions(devices):
    mesh = mesh_of(devices, (2, 4), ("x", "y"))

    def f(a):
        b = lax.with_sharding_constraint(jnp.sin(a), NamedSharding(mesh, P("y", "x")))
        c = lax.with_sharding_constraint(b * 2, NamedSharding(mesh, P(("x", "y"), None)))
        return c.T + 1, jnp.sum(c, axis=0)
    return list(jax.jit(f)(put(normal(4, 16, 8), mesh, P("x", "y")))), {}


@case
def unreduced_sum_carried_into_a_shard_map(devices):
    """An einsum whose partial sums are kept (unreduced) and summed once, by
    the psum of the shard_map that takes them (explicit axes)."""
    mesh = mesh_of(devices, (2,), ("x",), explicit=True)
    x, y = np.arange(8.0, dtype=np.float32).reshape(2, 4), np.arange(24.0, dtype=np.float32).reshape(4, 6)

    @jax.shard_map(in_specs=P(unreduced={"x"}), out_specs=P())
    def total(v):
        return lax.psum(v, "x")

    @jax.jit
    def f(a, b):
        return total(jnp.einsum("ab,bc->ac", a, b, out_sharding=P(unreduced={"x"}))).sum()

    with jax.set_mesh(mesh):
        a, b = put(x, mesh, P(None, "x")), put(y, mesh, P("x", None))
        out = f(a, b)
        grads = jax.jit(jax.grad(f, argnums=(0, 1)))(a, b)
    return [out, *grads], {0: P(), 1: P(None, "x"), 2: P("x", None)}


@case
def unreduced_result_of_a_jit(devices):
    mesh = mesh_of(devices, (2, 2), ("x", "y"), explicit=True)
    with jax.set_mesh(mesh):
        a, b = put(normal(5, 4, 8), mesh, P(None, "y")), put(normal(6, 8, 4), mesh, P("y", "x"))
        f = jax.jit(lambda a, b: jnp.einsum("ab,bc->ac", a, b, out_sharding=P(None, "x", unreduced={"y"})))
        out = f(a, b)
        total = jax.jit(lambda o: jax.sharding.reshard(o, P(None, "x")))(out)
    return [total], {0: P(None, "x")}


@case
def shard_map_without_replication_checks_and_its_gradient(devices):
    mesh = mesh_of(devices, (4,), ("heads",))

    def f(q, k, v):
        body = jax.shard_map(lambda q, k, v: q * k[None, :] + v[None, :], mesh=mesh, check_vma=False,
                             in_specs=(P("heads", None), P(None), P(None)), out_specs=P("heads", None))
        return body(q, k, v).sum()
    q = put(np.arange(32.0, dtype=np.float32).reshape(4, 8), mesh, P("heads", None))
    k, v = put(np.arange(8.0, dtype=np.float32), mesh, P(None)), put(np.arange(8.0, dtype=np.float32) / 3, mesh, P())
    return [jax.jit(f)(q, k, v), *jax.jit(jax.grad(f, argnums=(0, 1, 2)))(q, k, v)], {}


@case
def all_gather_to_reduced_and_its_gradient(devices):
    mesh = mesh_of(devices, (2, 2), ("data", "seq"), explicit=True)

    @jax.shard_map(in_specs=P("seq", None), out_specs=P(None, None, reduced={"seq"}))
    def gather(a):
        return lax.all_gather(a, axis_name="seq", tiled=True, to="reduced")

    @jax.jit
    def f(x, y):
        return jnp.einsum("td,df->tf", x, gather(y)).sum()
    with jax.set_mesh(mesh):
        x, y = put(np.arange(8.0, dtype=np.float32).reshape(4, 2), mesh, P("seq", None)), \
            put(np.arange(12.0, dtype=np.float32).reshape(2, 6), mesh, P("seq", None))
        return [f(x, y), *jax.jit(jax.grad(f, argnums=(0, 1)))(x, y)], {0: P(), 1: P("seq", None), 2: P("seq", None)}


@case
def shard_map_over_some_axes(devices):
    """Manual over x; y left to the partitioner inside the body, which
    splits its einsum and its sum."""
    mesh = mesh_of(devices, (2, 4), ("x", "y"))

    def body(a, w):
        h = jnp.tanh(jnp.einsum("bd,df->bf", a, w))
        return lax.psum(jnp.sum(h, axis=0, keepdims=True), "x") + lax.axis_index("x").astype(jnp.float32)
    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("x"), P()), out_specs=P("x"), axis_names={"x"}))
    a, w = put(normal(7, 8, 16), mesh, P("x", "y")), put(normal(8, 16, 8), mesh, P(None, "y"))
    out = f(a, w)
    grad = jax.jit(jax.grad(lambda a, w: jnp.sum(f(a, w) ** 2), argnums=(0, 1)))(a, w)
    return [out, *grad], {}


@case
def nested_shard_maps(devices):
    mesh = mesh_of(devices, (2, 2, 2), ("x", "y", "z"))

    def inner(b):
        return lax.psum(b * 2, "y") + lax.axis_index("y").astype(jnp.float32)

    def outer(a):
        c = jax.shard_map(inner, in_specs=P(None, "y"), out_specs=P(None, "y"), axis_names={"y"})(a)
        return lax.psum(c, "x")
    f = jax.jit(jax.shard_map(outer, in_specs=P("x"), out_specs=P(), axis_names={"x"}))
    with jax.set_mesh(mesh):
        return [f(put(normal(9, 8, 8), mesh, P("x", "z")))], {}


@case
def device_put_between_meshes(devices):
    """Two meshes over the same devices, of different shapes and orders."""
    a = mesh_of(devices, (2, 4), ("x", "y"))
    b = Mesh(np.array(devices[:8])[::-1], ("i",))
    moved = jax.device_put(put(normal(10, 8, 16), a, P("x", "y")), NamedSharding(b, P(None, "i")))
    back = jax.device_put(jax.jit(lambda v: jnp.cos(v) * 2)(moved), NamedSharding(a, P("y", "x")))
    return [moved, back], {0: P(None, "i"), 1: P("y", "x")}


@case
def loop_over_split_weights(devices):
    mesh = mesh_of(devices, (2, 4), ("data", "model"))

    def step(w, x):
        def body(i, w):
            g = jax.grad(lambda w: jnp.mean(jnp.tanh(x @ w) ** 2))(w)
            return w - 0.1 * g
        return lax.fori_loop(0, 3, body, w)
    f = jax.jit(step, out_shardings=NamedSharding(mesh, P(None, "model")))
    return [f(put(normal(11, 16, 8), mesh, P(None, "model")), put(normal(12, 8, 16), mesh, P("data")))], \
        {0: P(None, "model")}


@case
def offload_of_a_split_value(devices):
    """Moving a split value between memory kinds keeps its split."""
    mesh = mesh_of(devices, (4,), ("m",))
    host = NamedSharding(mesh, P("m"), memory_kind="pinned_host")
    device = NamedSharding(mesh, P("m"), memory_kind="device")

    @jax.jit
    def update(s):
        s = jax.device_put(s, device) * 2 + 1
        return jax.device_put(s, host)
    x = jax.device_put(normal(13, 8, 4), host)
    out = update(x)
    assert out.sharding.memory_kind == "pinned_host", out.sharding
    return [out], {0: P("m")}


@case
def partial_sums_offloaded_whole(devices):
    """A sum over split axes stored whole in streaming memory: the partial
    sums are added up on the tiles before the move (streaming memory adds
    nothing)."""
    mesh = mesh_of(devices, (2, 2), ("x", "y"))
    host = NamedSharding(mesh, P(), memory_kind="pinned_host")
    out = jax.jit(lambda a: jnp.sum(a * 2, axis=0), out_shardings=host)(put(normal(16, 8, 4), mesh, P("x", "y")))
    assert out.sharding.memory_kind == "pinned_host", out.sharding
    return [out], {0: P()}


@case
def whole_value_stored_split(devices):
    """A value every IPU computes whole, stored split in streaming memory:
    each IPU takes its block on the tiles, then stores it."""
    mesh = mesh_of(devices, (4,), ("d",))
    host = NamedSharding(mesh, P("d"), memory_kind="pinned_host")
    both = jax.jit(lambda: (jax.random.normal(jax.random.key(3), (16, 4)),) * 2,
                   out_shardings=(NamedSharding(mesh, P("d")), host))()
    assert both[1].sharding.memory_kind == "pinned_host", both[1].sharding
    return list(both), {0: P("d"), 1: P("d")}


@case
def reversed_split_dimension(devices):
    """A split dimension reversed keeps its split: blocks swap places."""
    mesh = mesh_of(devices, (2, 2, 2), ("x", "y", "z"))
    a = put(np.arange(64.0, dtype=np.float32).reshape(8, 4, 2), mesh, P("x", "y", "z"))
    return [a[::-1], jax.jit(lambda v: jnp.flip(v, axis=(0, 1)) * 2)(a)], {0: P("x", "y", "z"), 1: P("x", "y", "z")}


@case
def values_split_alike(devices):
    """shard_alike: both values come out split as the more split one."""
    from jax.experimental.shard_alike import shard_alike
    mesh = mesh_of(devices, (2, 2), ("x", "y"))
    f = jax.jit(lambda a: shard_alike(a * 2, jnp.ones_like(a) + jnp.arange(8.0)[None, :]))
    return list(f(put(normal(14, 4, 8), mesh, P("x", "y")))), {0: P("x", "y"), 1: P("x", "y")}


@case
def sharding_inspected_inside_jit(devices):
    """jax.debug.inspect_array_sharding in a jitted program is told the
    sharding the partitioner chose."""
    mesh = mesh_of(devices, (4,), ("x",))
    seen = []

    def f(a):
        b = jnp.sin(a)
        jax.debug.inspect_array_sharding(b, callback=lambda s: seen.append(s.spec))
        return b * 2
    out = jax.jit(f)(put(normal(15, 8, 4), mesh, P("x")))
    assert seen == [P("x")], seen
    return [out], {0: P("x")}


def run(name: str, platform: str):
    results, expect = CASES[name](jax.devices(platform)[:8])
    return [np.asarray(r) for r in results], expect, [getattr(r.sharding, "spec", None) for r in results]


def main() -> None:
    names = sys.argv[1:] or list(CASES)
    for name in names:
        try:
            want, expect, _ = run(name, "cpu")
            got, _, specs = run(name, "ipu")
            problems = []
            for i, (g, w) in enumerate(zip(got, want, strict=False)):
                if g.shape != w.shape or g.dtype != w.dtype:
                    problems.append(f"result {i}: {g.dtype}{g.shape}, XLA:CPU {w.dtype}{w.shape}")
                elif not np.allclose(g, w, rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(w).max(initial=0)))):
                    problems.append(f"result {i}: max error {float(np.abs(g - w).max())}")
            for i, spec in expect.items():
                if specs[i] != spec:
                    problems.append(f"result {i} is split as {specs[i]}, not {spec}")
            print(json.dumps({"case": name, "problems": problems}), flush=True)
        except Exception:   # noqa: BLE001 (reported as the case's problem)
            print(json.dumps({"case": name, "problems": [traceback.format_exc()[-2500:]]}), flush=True)


if __name__ == "__main__":
    main()
