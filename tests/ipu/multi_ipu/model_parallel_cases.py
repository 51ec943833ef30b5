"""Models split over the IPUs of a mesh with NamedSharding in jit (tensor
parallelism as in Megatron, ZeRO-1): each case runs on the IPUs and on
XLA:CPU (one device, the same program), and says which arguments are split
so the per-IPU program can be checked for whole weights. Used by
test_model_parallel.py in-process (2 IPUs) and in a subprocess (4 IPUs):
`python model_parallel_cases.py` runs every case and prints OK or FAIL."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

B, S, D, H, V, HEADS = 2, 8, 64, 128, 64, 4
HEAD = D // HEADS


@dataclasses.dataclass
class Case:
    fn: object
    args: list
    specs: list          # PartitionSpec per argument over the mesh ("m": model axis, "d": data axis)
    out_specs: object = None
    mesh_axes: tuple = ("m",)
    split: tuple = ()    # indices of the weights that must never be whole on an IPU
    collectives: tuple = ()   # (kind, count) the per-IPU program must hold


def _mlp(x, w1, w2):
    return jnp.tanh(x @ w1) @ w2


def _attention(x, wq, wk, wv, wo):
    q, k, v = (jnp.einsum("bsd,dhk->bhsk", x, w) for w in (wq, wk, wv))
    s = jnp.einsum("bhsk,bhtk->bhst", q, k) / np.sqrt(HEAD).astype(np.float32)
    s = jnp.where(jnp.tril(jnp.ones((S, S), bool)), s, -1e9)
    o = jnp.einsum("bhst,bhtk->bhsk", jax.nn.softmax(s, axis=-1), v)
    return jnp.einsum("bhsk,hkd->bsd", o, wo)


def _lm_loss(table, h, labels):
    logp = jax.nn.log_softmax(h @ table.T, axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, labels[..., None], axis=-1))


def _zero1_step(w1, w2, m1, m2, v1, v2, x, y):
    """One Adam step: data-parallel gradients, optimizer state split over
    the data axis (each IPU updates its slice; the new weights are
    gathered, as ZeRO-1 / Graphcore's replicated tensor sharding do)."""
    grads = jax.grad(lambda w1, w2: jnp.mean((_mlp(x, w1, w2) - y) ** 2), argnums=(0, 1))(w1, w2)
    out = []
    for w, m, v, g in zip((w1, w2), (m1, m2), (v1, v2), grads, strict=True):
        m = 0.9 * m + 0.1 * g
        v = 0.999 * v + 0.001 * g * g
        out.append((w - 0.01 * m / (jnp.sqrt(v) + 1e-8), m, v))
    (w1, m1, v1), (w2, m2, v2) = out
    return w1, w2, m1, m2, v1, v2


def cases(n: int) -> dict[str, Case]:
    rng = np.random.default_rng(0)

    def normal(*shape, scale=0.2):
        return (rng.standard_normal(shape) * scale).astype(np.float32)
    x, xs = normal(B * n, D, scale=1), normal(B, S, D, scale=1)
    w1, w2 = normal(D, H * n), normal(H * n, D)
    heads = HEADS * n // 2
    wq, wk, wv, wo = normal(D, heads, HEAD), normal(D, heads, HEAD), normal(D, heads, HEAD), normal(heads, HEAD, D)
    table = normal(V * n, D, scale=1)
    ids = rng.integers(0, V * n, (B, S)).astype(np.int32)
    labels = rng.integers(0, V * n, (B, S)).astype(np.int32)
    col, row, by_head, out_by_head = P(None, "m"), P("m", None), P(None, "m", None), P("m", None, None)
    mlp_grad = jax.grad(lambda w1, w2, x: jnp.sum(_mlp(x, w1, w2) ** 2), argnums=(0, 1))
    attention_grad = jax.grad(lambda wq, wk, wv, wo, x: jnp.sum(_attention(x, wq, wk, wv, wo) ** 2),
                              argnums=(0, 1, 2, 3))
    tied = jax.grad(lambda t, ids, labels: _lm_loss(t, jnp.take(t, ids, axis=0), labels))
    # A later step's state (at the first, m / sqrt(v) of a tiny gradient is
    # decided by rounding).
    m = [normal(*w.shape, scale=0.01) for w in (w1, w2)]
    v = [np.abs(normal(*w.shape, scale=0.01)) + np.float32(1e-3) for w in (w1, w2)]
    zero1 = [w1, w2, *m, *v, x, normal(B * n, D)]
    state = P("d", None)
    return {
        "megatron_mlp": Case(_mlp, [x, w1, w2], [P(), col, row], split=(1, 2)),
        "megatron_mlp_grad": Case(mlp_grad, [w1, w2, x], [col, row, P()], (col, row), split=(0, 1)),
        "attention_by_heads": Case(_attention, [xs, wq, wk, wv, wo], [P(), by_head, by_head, by_head, out_by_head],
                                   split=(1, 2, 3, 4)),
        "attention_by_heads_grad": Case(attention_grad, [wq, wk, wv, wo, xs],
                                        [by_head, by_head, by_head, out_by_head, P()],
                                        (by_head, by_head, by_head, out_by_head), split=(0, 1, 2, 3)),
        "embedding_by_vocab": Case(lambda t, ids: jnp.take(t, ids, axis=0), [table, ids], [row, P()], split=(0,)),
        "lm_head_by_vocab_grad": Case(jax.value_and_grad(_lm_loss), [table, xs, labels], [row, P(), P()],
                                      (P(), row), split=(0,)),
        "tied_embedding_grad": Case(tied, [table, ids, labels], [row, P(), P()], row, split=(0,)),
        "zero1_adam": Case(_zero1_step, zero1, [P(), P()] + [state] * 4 + [P("d", None)] * 2,
                           (P(), P(), state, state, state, state), mesh_axes=("d",),
                           # Each IPU receives only its slice of each summed gradient (a
                           # reduce_scatter, as XLA's partitioner emits), and gathers the
                           # updated weights.
                           collectives=(("ReduceScatter", 2), ("AllReduce", 0), ("AllGather", 2))),
    }


def run(case: Case, devices, specs=None):
    mesh = Mesh(np.array(devices), case.mesh_axes)
    specs = specs or case.specs
    args = [jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(case.args, specs, strict=True)]
    kw = {}
    if case.out_specs is not None and specs is case.specs:
        kw["out_shardings"] = jax.tree.map(lambda s: NamedSharding(mesh, s), case.out_specs,
                                           is_leaf=lambda s: isinstance(s, P))
    f = jax.jit(case.fn, **kw)
    return jax.tree.map(np.asarray, f(*args)), f.lower(*args).compile()


def check(name: str, case: Case, ipus) -> dict:
    """Runs the case on the IPUs and on XLA:CPU; checks values, that each
    split weight reaches each IPU as its shard only and that no tensor of
    the per-IPU program is as large as a split weight (none was gathered).
    Returns figures for the caller to print."""
    from jax_ipu.graph import codelets_collectives as cc
    from jax_ipu.graph.programs import Execute, leaves
    from jax_ipu.pjrt import client
    got, compiled = run(case, ipus)
    want, _ = run(case, jax.devices("cpu")[:1], [P()] * len(case.args))
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        # Partial sums are added in another order than on one CPU device.
        np.testing.assert_allclose(g, w, rtol=1e-3, atol=2e-4 * max(1.0, float(np.abs(w).max())), err_msg=name)
    n = len(ipus)
    programs = [client.CURRENT.device(d.id).last_program for d in ipus]
    program = programs[0]
    assert all(p is program for p in programs), name
    for i, spec in enumerate(case.specs):
        if any(spec):
            assert int(np.prod(program.input_types[i].shape)) * n == case.args[i].size, (name, i)
    for i in case.split:
        biggest = max(t.size for t in program.tensors)
        assert biggest < case.args[i].size, (name, i, biggest)
    kinds = [type(leaf.compute_set.kernel).__name__ for leaf in leaves(program.body)
             if isinstance(leaf, Execute) and isinstance(leaf.compute_set.kernel, cc.COLLECTIVES)]
    if case.split:
        assert "AllGather" not in kinds, (name, kinds)
    for kind, count in case.collectives:
        assert kinds.count(kind) == count, (name, kinds)
    whole = sum(a.nbytes for a in case.args)
    stats = compiled.memory_analysis()
    # Each IPU holds its shards: the split arguments' bytes over n.
    local = sum(a.nbytes // n if any(s for s in spec) else a.nbytes for a, spec in zip(case.args, case.specs, strict=True))
    assert stats.argument_size_in_bytes == local, (name, stats.argument_size_in_bytes, local)
    assert local < whole
    return {"collectives": kinds, "argument_bytes_per_ipu": local, "argument_bytes_whole": whole,
            "peak_bytes_per_ipu": program.memory_stats()["peak"]}


if __name__ == "__main__":
    ipus = jax.devices("ipu")
    for name, case in cases(len(ipus)).items():
        try:
            print("OK", name, check(name, case, ipus), flush=True)
        except Exception as exc:                 # noqa: BLE001 - reported to the test
            print("FAIL", name, type(exc).__name__, str(exc)[:2000], flush=True)
