"""The lowering rules: op name -> rule(builder, op), and custom_call target
-> rule. Each rule module registers its own with `register`, as JAX's
lowerings do; a second rule for one name is refused."""
from __future__ import annotations

from collections.abc import Callable

from jax_ipu import ir
from jax_ipu.errors import IpuUnimplementedError

RULES: dict[str, Callable] = {}
CUSTOM_CALLS: dict[str, Callable] = {}


def _add(table: dict, key: str, rule: Callable) -> None:
    if key in table:
        raise ValueError(f"two lowering rules for {key!r}: {table[key].__module__}.{table[key].__name__} "
                         f"and {rule.__module__}.{rule.__name__}")
    table[key] = rule


def register(*op_names: str):
    """Registers the decorated rule(b, op) for these op names."""
    def decorate(rule: Callable) -> Callable:
        for name in op_names:
            _add(RULES, name, rule)
        return rule
    return decorate


def register_custom_call(*targets: str):
    """Registers the decorated rule(b, op) for custom_calls to these
    targets (a target's options after ':' are the rule's to read)."""
    def decorate(rule: Callable) -> Callable:
        for target in targets:
            _add(CUSTOM_CALLS, target, rule)
        return rule
    return decorate


@register("custom_call")
def custom_call(b, op: ir.Op) -> None:
    target = str(op.attrs.get("call_target_name"))
    rule = CUSTOM_CALLS.get(target.partition(":")[0])
    if rule is None:
        raise IpuUnimplementedError.for_op(op, f"custom_call @{target} is not supported by jax-ipu yet",
                                           "File an issue, or avoid the op in this program")
    rule(b, op)
