"""The program tree (Poplar's program::Sequence, Execute, Copy, Repeat,
RepeatWhileTrue, If, Switch, Call) and host data streams. Leaf steps carry
the cycles the compiler's cost pass estimated for them."""
from __future__ import annotations

import dataclasses

from jax_ipu.graph.compute import ComputeSet
from jax_ipu.graph.tensors import Tensor
from jax_ipu.graph.views import Concat, View


@dataclasses.dataclass(eq=False)
class Sequence:
    steps: list


@dataclasses.dataclass(eq=False)
class Execute:
    compute_set: ComputeSet
    cycles: int = 0                # exchange in + compute + sync
    exchange_bytes: int = 0        # bytes vertices read from other tiles
    exchange_cycles: int = 0       # the parts of `cycles` (profiles' timelines)
    sync_cycles: int = 0


@dataclasses.dataclass(eq=False)
class Copy:
    """dst = src: an exchange when elements change tiles."""
    src: View | Concat
    dst: Tensor
    cycles: int = 0
    exchange_bytes: int = 0
    exchange_cycles: int = 0       # the parts of `cycles`: exchange and on-tile copy, sync
    sync_cycles: int = 0


@dataclasses.dataclass(eq=False)
class StreamingCopy:
    """A window of `buffer` (a tensor in streaming memory, read through
    reshapes only) copied onto the tiles into `tile` (store False), or
    `tile` copied into that window (store True): Poplar's Copy between a
    RemoteBuffer and a tensor at an offset read at run time. The window
    has `sizes` and starts at `starts`, per axis a scalar integer view on
    the tiles or a constant, clamped so that the window fits (as XLA's
    dynamic_slice); `tile` holds its elements in order."""
    buffer: View
    tile: Tensor
    starts: tuple
    sizes: tuple[int, ...]
    store: bool
    name: str = ""
    cycles: int = 0                # streaming memory's bandwidth and latency


@dataclasses.dataclass(eq=False)
class Repeat:
    count: int
    body: Sequence
    name: str = ""                 # the loop, for estimates and profiles


@dataclasses.dataclass(eq=False)
class RepeatWhileTrue:
    """Runs `condition`, then `body` while the scalar `predicate` is true."""
    condition: Sequence
    predicate: Tensor
    body: Sequence
    name: str = ""


@dataclasses.dataclass(eq=False)
class If:
    predicate: Tensor
    then_body: Sequence
    else_body: Sequence


@dataclasses.dataclass(eq=False)
class Switch:
    control: Tensor                # scalar integer
    cases: dict[int, Sequence]
    default: Sequence


@dataclasses.dataclass(eq=False)
class Call:
    """Runs a shared sub-program (Poplar's program::Call of a Function)."""
    function: Sequence
    name: str = ""


@dataclasses.dataclass(eq=False)
class HostToDevice:
    """Stream of argument `index` from the host into `tensor`."""
    index: int
    tensor: Tensor
    cycles: int = 0                # host link time, kept out of Program.cycles


@dataclasses.dataclass(eq=False)
class DeviceToHost:
    """Stream of result `index` from `src` to the host."""
    index: int
    src: View
    cycles: int = 0


@dataclasses.dataclass(eq=False)
class HostCall:
    """Streams `inputs` to the host, runs host function `callback_id` on
    them and streams its results into `outputs` (Poplar: a device-to-host
    stream, a host callback, a host-to-device stream). `partition`: in a
    program over several partitions (jit of sharded arrays), the one
    whose IPU calls the host, once for all, its results sent to the others
    (JAX's maximal sharding of a callback); None: every IPU calls it."""
    callback_id: int
    inputs: list[View]
    outputs: list[Tensor]
    cycles: int = 0
    host_bytes: int = 0
    partition: int | None = None
    name: str = ""                 # the callback's op and source line, for profiles


CONTROL = (Sequence, Repeat, RepeatWhileTrue, If, Switch, Call)


def children(step) -> list[Sequence]:
    """The sub-programs of a control step."""
    if isinstance(step, Sequence):
        return list(step.steps)
    if isinstance(step, Repeat):
        return [step.body]
    if isinstance(step, RepeatWhileTrue):
        return [step.condition, step.body]
    if isinstance(step, If):
        return [step.then_body, step.else_body]
    if isinstance(step, Switch):
        return [*step.cases.values(), step.default]
    if isinstance(step, Call):
        return [step.function]
    return []


def leaves(step):
    """Execute / Copy / stream steps, in program order."""
    if isinstance(step, CONTROL):
        for child in children(step):
            yield from leaves(child)
    else:
        yield step
