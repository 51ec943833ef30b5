"""Turns an MLIR location into the user's source line, e.g.
'/home/me/train.py:12:4 (jit(step)/dot_general in loss)'.

JAX nests locations: a NameLoc with the op's name ("jit(f)/sin") wraps a
chain of CallSiteLocs whose callee comes first, each frame a NameLoc with the
Python function's name around a FileLineColRange:

    loc("jit(f)/sin"(callsite("g"("t.py":6:11 to :21) at "f"("t.py":9:8))))

jaxlib 0.10.2's Python Location has no accessors (no callee, filename or
child), so we read the printed form. In it the innermost user frame is the
first file position, and the frame's function is the name just before it.
"""
from __future__ import annotations

import functools
import re

UNKNOWN = "unknown location"

# A quoted string, with ":line:col" after it when it is a file name. Matching
# whole quoted strings keeps names with odd characters from confusing us.
_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"(?::(\d+):(\d+))?')
# MLIR escapes a backslash as \\ and other special bytes as \XX (hex).
_ESCAPE = re.compile(r"\\(\\|[0-9A-Fa-f]{2})")


def _unescape(text: str) -> str:
    return _ESCAPE.sub(lambda m: "\\" if m[1] == "\\" else chr(int(m[1], 16)), text)


@functools.lru_cache(maxsize=4096)  # many ops share a location
def describe(location: str) -> str:
    """`location` is str() of an MLIR Location."""
    op_name = frame = None
    for match in _QUOTED.finditer(location):
        name = _unescape(match[1])
        if match[2] is None:
            op_name = op_name or name
            frame = name
            continue
        where = f"{name}:{match[2]}:{match[3]}"
        if op_name is None:
            return where
        if frame != op_name:
            return f"{where} ({op_name} in {frame})"
        return f"{where} ({op_name})"
    return op_name or UNKNOWN
