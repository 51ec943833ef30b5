"""Tokens order side effects; the IPU's program order already does. This
pass turns every !stablehlo.token into an empty bool tensor (what JAX
passes for a runtime token), and after_all / create_token into an empty
constant, so the rest of the compiler meets no special type."""
from __future__ import annotations

import numpy as np

from jax_ipu import ir

EMPTY = ir.TensorType((0,), np.dtype(np.bool_))
_MAKES_TOKEN = {"after_all", "create_token"}


def _retype(values) -> None:
    for v in values:
        if isinstance(v.type, ir.TokenType):
            v.type = EMPTY


def _block(block: ir.Block) -> None:
    _retype(block.args)
    for i, op in enumerate(block.ops):
        _retype(op.results)
        if op.name in _MAKES_TOKEN:
            block.ops[i] = ir.Op("constant", [], op.results, {"value": np.zeros((0,), np.bool_)}, loc=op.loc)
        for region in op.regions:
            _block(region)


def remove_tokens(module: ir.Module) -> None:
    for function in module.functions.values():
        _block(function.body)
