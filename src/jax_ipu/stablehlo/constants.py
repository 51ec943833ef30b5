"""Dense constants (DenseElementsAttr) as numpy arrays.

The bindings' buffer protocol covers most element types (splats come out
already broadcast, i1 as bool). It refuses bf16 ("Unsupported floating-point
type") and cannot even wrap a complex constant, so for those we read the
attribute's printed form, which is either a hex blob of the little-endian
data (large constants) or nested lists of literals.
"""
from __future__ import annotations

import re

import numpy as np

from jax_ipu import ir
from jax_ipu.errors import IpuUnimplementedError

_DENSE_TEXT = re.compile(r"dense<(.*)> : tensor<((?:\d+x)*)(.+)>", re.S)
_LITERAL = re.compile(r"[^\s,\[\]()]+")  # drops list brackets and complex parens
_BOOLS = {"true": 1, "false": 0}


def to_numpy(attr) -> np.ndarray:
    """`attr` is a jaxlib DenseElementsAttr."""
    try:
        # np.array copies: the buffer belongs to the MLIR context, which is
        # gone once the import ends.
        return np.array(attr)
    except TypeError:
        return from_text(str(attr))


def from_text(text: str) -> np.ndarray:
    """`text` is a printed dense attribute: 'dense<[1.0, 2.0]> : tensor<2xbf16>'."""
    match = _DENSE_TEXT.fullmatch(text.strip())
    if match is None:
        raise IpuUnimplementedError(f"cannot read the constant {text[:80]}")
    body, dims, element_type = match.groups()
    dtype = ir.ELEMENT_TYPES.get(element_type)
    if dtype is None:
        raise IpuUnimplementedError(f"constants of element type {element_type} are not supported")
    shape = tuple(int(d) for d in dims.split("x") if d)
    if body.startswith('"0x'):
        flat = np.frombuffer(bytes.fromhex(body[3:-1]), dtype)
    else:
        flat = _parse_literals(_LITERAL.findall(body), dtype)
    if flat.size == 1:  # a splat
        flat = np.broadcast_to(flat.reshape(()), shape)
    return np.array(flat.reshape(shape), dtype)


def _parse_literals(tokens: list[str], dtype: np.dtype) -> np.ndarray:
    if dtype.kind == "c":  # printed as (real,imag) pairs
        parts = _parse_literals(tokens, np.empty(0, dtype).real.dtype)
        return (parts[0::2] + 1j * parts[1::2]).astype(dtype)
    if dtype.kind == "b":
        return np.array([_BOOLS[t] for t in tokens], dtype)
    if dtype.kind in "iu":
        return np.array([int(t, 0) for t in tokens], dtype)
    # Floats: NaN, infinities and other exact bit patterns print as hex.
    bits = np.dtype(f"u{dtype.itemsize}")
    return np.array([np.array(int(t, 16), bits).view(dtype) if t.startswith("0x") else float(t)
                     for t in tokens], dtype)
