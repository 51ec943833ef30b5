"""The one table of the Model's kernel executors (docs/architecture.md).

Every kernel class (graph/records.py) has a reference executor, in
model/executors/: plain numpy that says what the kernel computes and
nothing else. A kernel may also have a fast executor, in model/fast/
(BLAS, XLA:CPU, the helper thread, strided reads), registered beside it
here, a translation into jax.lax for loops run on XLA:CPU (traced), and
a fusion: a fast producer that leaves a stand-in for an output
its record allows one in (MatMulPartials' partials, already summed), and
the fast reader of that stand-in. tests/ipu/model/test_fast_matches_reference.py
runs both on every kernel with a fast executor.

An executor is build(kernel, read) -> fn(state), `state` being the
engine's list of arrays by tensor id and read(source) -> fn(state) the
reader of a view (or of an immediate); a fast one is build(kernel, read,
whole) and may return None, leaving the kernel to the reference. `whole`:
the kernel runs in a lane (model/fast/lanes.py), its rows never cut for
the helper thread. Everything that can be decided before a run is decided
when building."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

from jax_ipu.graph.records import RECORDS, record_of

# kernel class -> build(kernel, read) -> fn(state)
REFERENCE: dict[type, Callable] = {}
# kernel class -> build(kernel, read, whole) -> fn(state) or None
FAST: dict[type, Callable] = {}
# kernel class -> trace(kernel, t): the kernel's reference semantics in
# jax.lax, for loops run as one XLA:CPU executable (model/fast/loops.py)
TRACED: dict[type, Callable] = {}


@dataclasses.dataclass(frozen=True)
class Fusion:
    """A producer's output (`field`, which its record lets hold a stand-in)
    left as a stand-in when only consumers of `consumer`'s class that
    `accepts` read it, through their field `reads`."""
    producer: type
    field: str
    consumer: type
    reads: str
    accepts: Callable                      # accepts(consumer kernel) -> bool
    build_producer: Callable               # (kernel, read, whole) -> fn(state)
    build_consumer: Callable               # (kernel, read) -> fn(state)


# producer class -> its fusion
FUSIONS: dict[type, Fusion] = {}


def _check_kernel(kind: type, what: str) -> None:
    if kind not in RECORDS:
        raise TypeError(f"{what} for {kind.__name__}, which is no kernel (graph/records.py codelet)")


def _registrar(table: dict, what: str) -> Callable:
    def register(kind: type) -> Callable:
        def decorate(build: Callable) -> Callable:
            _check_kernel(kind, f"a {what} executor")
            if kind in table:
                raise ValueError(f"two {what} executors for {kind.__name__}: "
                                 f"{table[kind].__module__} and {build.__module__}")
            table[kind] = build
            return build
        return decorate
    register.__doc__ = f"Registers the decorated build function as the kernel class's {what} executor."
    return register


reference = _registrar(REFERENCE, "reference")
fast = _registrar(FAST, "fast")
traced = _registrar(TRACED, "traced")


def fusion(found: Fusion) -> Fusion:
    """Registers a fusion; its producer's field must allow a stand-in."""
    _check_kernel(found.producer, "a fusion")
    _check_kernel(found.consumer, "a fusion")
    declared = {f.name: f for f in record_of(found.producer).of_role("writes")}
    if found.field not in declared or declared[found.field].stand_in is None:
        raise TypeError(f"{found.producer.__name__}.{found.field} may not hold a stand-in: its record says no")
    if found.producer in FUSIONS:
        raise ValueError(f"two fusions of {found.producer.__name__}")
    FUSIONS[found.producer] = found
    return found


def build(kernel, read: Callable, *, fast: bool = True, whole: bool = False, stand_ins=frozenset()) -> Callable:
    """fn(state) running `kernel`: its fast executor when `fast` and it has
    one that takes the kernel, else its reference. stand_ins: ids of the
    tensors that hold a fusion's stand-in in this program (fusion_sites):
    their producer and consumers run the fusion's executors."""
    kind = type(kernel)
    if kind not in REFERENCE:
        raise TypeError(f"the IPU Model has no executor for {kind.__name__}")
    if fast and stand_ins:
        found = FUSIONS.get(kind)
        if found is not None and getattr(kernel, found.field).id in stand_ins:
            return found.build_producer(kernel, read, whole)
        for found in FUSIONS.values():
            if kind is found.consumer and found.accepts(kernel):
                source = getattr(kernel, found.reads)
                if getattr(source, "tensor", source).id in stand_ins:
                    return found.build_consumer(kernel, read)
    if fast and kind in FAST:
        fn = FAST[kind](kernel, read, whole)
        if fn is not None:
            return fn
    return REFERENCE[kind](kernel, read)
