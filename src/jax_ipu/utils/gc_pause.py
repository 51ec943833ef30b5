"""Pausing Python's cyclic garbage collector around work that makes many
objects and no reference cycles (compiling a program, loading a saved
one): the collector runs every few hundred allocations over the whole
heap, JAX's and the user's model's included, and cost a tenth of a large
compile and half of a large load (docs/performance.md)."""
from __future__ import annotations

import contextlib
import gc


@contextlib.contextmanager
def paused():
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
