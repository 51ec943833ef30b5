"""Pausing Python's cyclic garbage collector around work that makes many
objects and no reference cycles (compiling a program, loading a saved
one): the collector runs every few hundred allocations over the whole
heap, JAX's and the user's model's included, and cost 10-15% of a
GPT-2 compile and half of a ResNet-50 load."""
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
