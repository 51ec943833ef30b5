"""A 4-layer residual MLP trained through jax_ipu.pipeline.gpipe, and the
same layers run one after the other: run by test_pipeline.py on IPUs and
on XLA:CPU devices (the helper is plain JAX)."""
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jax_ipu import pipeline

D, BATCH = 32, 16


def layer(params, h):
    w, b = params
    return h + jnp.tanh(h @ w + b)


def params(stages: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return ((rng.standard_normal((stages, D, D)) * 0.3).astype(np.float32),
            (rng.standard_normal((stages, D)) * 0.1).astype(np.float32))


def data(seed: int = 1):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((BATCH, D)).astype(np.float32), rng.standard_normal((BATCH, D)).astype(np.float32)


def sequential_loss(stacked, x, y):
    h = x
    for k in range(stacked[0].shape[0]):
        h = layer(jax.tree.map(lambda p, k=k: p[k], stacked), h)
    return jnp.mean((h - y) ** 2)


def sequential(stacked, x, y):
    """Loss and gradients on XLA:CPU, one device, no pipeline."""
    f = jax.jit(jax.value_and_grad(sequential_loss))
    cpu = jax.devices("cpu")[0]
    return jax.tree.map(np.asarray, f(*jax.device_put((stacked, x, y), cpu)))


def pipelined(devices, stacked, x, y, count: int, remat: bool = False):
    """Loss and gradients through gpipe over `devices` (one stage each),
    gradients accumulated over `count` micro-batches."""
    mesh = Mesh(np.array(devices), ("stage",))

    def loss(stacked, x, y):
        out = pipeline.gpipe(layer, stacked, pipeline.microbatches(x, count), mesh=mesh, remat=remat)
        return jnp.mean((out - pipeline.microbatches(y, count)) ** 2)
    stacked = jax.device_put(stacked, NamedSharding(mesh, P("stage")))
    x, y = jax.device_put((x, y), NamedSharding(mesh, P()))
    return jax.tree.map(np.asarray, jax.jit(jax.value_and_grad(loss))(stacked, x, y))


def close(got, want, rtol=2e-5, atol=2e-6):
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)


def one_f_one_b(devices, stacked, x, y, count: int):
    """Loss and gradients through the 1F1B schedule over `devices`."""
    mesh = Mesh(np.array(devices), ("stage",))

    def step(stacked, x, y):
        return pipeline.one_f_one_b(layer, lambda out, t: jnp.mean((out - t) ** 2), stacked,
                                    pipeline.microbatches(x, count), pipeline.microbatches(y, count), mesh=mesh)
    stacked = jax.device_put(stacked, NamedSharding(mesh, P("stage")))
    x, y = jax.device_put((x, y), NamedSharding(mesh, P()))
    return jax.tree.map(np.asarray, jax.jit(step)(stacked, x, y))
