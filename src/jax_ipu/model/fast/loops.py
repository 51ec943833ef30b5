"""Loops run as one XLA:CPU executable each.

The engine runs a loop step by step: a Python call per step per
iteration, microseconds each, where XLA:CPU's own loop of the same body
takes nanoseconds. So a loop (Repeat or RepeatWhileTrue, with whatever it
holds: Executes, Copies, nested loops, Ifs and Switches) whose every
kernel has a translation into jax.lax (lax_kernels.py, the kernels'
reference semantics) is traced once, when the program is loaded, into a
jax function, compiled by XLA:CPU (the jaxlib already in the process) and
run as one executable: the body's tensors become the loop's carried
values, a dynamic_update_slice into a large buffer is made in place, and
only the values the rest of the program reads come back to the engine.
A host callback (a HostCall step: jax.debug.print, pure_callback,
io_callback, feeds) becomes a call from the executable back into Python
(a custom call of XLA:CPU's), which calls the host as the engine's step
does (engine.call_host): only the iterations that call back pay for it.
The callbacks are threaded through the executable's counts (each takes
them and gives them back), so they run in program order, and none is
dropped or hoisted. One that raises stops the executable, and the run
raises its exception. A loop holding anything else (a collective, a
kernel without a translation, a step kind this module does not know)
runs on the engine's steps, its inner loops translated on their own.

Cycles are counted as the engine counts them: the executable counts the
iterations of every loop of unknown trip count and the branches every If
and Switch takes, and the run's record (engine.RunRecord) is made from
those counts and the steps' estimated cycles: exact per step, with the
order of the iterations of nested loops reconstructed from the counts.

A long loop runs in chunks of iterations (its carried values staying in
XLA's buffers between them), so that cancel_runs() stops it at a chunk's
end, as the engine's loops stop at an iteration's."""
from __future__ import annotations

import collections
import dataclasses
import functools
import logging
import time

import numpy as np

from jax_ipu.graph import programs as p
from jax_ipu.graph.records import record_of
from jax_ipu.graph.views import View
from jax_ipu.model import links, registry
from jax_ipu.model.fast import helper, lax_kernels, xla_chains
from jax_ipu.model.fast.lazy_copies import refs

log = logging.getLogger(__name__)

# Whether loops run as XLA:CPU executables (also off with
# JAX_IPU_MODEL_XLA_CHAINS=0, or without a CPU backend); off only to
# measure what that saves.
XLA_LOOPS = True
# A loop runs as an executable once it runs this many iterations (a
# Repeat of as many from the start, a RepeatWhileTrue from the iteration it
# reaches that many, over all runs): compiling one costs about what the engine's steps take
# for tens of iterations of its body. 0: every loop, from the start.
MIN_ITERATIONS = 64
# A run's first chunk of iterations; later chunks are sized to take about
# CHUNK_SECONDS each (at most GROWTH times the last one).
FIRST_CHUNK = 256
CHUNK_SECONDS = 0.25
GROWTH = 16


class _Untranslatable(lax_kernels.Untranslatable):
    pass


# -- what steps read and write


def _leaf_tensors(step) -> tuple[set, set]:
    """(ids read, ids written) of an Execute or Copy."""
    if isinstance(step, p.Execute):
        kernel = step.compute_set.kernel
        record = record_of(kernel)
        return {t.id for t in record.read_tensors(kernel)}, {t.id for t in record.written(kernel)}
    if isinstance(step, p.Copy):
        return {t.id for t in step.src.tensors}, {step.dst.id}
    if isinstance(step, p.HostCall):
        return {t.id for v in step.inputs for t in v.tensors}, {t.id for t in step.outputs}
    if isinstance(step, p.StreamingCopy):
        starts = {s.tensor.id for s in step.starts if isinstance(s, View)}
        buffer, tile = step.buffer.tensor.id, step.tile.id
        # A store writes a window: the rest of the buffer is read through it.
        return (starts | {buffer, tile}, {buffer}) if step.store else (starts | {buffer}, {tile})
    raise _Untranslatable(f"a {type(step).__name__} step")


def _decides(step) -> set:
    """The tensor a control step reads to decide (predicate, branch index)."""
    return {getattr(step, f).id for f in ("predicate", "control") if hasattr(step, f)}


def exposed(steps, defined: set) -> tuple[set, set]:
    """(tensors the steps read before writing them, given `defined` are
    written; what is surely written after them)."""
    reads, defined = set(), set(defined)
    for step in steps:
        if isinstance(step, p.Sequence):
            r, defined = exposed(step.steps, defined)
            reads |= r
        elif isinstance(step, p.Call):
            r, defined = exposed(step.function.steps, defined)
            reads |= r
        elif isinstance(step, p.Repeat):
            r, after = exposed(step.body.steps, defined)
            reads |= r
            if step.count > 0:
                defined = after
        elif isinstance(step, p.RepeatWhileTrue):
            r, defined = exposed(step.condition.steps, defined)
            reads |= r | (_decides(step) - defined)
            r, _ = exposed(step.body.steps, defined)
            reads |= r
        elif isinstance(step, (p.If, p.Switch)):
            reads |= _decides(step) - defined
            branches = [exposed(b.steps, defined) for b in p.children(step)]
            for r, _ in branches:
                reads |= r
            defined = set.intersection(*[d for _, d in branches])
        else:
            r, w = _leaf_tensors(step)
            reads |= r - defined
            defined |= w
    return reads, defined


def written(step) -> set:
    if isinstance(step, p.CONTROL):
        out = set()
        for child in p.children(step):
            out |= written(child)
        return out
    return _leaf_tensors(step)[1]


# -- the run's record


@dataclasses.dataclass(eq=False)
class Node:
    """A control step inside a translated loop, for its record: `parts`
    are its sub-programs as lists of step infos (engine's (kind, name,
    cycles, bytes)) and Nodes; `counters` index the executable's counts
    (a RepeatWhileTrue's iterations; each branch's times taken)."""
    step: object
    info: tuple
    parts: list
    counters: tuple = ()


class Segment:
    """A translated loop's steps in one run, as the executable's counts:
    its record's cycles and bytes without listing the steps; steps()
    lists them."""

    def __init__(self, root: Node, counts: np.ndarray):
        self.root, self.counts = root, [int(c) for c in counts]

    def _parts(self, node: Node, entries: int) -> list:
        """(sub-program, times it runs) of a node entered `entries` times."""
        step = node.step
        if isinstance(step, p.Repeat):
            runs = [step.count * entries]
        elif isinstance(step, p.RepeatWhileTrue):
            iterations = self.counts[node.counters[0]]
            runs = [iterations + entries, iterations]          # condition, body
        else:
            runs = [self.counts[c] for c in node.counters]
        return list(zip(node.parts, runs, strict=True))

    def _decisions(self, node: Node, entries: int) -> int:
        """Times a control step decides (its control cycles are per decision)."""
        if isinstance(node.step, p.Repeat):
            return node.step.count * entries
        if isinstance(node.step, p.RepeatWhileTrue):
            return self.counts[node.counters[0]] + entries
        return entries

    def _walk(self, node: Node, entries: int):
        """(node, entries, its sub-programs with their runs) for every node."""
        parts = self._parts(node, entries)
        yield node, entries, parts
        for items, runs in parts:
            for item in items:
                if isinstance(item, Node):
                    yield from self._walk(item, runs)

    def _total(self, field: int) -> int:
        total = 0
        for node, entries, parts in self._walk(self.root, 1):
            total += node.info[field] * self._decisions(node, entries)
            total += sum(sum(i[field] for i in items if isinstance(i, tuple)) * runs for items, runs in parts)
        return total

    @property
    def cycles(self) -> int:
        return self._total(2)

    @property
    def exchange_bytes(self) -> int:
        return self._total(3)

    def steps(self) -> list:
        """The steps in order. The executable counts each loop's iterations
        and each branch's takings over the run, not their order: they are
        spread evenly over the entries (exact totals per step)."""
        left = {id(items): runs for _, _, parts in self._walk(self.root, 1) for items, runs in parts}
        out: list = []
        self._enter(self.root, 1, list(self.counts), left, out)
        return out

    def _enter(self, node: Node, entries_left: int, remaining: list, left: dict, out: list) -> None:
        """One entry of a node that has `entries_left` entries to go."""
        step = node.step
        if isinstance(step, p.Repeat):
            for _ in range(step.count):
                out.append(node.info)
                self._run(node.parts[0], remaining, left, out)
        elif isinstance(step, p.RepeatWhileTrue):
            c = node.counters[0]
            iterations = -(-remaining[c] // max(entries_left, 1))
            remaining[c] -= iterations
            self._run(node.parts[0], remaining, left, out)
            out.append(node.info)
            for _ in range(iterations):
                self._run(node.parts[1], remaining, left, out)
                self._run(node.parts[0], remaining, left, out)
                out.append(node.info)
        else:
            taken = max(range(len(node.counters)), key=lambda b: remaining[node.counters[b]])
            remaining[node.counters[taken]] -= 1
            out.append(node.info)
            self._run(node.parts[taken], remaining, left, out)

    def _run(self, items: list, remaining: list, left: dict, out: list) -> None:
        """One run of a sub-program."""
        runs_left = left[id(items)]
        left[id(items)] -= 1
        for item in items:
            if isinstance(item, tuple):
                out.append(item)
            else:
                self._enter(item, runs_left, remaining, left, out)


# -- translation


class _Plan:
    """What tracing a loop needs of each control step inside it, found
    before tracing: the tensors each carries (a loop: written in it and
    read before written in an iteration, or read outside it; an If or
    Switch: written in it and read outside it), its counters, and the
    record's Nodes."""

    def __init__(self, top, outside_refs: collections.Counter, describe):
        self.outside_refs, self.describe = outside_refs, describe
        self.carried: dict[int, list] = {}
        self.counters: dict[int, tuple] = {}
        self.count = 0
        self.root = self._node(top)

    def _outside(self, step) -> set:
        inside = collections.Counter(refs(step, []))
        return {t for t, n in inside.items() if self.outside_refs[t] > n}

    def _items(self, steps) -> list:
        items = []
        for step in steps:
            if isinstance(step, p.Sequence):
                items += self._items(step.steps)
            elif isinstance(step, p.Call):
                items += self._items(step.function.steps)
            elif isinstance(step, p.CONTROL):
                items.append(self._node(step))
            else:
                if isinstance(step, p.Execute) and type(step.compute_set.kernel) not in registry.TRACED:
                    raise _Untranslatable(f"the kernel {type(step.compute_set.kernel).__name__}")
                _leaf_tensors(step)
                items.append(self.describe(step))
        return items

    def _node(self, step) -> Node:
        out = written(step)
        needed = self._outside(step)
        if isinstance(step, p.Repeat):
            needed |= exposed(step.body.steps, set())[0]
        elif isinstance(step, p.RepeatWhileTrue):
            needed |= exposed([*step.body.steps, *step.condition.steps], set())[0]
        self.carried[id(step)] = sorted(out & needed)
        if isinstance(step, p.Repeat):
            parts, counters = [step.body], ()
        elif isinstance(step, p.RepeatWhileTrue):
            parts, counters = [step.condition, step.body], (self._counter(),)
        else:
            parts = p.children(step)
            counters = tuple(self._counter() for _ in parts)
        if isinstance(step, p.Switch) and any(isinstance(k, bool) or not isinstance(k, (int, np.integer))
                                              for k in step.cases):
            raise _Untranslatable("a switch of non-integer cases")
        self.counters[id(step)] = counters
        return Node(step, self.describe(step), [self._items(part.steps) for part in parts], counters)

    def _counter(self) -> int:
        self.count += 1
        return self.count - 1


def _truth(lax, value):
    value = lax.reshape(value, ())
    if value.dtype == np.bool_:
        return value
    return lax.ne(value, lax.convert_element_type(0, value.dtype))


class _Tracer:
    """Traces a loop's steps into jax, given the plan."""

    def __init__(self, jax, plan: _Plan, zero, shapes: dict, stand_ins: frozenset, host=None, indices=None):
        self.jax, self.lax, self.plan, self.zero, self.shapes = jax, jax.lax, plan, zero, shapes
        self.stand_ins, self.host, self.indices = stand_ins, host, indices

    def trace(self, env: dict) -> lax_kernels.Trace:
        return lax_kernels.Trace(self.jax, env, self.zero, self.stand_ins, self.indices)

    def initial(self, env: dict, t: int):
        """A carried tensor's value on entry (zeros if nothing wrote it yet:
        nothing reads that value)."""
        if t in env:
            return env[t]
        shape, dtype = self.shapes[t]
        return self.jax.numpy.zeros(shape, dtype)

    def steps(self, steps, env: dict, cnt):
        for step in steps:
            if isinstance(step, p.Sequence):
                cnt = self.steps(step.steps, env, cnt)
            elif isinstance(step, p.Call):
                cnt = self.steps(step.function.steps, env, cnt)
            elif isinstance(step, p.Repeat):
                cnt = self.repeat(step, env, cnt, step.count)
            elif isinstance(step, p.RepeatWhileTrue):
                cnt = self.repeat_while(step, env, cnt)
            elif isinstance(step, (p.If, p.Switch)):
                cnt = self.branch(step, env, cnt)
            elif isinstance(step, p.Execute):
                kernel = step.compute_set.kernel
                registry.TRACED[type(kernel)](kernel, self.trace(env))
            elif isinstance(step, p.StreamingCopy):
                self.streaming_copy(step, self.trace(env))
            elif isinstance(step, p.HostCall):
                cnt = self.host_call(step, self.trace(env), cnt)
            else:
                t = self.trace(env)
                value = t.read(step.src)
                if value.dtype != step.dst.dtype and np.dtype(value.dtype).kind == "f" \
                        and np.dtype(step.dst.dtype).kind in "iub":
                    raise _Untranslatable("a Copy converting floats to integers")
                t.write(step.dst, value)
        return cnt

    def host_call(self, step: p.HostCall, t: lax_kernels.Trace, cnt):
        """A call back into Python (self.host(step)) taking the counts
        with the operands and giving them back with the results: each
        callback depends on the one before, so they run in order."""
        from jax._src import core

        if self.host is None:
            raise _Untranslatable("a HostCall step")
        for tensor in step.outputs:
            lax_kernels.check_dtype(tensor.dtype)
        operands = [t.read(v) for v in step.inputs]
        results = (core.ShapedArray(cnt.shape, cnt.dtype),
                   *(core.ShapedArray(tuple(tensor.shape), tensor.dtype) for tensor in step.outputs))
        cnt, *values = _host_call_p().bind(cnt, *operands, fn=self.host(step), results=results)
        for tensor, value in zip(step.outputs, values, strict=True):
            t.write(tensor, value)
        return cnt

    def streaming_copy(self, step: p.StreamingCopy, t: lax_kernels.Trace) -> None:
        """A window of a tensor in streaming memory loaded or stored, its
        starts clamped as XLA's dynamic slices clamp them (the engine's
        clamped_window)."""
        lax = self.lax
        starts = []
        for source in step.starts:
            start = t.read(source) if isinstance(source, View) else np.asarray(source)
            dtype = np.dtype(start.dtype)
            if dtype.kind not in "iu" or (dtype.kind == "u" and dtype.itemsize >= 4) or dtype.itemsize > 4:
                raise _Untranslatable(f"a streaming copy's start of type {dtype}")
            starts.append(lax.convert_element_type(lax.reshape(start, ()) if isinstance(source, View) else
                                                   int(start.reshape(())), np.int32))
        shape = tuple(step.buffer.shape)
        if not step.store:
            window = lax.dynamic_slice(t.read(step.buffer), starts, tuple(step.sizes))
            t.write(step.tile, lax.reshape(window, tuple(step.tile.shape)))
            return
        tensor = step.buffer.tensor
        buffer = self.initial(t.env, tensor.id)
        tile = lax.reshape(t.tensor(step.tile), tuple(step.sizes))
        updated = lax.dynamic_update_slice(lax.reshape(buffer, shape), tile, starts)
        t.write(tensor, lax.reshape(updated, tuple(tensor.shape)))

    def _scope(self, env: dict, carried: list, values) -> dict:
        inner = dict(env)
        inner.update(zip(carried, values, strict=True))
        return inner

    def repeat(self, step, env: dict, cnt, count):
        carried = self.plan.carried[id(step)]

        def body(i, c):
            inner = self._scope(env, carried, c[0])
            cnt = self.steps(step.body.steps, inner, c[1])
            return tuple(inner[t] for t in carried), cnt
        values, cnt = self.lax.fori_loop(0, count, body, (tuple(self.initial(env, t) for t in carried), cnt))
        env.update(zip(carried, values, strict=True))
        return cnt

    def iteration(self, step, env: dict, carried: list, values, cnt):
        """One iteration of a RepeatWhileTrue (body, then condition):
        (predicate, carried values, counts)."""
        inner = self._scope(env, carried, values)
        cnt = self.steps(step.body.steps, inner, cnt)
        cnt = cnt.at[self.plan.counters[id(step)][0]].add(1)
        cnt = self.steps(step.condition.steps, inner, cnt)
        return _truth(self.lax, inner[step.predicate.id]), tuple(inner[t] for t in carried), cnt

    def condition(self, step, env: dict, carried: list, values, cnt):
        inner = self._scope(env, carried, values)
        cnt = self.steps(step.condition.steps, inner, cnt)
        return _truth(self.lax, inner[step.predicate.id]), tuple(inner[t] for t in carried), cnt

    def repeat_while(self, step, env: dict, cnt):
        carried = self.plan.carried[id(step)]
        state = self.condition(step, env, carried, tuple(self.initial(env, t) for t in carried), cnt)
        _, values, cnt = self.lax.while_loop(lambda c: c[0], lambda c: self.iteration(step, env, carried, c[1], c[2]),
                                             state)
        env.update(zip(carried, values, strict=True))
        return cnt

    def branch(self, step, env: dict, cnt):
        lax = self.lax
        outs = self.plan.carried[id(step)]
        counters = self.plan.counters[id(step)]
        if isinstance(step, p.If):
            index = lax.convert_element_type(lax.bitwise_not(_truth(lax, env[step.predicate.id])), np.int32)
            bodies = [step.then_body, step.else_body]
        else:
            control = lax.reshape(env[step.control.id], ())
            if np.dtype(control.dtype).kind not in "iu":
                raise _Untranslatable("a switch on a float")
            bodies = [*step.cases.values(), step.default]
            index = lax.full((), len(bodies) - 1, np.int32)
            for b, key in reversed(list(enumerate(step.cases))):
                key = int(key)
                info = np.iinfo(control.dtype)
                if info.min <= key <= info.max:
                    index = lax.select(lax.eq(control, lax.full((), key, control.dtype)),
                                       lax.full((), b, np.int32), index)

        def taken(b):
            def run(c):
                inner = self._scope(env, outs, c[0])
                cnt = self.steps(bodies[b].steps, inner, c[1])
                return tuple(inner[t] for t in outs), cnt.at[counters[b]].add(1)
            return run
        values, cnt = lax.switch(index, [taken(b) for b in range(len(bodies))],
                                 (tuple(self.initial(env, t) for t in outs), cnt))
        env.update(zip(outs, values, strict=True))
        return cnt


@functools.cache
def _host_call_p():
    """The primitive of a host callback in a loop's executable: fn(counts,
    *operands) -> (counts, *results) on numpy arrays, lowered for XLA:CPU
    as JAX lowers its own callbacks there, marked as having side effects."""
    from jax._src import callback, core
    from jax.interpreters import mlir

    prim = core.Primitive("ipu_model_host_call")
    prim.multiple_results = True
    prim.def_abstract_eval(lambda *args, fn, results: results)

    def lower(ctx, *args, fn, results):
        out, _, _ = callback.emit_python_callback(ctx, fn, None, list(args), ctx.avals_in, ctx.avals_out,
                                                  has_side_effect=True, returns_token=False)
        return out
    mlir.register_lowering(prim, lower, platform="cpu")
    return prim


def translated(step, program_refs: collections.Counter, shapes: dict, describe, stand_ins=frozenset(),
               aliased=frozenset(), record: list | None = None, cancelled=None, call_host=None):
    """fn(state) running a Repeat or RepeatWhileTrue step as one XLA:CPU
    executable, or None when it cannot run so (then the engine runs its
    steps). program_refs: how many times the program (its steps, inputs
    and outputs) refers to each tensor; shapes: tensor id -> (shape,
    dtype); describe(step) -> the step's record entry; stand_ins: tensors
    holding a fusion's stand-in; aliased: tensors sharing memory with
    another (a donated input and its output); record: the run's trace, to
    which each run appends its Segment; cancelled(): raises when the run
    was cancelled; call_host(step, operands, replica): a HostCall step's
    results (engine.call_host; without it a loop holding one runs on the
    engine's steps)."""
    if not (XLA_LOOPS and xla_chains.ENABLED) or xla_chains._cpu() is None:
        return None
    try:
        return _Loop(step, program_refs, shapes, describe, stand_ins, aliased, record, cancelled, call_host).run
    except Exception as exc:       # noqa: BLE001 - the engine's own steps run what XLA will not take
        log.info("loop %s runs on the engine's steps (%s: %s)", getattr(step, "name", ""), type(exc).__name__, exc)
        return None


class _Loop:
    """A top-level loop's executable: a chunk of iterations per call (see
    the module's docstring); its carried values in and out, the values it
    only reads in."""

    def __init__(self, step, program_refs, shapes, describe, stand_ins, aliased, record, cancelled, call_host):
        import jax
        from jax._src import core
        from jax.sharding import SingleDeviceSharding

        self.step, self.record, self.cancelled, self.shapes = step, record, cancelled, shapes
        # The run's replica, for the callbacks (which XLA may call on a
        # thread of its own), and the first exception one raised.
        self.call_host, self.replica, self.failure = call_host, None, None
        self.plan = plan = _Plan(step, program_refs, describe)
        inside = collections.Counter(refs(step, []))
        crossing = {t for t in inside if program_refs[t] > inside[t]}
        if crossing & set(stand_ins):
            raise _Untranslatable("a fusion's stand-in crosses the loop's boundary")
        self.stand_ins = frozenset(stand_ins) & set(inside)
        self.carried = plan.carried[id(step)]
        reads, _ = exposed([step], set())
        self.invariant = sorted(reads - set(self.carried))
        self.outputs = [(i, t) for i, t in enumerate(self.carried) if t in crossing or t in aliased]
        device, self.jaxlib = xla_chains._cpu()
        self.sharding, self.devices = SingleDeviceSharding(device), [device]
        self.avals = {t: core.ShapedArray(shape, dtype) for t, (shape, dtype) in shapes.items()
                      if t in set(self.carried) | set(self.invariant)}
        self.scalar = {dtype: core.ShapedArray((), dtype) for dtype in (np.uint32, np.int32, np.bool_)}
        self.is_while = isinstance(step, p.RepeatWhileTrue)
        specs = [jax.ShapeDtypeStruct(*shapes[t], sharding=self.sharding) for t in self.carried + self.invariant]
        specs += [jax.ShapeDtypeStruct((), dtype, sharding=self.sharding) for dtype in
                  ((np.uint32,) * 3 + ((np.int32, np.bool_, np.bool_) if self.is_while else (np.int32,)))]
        # The carried values are donated: a chunk updates them in place (a
        # buffer written row by row is not copied for each chunk).
        with xla_chains._compile_lock:
            # The compiled function is kept: it holds the callbacks' Python functions.
            self.compiled = jax.jit(self._chunk, keep_unused=True, donate_argnums=tuple(range(len(self.carried)))
                                    ).lower(*specs).compile()
            self.executable = self.compiled.runtime_executable()
        self.zero = self._put(np.zeros((), np.uint32))

    def _chunk(self, *args):
        """One chunk of at most `limit` iterations: (carried values, counts
        [, predicate]). The run's replica and partition indices come as
        arguments: a program on several IPUs has one executable per IPU,
        which may run as another replica in another launch."""
        import jax

        n = len(self.carried)
        carried, invariant = args[:n], args[n:n + len(self.invariant)]
        zero, replica, partition, limit, *flags = args[n + len(self.invariant):]
        tracer = _Tracer(jax, self.plan, zero, self.shapes, self.stand_ins,
                         self._host if self.call_host is not None else None,
                         {"replica": replica, "partition": partition})
        env = dict(zip(self.invariant, invariant, strict=True))
        cnt = jax.numpy.zeros(max(self.plan.count, 1), np.int32)
        step, lax = self.step, jax.lax
        if not self.is_while:
            env.update(zip(self.carried, carried, strict=True))
            cnt = tracer.repeat(step, env, cnt, limit)
            return tuple(env[t] for t in self.carried), cnt
        start, predicate = flags
        predicate, carried, cnt = lax.cond(
            start, lambda c: tracer.condition(step, env, self.carried, c[0], c[1]),
            lambda c: (predicate, c[0], c[1]), (tuple(carried), cnt))

        def more(c):
            return c[0] & (c[3] < limit)

        def iteration(c):
            return (*tracer.iteration(step, env, self.carried, c[1], c[2]), c[3] + 1)
        predicate, carried, cnt, _ = lax.while_loop(more, iteration, (predicate, carried, cnt, np.int32(0)))
        return carried, cnt, predicate

    def _host(self, step: p.HostCall):
        """The Python function the executable calls for a HostCall step."""
        def host(cnt, *operands):
            try:
                # The host gets copies: a callback may keep what it is given.
                results = self.call_host(step, [np.array(o) for o in operands], self.replica)
            except BaseException as exc:       # the run raises it once XLA has stopped
                if self.failure is None:
                    self.failure = exc
                raise
            return (np.array(cnt), *results)
        return host

    def _put(self, array: np.ndarray, aval=None, copied: bool = False):
        """`array` as an argument: read in place, or (copied) in a buffer
        of XLA's own, which a donated argument must be."""
        aval = self.scalar[array.dtype.type] if aval is None else aval
        semantics = self.jaxlib.HostBufferSemantics
        return self.jaxlib.batched_device_put(aval, self.sharding, [array], self.devices, True, False,
                                              semantics.IMMUTABLE_ONLY_DURING_CALL if copied else semantics.ZERO_COPY)

    def _value(self, state, t: int) -> np.ndarray:
        shape, dtype = self.shapes[t]
        value = state[t]
        if value is None:
            return np.zeros(shape, dtype)
        return np.ascontiguousarray(value, dtype=dtype).reshape(shape)

    def run(self, state) -> None:
        helper.end_session()        # a spinning helper would take a core from XLA's threads
        self.replica, self.failure = links.current(), None
        try:
            self._run(state)
        except Exception:
            failure, self.failure = self.failure, None
            if failure is not None:     # a callback's exception, not XLA's report of it
                raise failure from None
            raise

    def _run(self, state) -> None:
        carried = [self._put(self._value(state, t), self.avals[t], copied=True) for t in self.carried]
        invariant = [self._put(self._value(state, t), self.avals[t]) for t in self.invariant]
        counts = np.zeros(max(self.plan.count, 1), np.int64)
        indices = [self._put(np.array(getattr(self.replica, which), np.uint32)) for which in ("replica", "partition")]
        left = None if self.is_while else self.step.count
        limit, start, predicate = FIRST_CHUNK, True, True
        while (left is None and predicate) or (left is not None and left > 0):
            n = limit if left is None else min(limit, left)
            began = time.perf_counter()
            args = [*carried, *invariant, self.zero, *indices, self._put(np.array(n, np.int32))]
            if self.is_while:
                args += [self._put(np.array(start)), self._put(np.array(predicate))]
            results = self.executable.execute_sharded(args).disassemble_into_single_device_arrays()
            carried = [r[0] for r in results[:len(self.carried)]]
            counts += np.asarray(results[len(self.carried)][0])
            if self.is_while:
                predicate, start = bool(np.asarray(results[-1][0])), False
            else:
                left -= n
            took = time.perf_counter() - began
            if (left is None and predicate) or (left is not None and left > 0):
                if self.cancelled is not None:
                    self.cancelled()
                limit = int(min(limit * GROWTH, max(limit, limit * CHUNK_SECONDS / max(took, 1e-6))))
        for i, t in self.outputs:
            state[t] = np.asarray(carried[i])
        if self.record is not None:
            self.record.append(Segment(self.plan.root, counts))
