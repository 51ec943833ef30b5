"""The IPU Model's engine: runs a compiled graph.Program on one device, as
its BSP steps say.

Loading a Program turns its tree into a list of closures once (kept per
Program): each Execute step the executor of its kernel (model/registry.py),
each Copy a host copy, control steps loops and branches over their bodies.
A run binds the inputs, calls the closures and collects the outputs, and
records the steps' estimated cycles and exchanged bytes. With `fast` (the
default) the load also uses model/fast/'s machinery, none of which changes
a value: fast executors, Copies read through by their readers
(lazy_copies), fused kernels (fusion), independent compute sets side by
side (lanes), straight-line programs as one generated function."""
from __future__ import annotations

import collections
import functools
import threading
import weakref
from collections.abc import Callable
from threading import get_ident

import numpy as np

from jax_ipu.errors import IpuReplicaFailed, IpuRunCancelled, IpuRuntimeError
from jax_ipu.graph import programs as p
from jax_ipu.graph.program import Program
from jax_ipu.graph.records import tensor_ids
from jax_ipu.graph.views import View

# Importing the packages executors/ and fast/ registers their executors:
# the reference ones, and the fast ones beside them.
from jax_ipu.model import links, registry
from jax_ipu.model.executors import common
from jax_ipu.model.executors.indexing import clamped_window
from jax_ipu.model.fast import fusion, helper, lanes, lazy_copies, loops, straight_line, views
from jax_ipu.model.fast.lazy_copies import refs
from jax_ipu.model.fast.xla_chains import aligned_copy
from jax_ipu.targets import Target


class RunRecord:
    """What one run did, for profiles: (kind, name, cycles, exchange bytes)
    per executed step, in order; a control step's entry stands for one of
    its decisions (a loop's iteration, a branch taken). A loop run as one
    XLA:CPU executable is recorded as its counts (a fast.loops.Segment),
    its steps listed when `steps` is first read."""

    def __init__(self, steps: list):
        self._parts = steps
        self._steps = None if any(type(s) is not tuple for s in steps) else steps

    @property
    def steps(self) -> list[tuple[str, str, int, int]]:
        if self._steps is None:
            self._steps = [e for part in self._parts for e in ((part,) if type(part) is tuple else part.steps())]
        return self._steps

    @property
    def cycles(self) -> int:
        return sum(s[2] if type(s) is tuple else s.cycles for s in self._parts)

    @property
    def compute_sets(self) -> list[str]:
        return [s[1] for s in self.steps if s[0] == "Execute"]

    @property
    def exchange_bytes(self) -> int:
        return sum(s[3] if type(s) is tuple else s.exchange_bytes for s in self._parts)


def _describe(step) -> tuple[str, str, int, int]:
    if isinstance(step, p.Execute):
        return ("Execute", step.compute_set.name, step.cycles, step.exchange_bytes)
    if isinstance(step, p.Copy):
        return ("Copy", step.dst.name, step.cycles, step.exchange_bytes)
    if isinstance(step, p.HostCall):
        return ("HostCall", f"host callback {step.callback_id} {step.name}".rstrip(), step.cycles, 0)
    if isinstance(step, p.CONTROL):     # one decision: a loop's iteration, a branch taken
        return (type(step).__name__, p.decision_name(step), step.cycles, step.exchange_bytes)
    if isinstance(step, p.StreamingCopy):
        return ("Copy", step.name, step.cycles, 0)
    return (type(step).__name__, str(step.index), step.cycles, 0)


class _Loaded:
    """A Program made ready to run: closures, storage template, checks.
    fast=False: reference executors only, every step as the program says."""

    def __init__(self, program: Program, fast: bool = True):
        self.fast = fast
        self.read = views.reader if fast else common.reader
        self.template: list = [t.constant for t in program.tensors]
        self.started = 0      # cancel_runs' generation when the last run began
        self.stand_ins = fusion.stand_ins(program) if fast else frozenset()
        self.lazy = lazy_copies.lazy_copies(program) if fast and lazy_copies.LAZY_COPIES else {}
        self.shared = lazy_copies.shared_copies(program) if fast and lazy_copies.LAZY_COPIES else frozenset()
        self.has_control = any(isinstance(s, p.CONTROL) for s in program.body.steps)
        self.aliases = lazy_copies.donation_aliases(program)
        self.trace: list | None = [] if self.has_control else None
        # What a loop run as one XLA:CPU executable needs of the program:
        # how often each tensor is referred to, and every tensor's shape.
        if self.has_control and fast:
            self.program_refs = collections.Counter(refs(program.body, []))
            self.program_refs.update(tensor_ids(program.outputs, []) + tensor_ids(program.inputs, []))
            self.shapes = {t.id: (tuple(t.shape), t.dtype) for t in program.tensors}
        # The loops run as XLA:CPU executables and those run on the engine's steps, by name.
        self.xla_loops: list[str] = []
        self.engine_loops: list[str] = []
        covers: list = []
        self.steps = self._sequence(program.body, covers)
        self.dead = straight_line.dead_after(program, covers, self.lazy) \
            if fast and straight_line.FREE_DEAD and not self.has_control else None
        self.inputs = [(t.id, tuple(t.shape), t.dtype) for t in program.inputs]
        self.input_ids = [t.id for t in program.inputs]
        owned_elsewhere = {t.id for t in program.inputs} | {t.id for t in program.tensors
                                                             if t.constant is not None}
        self.outputs = []
        for view in program.outputs:
            copy = view.tensor.id in owned_elsewhere or not view.is_whole_tensor
            owned_elsewhere.add(view.tensor.id)
            self.outputs.append((self.read(view), copy))
        self.in_place = [(i, program.inputs[i].id, program.outputs[o].tensor.id)
                         for o, i in program.in_place.items()]
        self.static_record = None if self.has_control else RunRecord(
            [_describe(s) for s in p.leaves(program.body)
             if not isinstance(s, (p.HostToDevice, p.DeviceToHost))])
        self.name, self.output_views = program.name, program.outputs
        # A straight-line program's first runs time its steps (step_us, the
        # fastest run's), then it runs with the helper's schedule made of them.
        # Whether a step may hand work to the helper thread (else a run
        # never engages it, and need not end a session with it).
        self.may_share = any(getattr(f, "shares", False) for f in self.steps)
        self.timed_runs = 0 if self.has_control or not self.may_share else straight_line.TIMED_RUNS
        self.step_us = [float("inf")] * len(self.steps)
        self.straight = None if self.has_control or not fast else \
            straight_line.straight_line(self, timed=self.timed_runs > 0)
        # Whether the last run handed work to the spinning helper (which then
        # starts spinning as the next run starts).
        self.shares = False

    def donated_aliases(self, inputs: list, donated) -> list:
        """(output id, input id) of the outputs written in place into the
        donated inputs' own memory (those numpy lets us write)."""
        return [(output_id, input_id) for i, input_id, output_id in self.in_place
                if i in donated and inputs[i].flags.writeable]

    def timed_run_done(self) -> None:
        self.timed_runs -= 1
        if self.timed_runs == 0:
            self.straight = straight_line.straight_line(self, timed=False)

    def _sequence(self, seq: p.Sequence, covers: list | None = None) -> list:
        """The functions running `seq`'s steps; `covers` (if given) gets,
        per function, the steps it runs."""
        covers = [] if covers is None else covers
        if not (self.fast and lanes.LANES):
            fns = []
            for step in seq.steps:
                if (fn := self._step(step)) is not None:
                    fns.append(fn)
                    covers.append([step])
            return fns
        # Lazy Copies run nothing; in a traced run they still take their place
        # in the record, with the step after them (lead).
        steps, lead, pending = [], {}, []
        for s in seq.steps:
            if isinstance(s, p.Copy) and s.dst.id in self.lazy:
                pending.append(s)
            else:
                steps.append(s)
                lead[id(s)], pending = pending, []
        found = lanes.units(steps, [self.kernel(s) for s in steps], tensor_ids, self.aliases)
        order = {id(u): i for i, u in enumerate(found)}
        fns = []

        def add(s) -> None:
            if (fn := self._step(s)) is not None:
                fns.append(fn)
                covers.append([s])
        for item in lanes.plan(found):
            if isinstance(item, tuple):
                fns.append(self._lanes(item, lead, order))
                covers.append([s for lane in item for u in lane for step in u.steps for s in lead[id(step)] + [step]])
                continue
            for step in (item.steps if isinstance(item, lanes.Unit) else [item]):
                for s in lead[id(step)] + [step]:
                    add(s)
        for s in pending:
            add(s)
        return fns

    def _lanes(self, pair: tuple, lead: dict, order: dict):
        """One step running two lanes of independent compute sets. A traced
        run records their steps in program order first."""
        first, second = ([self._leaf(step, whole=True) for u in lane for step in u.steps] for lane in pair)
        infos = ()
        if self.trace is not None:
            units = sorted(pair[0] + pair[1], key=lambda u: order[id(u)])
            infos = [_describe(s) for u in units for step in u.steps for s in lead[id(step)] + [step]]
        return lanes.lanes_step(first, second, self.trace, infos)

    def kernel(self, step):
        """The kernel the engine runs for an Execute step (reading lazy
        Copies' sources), else None."""
        if not isinstance(step, p.Execute):
            return None
        kernel = step.compute_set.kernel
        if self.lazy and lazy_copies.redirectable(kernel):
            kernel = lazy_copies.redirected(kernel, self.lazy)
        return kernel

    def _step(self, step):
        fn = self._leaf(step) if not isinstance(step, p.CONTROL) else self._control(step)
        if self.trace is not None and not isinstance(step, p.CONTROL) and fn is not None:
            info, trace, inner = _describe(step), self.trace, fn

            def fn(state):
                trace.append(info)
                inner(state)
        return fn

    def _leaf(self, step, whole: bool = False):
        """whole: a product's rows in one block (in a lane), not halves."""
        if isinstance(step, p.Execute):
            return registry.build(self.kernel(step), self.read, fast=self.fast, whole=whole,
                                  stand_ins=self.stand_ins)
        if isinstance(step, p.Copy):
            if step.dst.id in self.lazy:
                # Its readers read its source (a no-op keeps it in the trace).
                return _no_op if self.trace is not None else None
            src, tid, dtype, shape = lazy_copies.compose(step.src, self.lazy), step.dst.id, step.dst.dtype, step.dst.shape
            # A transposing copy keeps its source's layout (a plain memory
            # copy); a broadcast is laid out in order, not by its zero strides.
            order = "C" if any(op[0] == "broadcast" for op in getattr(src, "ops", ())) else "K"
            if isinstance(src, View) and src.is_whole_tensor:     # e.g. a loop's carried values
                sid = src.tensor.id
                if tid in self.shared:
                    def share_whole(state):
                        state[tid] = state[sid].reshape(shape)
                    return share_whole
                # Aligned when fast, so that element-wise chains on XLA:CPU read it in place.
                new = aligned_copy if self.fast else np.array

                def copy_whole(state):
                    state[tid] = new(np.asarray(state[sid], dtype=dtype)).reshape(shape)
                return copy_whole

            def copy(state):
                state[tid] = np.array(src.apply(lambda t: state[t.id]), dtype=dtype, order=order).reshape(shape)
            return copy
        if isinstance(step, p.HostCall):
            return _host_call(step, self.read)
        if isinstance(step, p.StreamingCopy):
            return _streaming_copy(step, self.read)
        return None   # host streams: run() binds inputs and collects outputs

    def _control(self, step):
        run = _run_steps
        if isinstance(step, p.Sequence):
            body = self._sequence(step)
            return lambda state: run(body, state)
        if isinstance(step, p.Call):
            body = self._sequence(step.function)
            return lambda state: run(body, state)
        # A loop runs as one XLA:CPU executable (model/fast/loops.py) when it
        # runs long enough to pay for compiling it: a Repeat of at least
        # loops.MIN_ITERATIONS iterations from the start; a RepeatWhileTrue
        # on the engine's steps until it has run that many iterations (over
        # all runs), then the executable takes over before the next condition (the
        # condition is what it runs first) and runs it from then on.
        eager = loops.MIN_ITERATIONS <= 0 or (isinstance(step, p.Repeat) and step.count >= loops.MIN_ITERATIONS)
        if isinstance(step, (p.Repeat, p.RepeatWhileTrue)) and self.fast and eager:
            fn = self._translated(step)
            if fn is not None:
                return fn
        lazy = self.fast and not eager and isinstance(step, p.RepeatWhileTrue)
        # Each decision (an iteration, a branch taken) is recorded with the
        # control's cycles (its predicate broadcast to every tile, the branch).
        trace, info = self.trace, _describe(step)
        if isinstance(step, p.Repeat):
            body, count = self._sequence(step.body), step.count

            def repeat(state):
                for _ in range(count):
                    if _generation[0] != self.started:
                        _check_cancelled(self)
                    if trace is not None:
                        trace.append(info)
                    run(body, state)
            return repeat
        if isinstance(step, p.RepeatWhileTrue):
            cond, body, pred = self._sequence(step.condition), self._sequence(step.body), step.predicate.id

            translation = []           # [fn or None] once tried
            iterations = [0]           # over all runs

            def repeat_while(state):
                if translation and translation[0] is not None:
                    return translation[0](state)
                run(cond, state)
                if trace is not None:
                    trace.append(info)
                while state[pred]:
                    if _generation[0] != self.started:
                        _check_cancelled(self)
                    run(body, state)
                    iterations[0] += 1
                    if lazy and not translation and iterations[0] >= loops.MIN_ITERATIONS:
                        translation.append(self._translated(step))
                        if translation[0] is not None:
                            return translation[0](state)
                    run(cond, state)
                    if trace is not None:
                        trace.append(info)
            return repeat_while
        if isinstance(step, p.If):
            then, other, pred = self._sequence(step.then_body), self._sequence(step.else_body), step.predicate.id

            def if_(state):
                if trace is not None:
                    trace.append(info)
                run(then if state[pred] else other, state)
            return if_
        if isinstance(step, p.Switch):
            cases = {k: self._sequence(v) for k, v in step.cases.items()}
            default, control = self._sequence(step.default), step.control.id

            def switch(state):
                if trace is not None:
                    trace.append(info)
                run(cases.get(int(state[control]), default), state)
            return switch
        raise IpuRuntimeError(f"the IPU Model cannot run a {type(step).__name__} step")

    def _translated(self, step):
        """The loop as one XLA:CPU executable (model/fast/loops.py), or None."""
        fn = loops.translated(step, self.program_refs, self.shapes, _describe, self.stand_ins,
                              frozenset(self.aliases), self.trace, functools.partial(_check_cancelled, self),
                              call_host)
        (self.xla_loops if fn is not None else self.engine_loops).append(p.decision_name(step))
        return fn


def _no_op(state) -> None:
    pass


def _streaming_copy(step: p.StreamingCopy, read):
    """A window of a tensor in streaming memory loaded onto the tiles, or
    stored from them into its place (the tensor's memory, which the
    compiler writes only when nothing else reads it)."""
    bid, shape, tid, tile_shape = step.buffer.tensor.id, step.buffer.shape, step.tile.id, step.tile.shape
    dtype, window = step.tile.dtype, clamped_window(step.starts, step.buffer.shape, step.sizes, read)
    if step.store:
        def store(state):
            buffer = state[bid]
            if buffer is None or not buffer.flags.writeable:   # not yet written (its contents are undefined)
                buffer = np.zeros(shape, dtype) if buffer is None else np.array(buffer)
            buffer = buffer.reshape(shape)
            buffer[window(state)] = state[tid].reshape(step.sizes)
            state[bid] = buffer.reshape(step.buffer.tensor.shape)
        return store

    def load(state):
        buffer = state[bid]
        buffer = np.zeros(shape, dtype) if buffer is None else buffer.reshape(shape)
        state[tid] = np.array(buffer[window(state)]).reshape(tile_shape)
    return load


# The host's side of HostCall steps: fn(callback id, operands, result specs,
# caller) -> results. The front end that registers host callbacks
# (jax_ipu.frontend.callbacks) installs it when the plugin starts.
host_caller: Callable | None = None


def _host_call(step: p.HostCall, read):
    readers = [read(v) for v in step.inputs]
    ids = [t.id for t in step.outputs]

    def host_call(state):
        # The host gets copies: a callback may keep what it is given.
        results = call_host(step, [np.array(r(state)) for r in readers], links.current())
        for tid, value in zip(ids, results, strict=True):
            state[tid] = value
    return host_call


def call_host(step: p.HostCall, operands: list, replica) -> list:
    """The results of a HostCall step given its operands (host copies) on
    `replica` (links.current() of the run): the engine's steps and a loop
    run as an XLA:CPU executable (fast/loops.py) both call the host so."""
    helper.end_session()     # the host may keep us waiting: the helper stops spinning
    if host_caller is None:
        raise IpuRuntimeError("this program calls the host, and no host callbacks are installed")
    specs = [(t.shape, t.dtype) for t in step.outputs]
    if replica.launch is None:
        return host_caller(step.callback_id, operands, specs, None)
    if step.partition is None:   # every IPU of the launch calls the host (pmap, shard_map)
        return host_caller(step.callback_id, operands, specs, (replica.launch, replica.rank, replica.launch.size))
    # One partition calls the host; the others get its results.
    caller = replica.rank - replica.partition + step.partition
    posted = None
    if replica.rank == caller:
        try:
            posted = (True, host_caller(step.callback_id, operands, specs, None))
        except BaseException as exc:   # the other partitions fail with it
            posted = (False, exc)
    try:
        ok, outcome = replica.launch.exchange(replica.rank, posted, lambda slots: slots[caller])
    except IpuReplicaFailed:
        # The others, failing with our error, may abandon the exchange
        # before we leave it: ours is still the error to report.
        if posted is not None and not posted[0]:
            raise posted[1] from None
        raise
    if not ok:
        if replica.rank == caller:
            raise outcome
        raise IpuReplicaFailed(f"the host callback failed on partition {step.partition}: "
                               f"{type(outcome).__name__}: {outcome}")
    return outcome if replica.rank == caller else [np.array(v) for v in outcome]


# Bumped by cancel_runs(): a loop whose run started before stops at its next
# iteration (Ctrl-C stops what runs on the devices, as it stops the host).
_generation = [0]


def cancel_runs() -> None:
    """Cancels the runs in progress on every device at their next loop
    iteration (a step boundary): their outputs fail with IpuRunCancelled.
    Runs started afterwards are not affected."""
    _generation[0] += 1


def _check_cancelled(loaded: _Loaded) -> None:
    if _generation[0] != loaded.started:
        raise IpuRunCancelled(f"the run of {loaded.name} was cancelled (KeyboardInterrupt) at a loop iteration")


def _run_steps(steps, state) -> None:
    for fn in steps:
        fn(state)


# Threads whose numpy ignores floating-point errors for good (device workers).
_QUIET_THREADS: set[int] = set()

try:   # numpy 2: the floating-point error state is a context variable
    from numpy._core._ufunc_config import _extobj_contextvar, _make_extobj

    # _quiet_numpy() ignores floating-point errors on this thread until
    # _restore_numpy(its token): np.errstate without its per-use setup, and
    # no Python call of its own (it is paid on every run).
    _quiet_numpy = functools.partial(_extobj_contextvar.set, _make_extobj(all="ignore"))
    _restore_numpy = _extobj_contextvar.reset
except ImportError:   # pragma: no cover - older numpy
    def _quiet_numpy():
        state = np.errstate(all="ignore")
        state.__enter__()
        return state

    def _restore_numpy(token) -> None:
        token.__exit__(None, None, None)


def quiet_numpy_on_this_thread() -> None:
    """Sets numpy to ignore floating-point errors for good on the calling
    thread (a device worker, which runs nothing but programs): runs on it
    then skip entering np.errstate each time. The IPU's arithmetic does not
    trap, so nor does the Model's."""
    np.seterr(all="ignore")
    _QUIET_THREADS.add(threading.get_ident())


def forget_quiet_thread() -> None:
    """A quiet thread's end (its ident may be reused by another thread)."""
    _QUIET_THREADS.discard(threading.get_ident())


class Engine:
    """One per device."""

    def __init__(self, target: Target, fast: bool = True):
        """fast=False: every kernel on its reference executor, every step
        as the program says (model/registry.py)."""
        self.target = target
        self.fast = fast
        self.last_run: RunRecord | None = None
        # Loaded programs by id(program), each entry dropped when its program
        # dies (before the id can be reused): a plain dict is read on every run.
        self._loaded: dict[int, _Loaded] = {}

    def load(self, program: Program) -> _Loaded:
        if (program.target_name, program.num_tiles) != (self.target.name, self.target.num_tiles):
            raise IpuRuntimeError(f"program {program.name} was compiled for {program.target_name} with "
                                  f"{program.num_tiles} tiles, not for this {self.target.describe()}")
        loaded = self._loaded.get(id(program))
        if loaded is None:
            loaded = self._loaded[id(program)] = _Loaded(program, self.fast)
            weakref.finalize(program, self._loaded.pop, id(program), None)
        return loaded

    def run(self, program: Program, inputs: list[np.ndarray], donated=frozenset(),
            checked: bool = True) -> list[np.ndarray]:
        """Runs the program; `checked=False` when the caller has already
        checked the inputs against the program's (the device's runs)."""
        loaded = self._loaded.get(id(program)) or self.load(program)
        if not checked and loaded.straight is not None:   # the common case, lean
            alias = loaded.donated_aliases(inputs, donated) if donated else ()
            token = None if get_ident() in _QUIET_THREADS else _quiet_numpy()
            try:
                results = loaded.straight(inputs, alias)
            finally:
                if loaded.may_share:
                    loaded.shares = helper.end_session()
                if token is not None:
                    _restore_numpy(token)
            if loaded.timed_runs:
                loaded.timed_run_done()
            self.last_run = loaded.static_record
            return results
        state = loaded.template.copy()
        if checked:
            if len(inputs) != len(loaded.inputs):
                raise IpuRuntimeError(f"program {program.name} takes {len(loaded.inputs)} inputs, "
                                      f"got {len(inputs)}")
            for i, ((tid, shape, dtype), array) in enumerate(zip(loaded.inputs, inputs, strict=True)):
                if type(array) is not np.ndarray or array.dtype != dtype or array.shape != shape:
                    raise IpuRuntimeError(
                        f"input {i} of {program.name}: expected {dtype.name}{list(shape)}, got "
                        f"{getattr(array, 'dtype', type(array).__name__)}{list(getattr(array, 'shape', ()))}")
                state[tid] = array
        else:
            for tid, array in zip(loaded.input_ids, inputs, strict=True):
                state[tid] = array
        if donated:
            for output_id, input_id in loaded.donated_aliases(inputs, donated):
                state[output_id] = state[input_id]
        if loaded.trace is not None:
            loaded.trace.clear()
        loaded.started = _generation[0]
        if loaded.shares:
            helper.begin_session()
        token = None if get_ident() in _QUIET_THREADS else _quiet_numpy()
        try:
            for fn in loaded.steps:
                fn(state)
        finally:
            loaded.shares = helper.end_session()
            if token is not None:
                _restore_numpy(token)
        self.last_run = loaded.static_record or RunRecord(list(loaded.trace))
        return [np.array(get(state)) if copy else get(state) for get, copy in loaded.outputs]
