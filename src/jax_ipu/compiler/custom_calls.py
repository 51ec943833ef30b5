"""custom_call targets, one rule each. Targets not listed here go to the
linear-algebra rules (JAX's generic Qr / Householder calls, jax_ipu.lu...)."""
from __future__ import annotations

from jax_ipu import ir
from jax_ipu.callbacks import TARGET as HOST_CALLBACK
from jax_ipu.compiler import host, linalg
from jax_ipu.compiler.builder import Builder

TARGETS = {HOST_CALLBACK: host.host_callback}


def custom_call(b: Builder, op: ir.Op) -> None:
    TARGETS.get(str(op.attrs.get("call_target_name")), linalg.custom_call)(b, op)


RULES = {"custom_call": custom_call}
