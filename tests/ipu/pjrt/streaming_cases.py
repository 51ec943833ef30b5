"""An optimizer update whose state lives in streaming memory (JAX memory
kind "pinned_host"): run by test_streaming_memory.py here and, on four
IPUs, in a subprocess."""
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

HOST = jax.memory.Space.Host
DEVICE = jax.memory.Space.Device


def adam_moment(w, g, m):
    """An optimizer update whose state lives in streaming memory."""
    m = jax.device_put(m, DEVICE)
    m = 0.9 * m + 0.1 * g
    return w - 0.01 * m, jax.device_put(m, HOST)


def shardings(devices, kind):
    mesh = Mesh(np.array(devices), ("i",))
    return NamedSharding(mesh, P("i")), NamedSharding(mesh, P("i"), memory_kind=kind)
