"""What the reference executors share: reading a view (or an immediate)
from the engine's state as plain numpy (fast/views.py reads the same
values faster)."""
from __future__ import annotations

from collections.abc import Callable

from jax_ipu.graph.records import is_immediate
from jax_ipu.graph.views import View


def reader(source: View | object) -> Callable:
    """fn(state) -> the view's array (its ops applied to its tensor's), or
    the immediate `source` itself (held in vertex state)."""
    if not isinstance(source, View):
        if not is_immediate(source):
            raise TypeError(f"a kernel reads a view or an immediate, not {type(source).__name__}")
        return lambda state: source
    tid, shape = source.tensor.id, source.shape
    if source.is_whole_tensor:
        return lambda state: state[tid].reshape(shape)
    return lambda state: source.apply(lambda t: state[t.id])
