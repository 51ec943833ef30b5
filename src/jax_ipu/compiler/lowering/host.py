"""Host callbacks (jax.debug.print, pure_callback, io_callback, feeds): a
HostCall step streams the operands to the host, runs the function there,
and streams its results into new tensors, at the host-link rate."""
from __future__ import annotations

from jax_ipu import ir
from jax_ipu.compiler.builder import Builder
from jax_ipu.compiler.lowering.layout import name_of
from jax_ipu.compiler.lowering.registry import register_custom_call
from jax_ipu.graph.programs import HostCall
from jax_ipu.graph.views import View


def parse_config(config: str) -> tuple[int, int | None]:
    """A host callback's backend_config: "<id>", or "<id>@<partition>" when
    one partition calls it for all (see jax_ipu.frontend.callbacks)."""
    callback_id, _, partition = config.partition("@")
    return int(callback_id), int(partition) if partition else None


@register_custom_call(ir.HOST_CALLBACK_TARGET)
def host_callback(b: Builder, op: ir.Op) -> None:
    inputs = [b.view(v, name_of(op)) for v in op.operands]
    outputs = [b.tensor(f"{name_of(op)} result {i}", r.type.shape, r.type.dtype)
               for i, r in enumerate(op.results)]
    host_bytes = sum(v.size * v.dtype.itemsize for v in inputs) + sum(t.nbytes for t in outputs)
    callback_id, partition = parse_config(str(op.attrs["backend_config"]))
    b.steps.append(HostCall(callback_id, inputs, outputs, host_bytes=host_bytes, partition=partition,
                            name=name_of(op)))
    for result, t in zip(op.results, outputs, strict=True):
        b.values[result] = View(t)
