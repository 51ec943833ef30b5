"""Emulated types at the boundary of the planned products (issue 38).

The IPU has no bfloat16 or complex arithmetic (docs/semantics.md). Its
element-wise ops compute them in float32 (ops.py, ops_complex.py); the
products the compiler plans on tiles are rewritten here into float32 ones,
so that their planners, vertices and cost rules stay those of float32:

- a bfloat16 dot_general or convolution: its operands converted to
  float32 (exactly), the float32 product (float32 accumulation, as XLA:CPU
  upcasts bfloat16 products), the result rounded to bfloat16 once;
- a complex64 one: four real products of the parts, re = ar.br - ai.bi
  and im = ar.bi + ai.br (two when an operand is real), joined by
  stablehlo.complex;
- (an FFT is expanded before, into such ops: fft.py).

Every op made here carries the attribute EMULATES, naming what it
emulates, so that the compile log and the profile charge it to the
emulated op (compiler/passes/lower.py)."""
from __future__ import annotations

import itertools

import numpy as np

from jax_ipu import ir
from jax_ipu.targets import BFLOAT16, COMPLEX64

# The attribute of an op made by an expansion: (what it emulates, the
# number of the op it stands for), read by the lower pass to charge it.
EMULATES = "jax_ipu.emulates"
_sources = itertools.count()
_F32 = np.dtype(np.float32)
_PRODUCTS = ("dot_general", "convolution")


class Emitter:
    """Makes the ops replacing one op, at its source location, each tagged
    with what they emulate."""

    def __init__(self, op: ir.Op, what: str):
        self.loc, self.tag = op.loc, (what, next(_sources))
        self.ops: list[ir.Op] = []
        self._parts: dict = {}

    def __call__(self, name: str, operands, result, **attrs) -> ir.Value:
        """result: an ir.Value to define, or the ir.Type of a new one."""
        value = result if isinstance(result, ir.Value) else ir.Value(result)
        self.ops.append(ir.Op(name, list(operands), [value], {**attrs, EMULATES: self.tag}, [], self.loc))
        return value

    def constant(self, value: np.ndarray) -> ir.Value:
        value = np.asarray(value)
        return self("constant", [], ir.TensorType(value.shape, value.dtype), value=value)

    def convert(self, v: ir.Value, dtype) -> ir.Value:
        dtype = np.dtype(dtype)
        if v.type.dtype == dtype:
            return v
        return self("convert", [v], ir.TensorType(v.type.shape, dtype))

    def parts(self, v: ir.Value) -> tuple[ir.Value, ir.Value | None]:
        """(real part, imaginary part or None for a real value), in float32."""
        if v.type.dtype != COMPLEX64:
            return self.convert(v, _F32), None
        if v not in self._parts:
            t = ir.TensorType(v.type.shape, _F32)
            self._parts[v] = (self("real", [v], t), self("imag", [v], t))
        return self._parts[v]


def emulate_products(ops: list[ir.Op]) -> list[ir.Op]:
    """The ops with every bfloat16 or complex64 product rewritten (in
    nested regions too)."""
    return ir.rewrite(ops, _emulated_product)


def _emulated_product(op: ir.Op) -> list[ir.Op] | None:
    if op.name not in _PRODUCTS:
        return None
    types = {v.type.dtype for v in list(op.operands) + list(op.results)}
    if COMPLEX64 in types:
        return _complex_product(op)
    if BFLOAT16 in types:
        return _widened_product(op)
    return None


def _product_attrs(op: ir.Op) -> dict:
    return {k: v for k, v in op.attrs.items() if k != EMULATES}


def _widened_product(op: ir.Op) -> list[ir.Op]:
    e = Emitter(op, f"bfloat16 {op.name}")
    lhs, rhs = (e.convert(v, _F32) for v in op.operands)
    result = op.results[0]
    if result.type.dtype == BFLOAT16:
        product = e(op.name, [lhs, rhs], ir.TensorType(result.type.shape, _F32), **_product_attrs(op))
        e("convert", [product], result)
    else:
        e(op.name, [lhs, rhs], result, **_product_attrs(op))
    return e.ops


def _complex_product(op: ir.Op) -> list[ir.Op]:
    """re = ar.br - ai.bi, im = ar.bi + ai.br: four real products, each
    planned as a float32 one (two when an operand is real)."""
    e = Emitter(op, f"complex64 {op.name}")
    (ar, ai), (br, bi) = (e.parts(v) for v in op.operands)
    result = op.results[0]
    real_type = ir.TensorType(result.type.shape, _F32)

    def product(x, y):
        return e(op.name, [x, y], real_type, **_product_attrs(op))

    re = product(ar, br)
    if ai is not None and bi is not None:
        re = e("subtract", [re, product(ai, bi)], real_type)
    terms = ([product(ar, bi)] if bi is not None else []) + ([product(ai, br)] if ai is not None else [])
    im = terms[0] if len(terms) == 1 else e("add", terms, real_type)
    e("complex", [re, im], result)
    return e.ops
