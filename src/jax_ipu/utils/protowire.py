"""Reading protobuf's wire format one level deep: the few fields jax-ipu
reads from messages jaxlib serializes (a compile's device assignment, a
profiler's options), where compiling their .proto files would be heavier
than the reading."""
from __future__ import annotations

from collections.abc import Iterator


def fields(data: bytes, what: str = "protobuf message") -> Iterator[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) of each field: an int for varints
    (wire type 0), the bytes for fixed64 / length-delimited / fixed32 (1, 2,
    5). A truncated message or another wire type is a ValueError naming
    `what`."""
    i = 0
    while i < len(data):
        key, i = varint(data, i, what)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, i = varint(data, i, what)
        elif wire in (1, 2, 5):
            if wire == 2:
                size, i = varint(data, i, what)
            else:
                size = 8 if wire == 1 else 4
            if i + size > len(data):
                raise ValueError(f"jax-ipu: truncated {what}")
            value, i = bytes(data[i:i + size]), i + size
        else:
            raise ValueError(f"jax-ipu: unreadable {what} (wire type {wire} at byte {i})")
        yield field, wire, value


def varint(data: bytes, i: int, what: str = "protobuf message") -> tuple[int, int]:
    """(the varint at data[i], the index after it)."""
    value = shift = 0
    while True:
        if i >= len(data):
            raise ValueError(f"jax-ipu: truncated {what}")
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, i
