"""The IPU Model's engine: runs a compiled graph.Program on one device.

Loading a Program turns its tree into a list of closures once (kept per
Program); a run binds the inputs, calls the closures and collects the
outputs, and records the steps' estimated cycles and exchanged bytes."""
from __future__ import annotations

import bisect
import collections
import dataclasses
import threading
import time
import weakref
from threading import get_ident
from collections.abc import Callable

import numpy as np

from jax_ipu.errors import IpuRunCancelled, IpuRuntimeError
from jax_ipu.graph import codelets
from jax_ipu.graph import programs as p
from jax_ipu.graph.program import Program
from jax_ipu.graph.tensors import Tensor
from jax_ipu.graph.views import REARRANGING, Concat, View
from jax_ipu.model import executors, links
from jax_ipu.model.executors.common import reader
from jax_ipu.model.executors.indexing import clamped_window
from jax_ipu.model.fast import helper, lanes
from jax_ipu.model.fast.xla_chains import aligned_copy
from jax_ipu.targets import Target


@dataclasses.dataclass
class RunRecord:
    """What one run did, for profiles: (kind, name, cycles, exchange bytes)
    per executed step, in order."""
    steps: list[tuple[str, str, int, int]]

    @property
    def cycles(self) -> int:
        return sum(s[2] for s in self.steps)

    @property
    def compute_sets(self) -> list[str]:
        return [s[1] for s in self.steps if s[0] == "Execute"]

    @property
    def exchange_bytes(self) -> int:
        return sum(s[3] for s in self.steps)


def _describe(step) -> tuple[str, str, int, int]:
    if isinstance(step, p.Execute):
        return ("Execute", step.compute_set.name, step.cycles, step.exchange_bytes)
    if isinstance(step, p.Copy):
        return ("Copy", step.dst.name, step.cycles, step.exchange_bytes)
    if isinstance(step, p.HostCall):
        return ("HostCall", f"host callback {step.callback_id} {step.name}".rstrip(), step.cycles, 0)
    if isinstance(step, p.StreamingCopy):
        return ("Copy", step.name, step.cycles, 0)
    return (type(step).__name__, str(step.index), step.cycles, 0)


def _tensor_ids(obj, found: list) -> list:
    """Ids of the tensors `obj` (a step, kernel, view, ...) refers to, once per mention."""
    if isinstance(obj, Tensor):
        found.append(obj.id)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for field in dataclasses.fields(obj):
            _tensor_ids(getattr(obj, field.name), found)
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            _tensor_ids(item, found)
    elif isinstance(obj, dict):
        for item in obj.values():
            _tensor_ids(item, found)
    return found


def _scratch_partials(program: Program) -> set[int]:
    """Matmul partials that only the matmul's own reductions read (sums over
    the chunks, which take them combined) and the run does not return:
    their buffers may serve every run."""
    partials, other = set(), []
    for step in p.leaves(program.body):
        kernel = step.compute_set.kernel if isinstance(step, p.Execute) else step
        if isinstance(kernel, codelets.MatMulPartials):
            partials.add(kernel.out.id)
            _tensor_ids((kernel.lhs, kernel.rhs), other)
        elif isinstance(kernel, codelets.ReduceCombine) and executors.reduce.takes_combined(kernel):
            _tensor_ids((kernel.init, kernel.out), other)
        else:
            _tensor_ids(kernel, other)
    if not partials:
        return set()
    for ctl in _controls(program.body):
        _tensor_ids([getattr(ctl, f) for f in ("predicate", "control") if hasattr(ctl, f)], other)
    _tensor_ids(program.outputs, other)
    _tensor_ids(program.inputs, other)
    return partials - set(other)


# Whether the engine skips the host side of Copies their readers can read
# through views (lazy_copies); off only to measure what that saves.
LAZY_COPIES = True
# Whether a straight-line run drops each intermediate after the last step
# that refers to it (the host holds the live values, not every value the
# program ever made); off only to measure what that saves.
FREE_DEAD = True
# Whether independent compute sets next to each other run as two lanes
# (model/lanes.py); off only to measure what that saves.
LANES = True
# Kernels that read their operands through views (numpy or BLAS takes the
# strides as they come), with the fields they read and the fields they write.
_VIEW_READERS = {
    codelets.ElementwiseChain: (("inputs",), lambda k: [t for _, t in k.outputs]),
    codelets.MatMulPartials: (("lhs", "rhs"), lambda k: [k.out]),
}


def _compose(view, lazy: dict):
    """`view` of a lazy Copy's destination as a view of the Copy's source."""
    if isinstance(view, Concat):
        return Concat(tuple(_compose(part, lazy) for part in view.parts), view.axis)
    src = lazy.get(view.tensor.id)
    if src is None:
        return view
    ops = src.ops if src.shape == view.tensor.shape else src.ops + (("reshape", view.tensor.shape),)
    return View(src.tensor, ops + view.ops)


def _read_views(step) -> list | None:
    """The views a step reads through the engine's readers, or None when
    the step is not one whose reads may be redirected (it may also read
    tensors otherwise, or write in place)."""
    if isinstance(step, p.Copy):
        return [step.src] if isinstance(step.src, View) else None
    if isinstance(step, p.Execute):
        kernel = step.compute_set.kernel
        fields = _VIEW_READERS.get(type(kernel))
        if fields is None:
            return None
        found = []
        for name in fields[0]:
            value = getattr(kernel, name)
            found += [v for v in (value if isinstance(value, tuple) else (value,)) if isinstance(v, View)]
        return found
    return None


def _written(step) -> set | None:
    """Tensors a redirectable step writes (None: any it refers to)."""
    if isinstance(step, p.Copy):
        return {step.dst.id}
    if isinstance(step, p.Execute) and type(step.compute_set.kernel) in _VIEW_READERS:
        kernel = step.compute_set.kernel
        return {t.id for t in _VIEW_READERS[type(kernel)][1](kernel)}
    return None


def _refs(step, found: list) -> list:
    """Ids of the tensors a step's kernels (not its vertices' regions)
    refer to, once per mention; control steps with their bodies."""
    if isinstance(step, p.CONTROL):
        _tensor_ids([getattr(step, f) for f in ("predicate", "control") if hasattr(step, f)], found)
        for child in p.children(step):
            _refs(child, found)
    elif isinstance(step, p.Execute):
        _tensor_ids(step.compute_set.kernel, found)
    else:
        _tensor_ids(step, found)
    return found


def donation_aliases(program: Program) -> collections.defaultdict:
    """{tensor id: ids of the tensors sharing its memory}: a donated input's
    memory is also its output's, so writes to either count for both."""
    aliases = collections.defaultdict(set)
    for o, i in program.in_place.items():
        aliases[program.inputs[i].id].add(program.outputs[o].tensor.id)
        aliases[program.outputs[o].tensor.id].add(program.inputs[i].id)
    return aliases


def lazy_copies(program: Program) -> dict:
    """{destination tensor id: source view} of the Copies the engine need
    not make on the host: a layout change (transpose, broadcast, slice...)
    whose destination is read, later in the same sequence, only by kernels
    that read views (element-wise chains, matmul operands, Copies), while
    nothing writes its source. Those kernels read the source through the
    composed view instead, as Poplar's vertices read rearranged elements
    straight from exchange: the same values, the planned exchange and
    cycles unchanged, one host copy fewer."""
    refs = collections.Counter(_tensor_ids(program.outputs, []))
    refs.update(_tensor_ids(program.inputs, []))
    refs.update(_refs(program.body, []))
    aliases = donation_aliases(program)
    lazy: dict = {}

    def sequence(steps) -> None:
        # Where each tensor is read through views, and written, in this
        # sequence (positions ascending, a read once per view): each Copy
        # then finds its readers and hazards by bisection, not by scanning
        # every later step (quadratic in long unrolled programs).
        read_at: dict[int, list] = collections.defaultdict(list)
        written_at: dict[int, list] = collections.defaultdict(list)
        for j, step in enumerate(steps):
            for v in _read_views(step) or ():
                read_at[v.tensor.id].append(j)
            found = _written(step)
            for t in (found if found is not None else set(_refs(step, []))):
                written_at[t].append(j)

        def written_between(t: int, i: int, last: int) -> bool:
            """Whether a step in (i, last] writes tensor t."""
            at = written_at.get(t, ())
            return bisect.bisect_right(at, i) < bisect.bisect_right(at, last)

        for i, step in enumerate(steps):
            if isinstance(step, p.CONTROL):
                if isinstance(step, p.Sequence):
                    sequence(step.steps)
                else:
                    for child in p.children(step):
                        sequence(child.steps)
                continue
            if not isinstance(step, p.Copy) or not isinstance(step.src, View) or step.src.is_whole_tensor:
                continue
            d, src = step.dst.id, _compose(step.src, lazy)
            if src.tensor.id == d:
                continue
            at = read_at.get(d, ())
            readers = len(at) - bisect.bisect_right(at, i)
            # Every other mention of the destination is one of these reads.
            if not readers or refs[d] != 1 + readers:
                continue
            if any(op[0] in REARRANGING for op in src.ops) and readers > 1:
                continue       # gathered (or windowed) once, not once per reader
            sources = {src.tensor.id} | aliases[src.tensor.id]
            if not any(written_between(t, i, at[-1]) for t in sources):
                lazy[d] = src

    sequence(program.body.steps)
    return lazy


def _controls(step):
    if isinstance(step, p.CONTROL):
        yield step
        for child in p.children(step):
            yield from _controls(child)


class _Loaded:
    """A Program made ready to run: closures, storage template, checks."""

    def __init__(self, program: Program):
        self.template: list = [t.constant for t in program.tensors]
        self.started = 0      # cancel_runs' generation when the last run began
        self.scratch = _scratch_partials(program)
        self.lazy = lazy_copies(program) if LAZY_COPIES else {}
        self.has_control = any(isinstance(s, p.CONTROL) for s in program.body.steps)
        self.aliases = donation_aliases(program)
        self.trace: list | None = [] if self.has_control else None
        covers: list = []
        self.steps = self._sequence(program.body, covers)
        self.dead = self._dead_after(program, covers) if FREE_DEAD and not self.has_control else None
        self.inputs = [(t.id, tuple(t.shape), t.dtype) for t in program.inputs]
        self.input_ids = [t.id for t in program.inputs]
        owned_elsewhere = {t.id for t in program.inputs} | {t.id for t in program.tensors
                                                             if t.constant is not None}
        self.outputs = []
        for view in program.outputs:
            copy = view.tensor.id in owned_elsewhere or not view.is_whole_tensor
            owned_elsewhere.add(view.tensor.id)
            self.outputs.append((reader(view), copy))
        self.in_place = [(i, program.inputs[i].id, program.outputs[o].tensor.id)
                         for o, i in program.in_place.items()]
        self.static_record = None if self.has_control else RunRecord(
            [_describe(s) for s in p.leaves(program.body)
             if not isinstance(s, (p.HostToDevice, p.DeviceToHost))])
        self.name, self.output_views = program.name, program.outputs
        # A straight-line program's first runs time its steps (step_us, the
        # fastest run's), then it runs with the helper's schedule made of them.
        self.timed_runs = 0 if self.has_control or not any(getattr(f, "shares", False) for f in self.steps) \
            else TIMED_RUNS
        self.step_us = [float("inf")] * len(self.steps)
        self.straight = None if self.has_control else self._straight_line(timed=self.timed_runs > 0)
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
            self.straight = self._straight_line(timed=False)

    def _straight_line(self, timed: bool = False):
        """fn(inputs) -> outputs for a program without control flow: the
        steps called one after the other in one generated function (small
        programs run on every call, where the loops of run() show). timed:
        each step's time kept in step_us; else the helper thread is woken
        and let sleep as _helper_schedule says from step_us."""
        env = {"template": self.template, "np": np, "wake": helper.begin_session, "rest": helper.end_session,
               "clock": time.perf_counter, "took": self.step_us}
        lines = ["def run(inputs, alias=()):", "    state = template.copy()"]
        lines += [f"    state[{tid}] = inputs[{i}]" for i, tid in enumerate(self.input_ids)]
        lines += ["    for o, i in alias:", "        state[o] = state[i]"]    # donated buffers, written in place
        wake, rest = (set(), set()) if timed else _helper_schedule(self.steps, self.step_us)
        if timed:
            lines.append("    t = clock()")
        for i, fn in enumerate(self.steps):
            env[f"s{i}"] = fn
            if i in wake:
                lines.append("    wake()")
            lines.append(f"    s{i}(state)")
            if self.dead is not None and self.dead[i]:
                lines.append("    " + " = ".join(f"state[{t}]" for t in self.dead[i]) + " = None")
            if timed:
                lines.append(f"    u = clock(); took[{i}] = min(took[{i}], (u - t) * 1e6); t = u")
            if i in rest:
                lines.append("    rest()")
        results = []
        for j, (view, (get, copy)) in enumerate(zip(self.output_views, self.outputs)):
            if view.is_whole_tensor and view.shape == view.tensor.shape:
                value = f"state[{view.tensor.id}]"
            else:
                env[f"g{j}"] = get
                value = f"g{j}(state)"
            results.append(f"np.array({value})" if copy else value)
        lines.append(f"    return [{', '.join(results)}]")
        exec(compile("\n".join(lines), f"<program {self.name}>", "exec"), env)
        return env["run"]

    def _sequence(self, seq: p.Sequence, covers: list | None = None) -> list:
        """The functions running `seq`'s steps; `covers` (if given) gets,
        per function, the steps it runs."""
        covers = [] if covers is None else covers
        if not LANES:
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
        found = lanes.units(steps, [self._kernel(s) for s in steps], _tensor_ids, self.aliases)
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

    def _dead_after(self, program: Program, covers: list) -> list:
        """Per top-level function, the tensors no later function refers to
        (through lazy Copies' sources too) and the run does not return."""
        returned = set()
        for t in _tensor_ids(program.outputs, []):
            returned.add(t)
            returned.update(_tensor_ids(self.lazy.get(t), []))
        last = {}
        for j, steps in enumerate(covers):
            for s in steps:
                for t in _refs(s, []):
                    last[t] = j
                    if t in self.lazy:
                        for u in _tensor_ids(self.lazy[t], []):
                            last[u] = j
        dead = [[] for _ in covers]
        for t, j in last.items():
            if t not in returned:
                dead[j].append(t)
        return dead

    def _lanes(self, pair: tuple, lead: dict, order: dict):
        """One step running two lanes of independent compute sets, the
        second on the helper thread when a core is free. A traced run
        records their steps in program order first."""
        first, second = ([self._leaf(step, whole=True) for u in lane for step in u.steps] for lane in pair)

        def run_lanes(state):
            helper.run_lanes(lambda: _run_steps(first, state), lambda: _run_steps(second, state))
        if self.trace is not None:
            units = sorted(pair[0] + pair[1], key=lambda u: order[id(u)])
            infos = [_describe(s) for u in units for step in u.steps for s in lead[id(step)] + [step]]
            trace, run = self.trace, run_lanes

            def run_lanes(state):
                trace.extend(infos)
                run(state)
        run_lanes.shares = True
        return run_lanes

    def _kernel(self, step):
        """The kernel the engine runs for an Execute step (reading lazy
        Copies' sources), else None."""
        if not isinstance(step, p.Execute):
            return None
        kernel = step.compute_set.kernel
        if self.lazy and type(kernel) in _VIEW_READERS:
            kernel = self._redirected(kernel)
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
            kernel = self._kernel(step)
            return executors.build(kernel, scratch=getattr(getattr(kernel, "out", None), "id", None) in self.scratch,
                                 whole=whole)
        if isinstance(step, p.Copy):
            if step.dst.id in self.lazy:
                # Its readers read its source (a no-op keeps it in the trace).
                return _no_op if self.trace is not None else None
            src, tid, dtype, shape = _compose(step.src, self.lazy), step.dst.id, step.dst.dtype, step.dst.shape
            # A transposing copy keeps its source's layout (a plain memory
            # copy); a broadcast is laid out in order, not by its zero strides.
            order = "C" if any(op[0] == "broadcast" for op in getattr(src, "ops", ())) else "K"
            if isinstance(src, View) and src.is_whole_tensor:     # e.g. a loop's carried values
                sid = src.tensor.id

                def copy_whole(state):
                    # Aligned, so that element-wise chains read it in place.
                    state[tid] = aligned_copy(np.asarray(state[sid], dtype=dtype)).reshape(shape)
                return copy_whole

            def copy(state):
                state[tid] = np.array(src.apply(lambda t: state[t.id]), dtype=dtype, order=order).reshape(shape)
            return copy
        if isinstance(step, p.HostCall):
            return _host_call(step)
        if isinstance(step, p.StreamingCopy):
            return _streaming_copy(step)
        return None   # host streams: run() binds inputs and collects outputs

    def _redirected(self, kernel):
        """The kernel reading lazy Copies' sources instead of their destinations."""
        changes = {}
        for name in _VIEW_READERS[type(kernel)][0]:
            value = getattr(kernel, name)
            if isinstance(value, tuple):
                changes[name] = tuple(_compose(v, self.lazy) if isinstance(v, View) else v for v in value)
            else:
                changes[name] = _compose(value, self.lazy)
        return dataclasses.replace(kernel, **changes)

    def _control(self, step):
        run = _run_steps
        if isinstance(step, p.Sequence):
            body = self._sequence(step)
            return lambda state: run(body, state)
        if isinstance(step, p.Call):
            body = self._sequence(step.function)
            return lambda state: run(body, state)
        if isinstance(step, p.Repeat):
            body, count = self._sequence(step.body), step.count

            def repeat(state):
                for _ in range(count):
                    if _generation[0] != self.started:
                        _check_cancelled(self)
                    run(body, state)
            return repeat
        if isinstance(step, p.RepeatWhileTrue):
            cond, body, pred = self._sequence(step.condition), self._sequence(step.body), step.predicate.id

            def repeat_while(state):
                run(cond, state)
                while state[pred]:
                    if _generation[0] != self.started:
                        _check_cancelled(self)
                    run(body, state)
                    run(cond, state)
            return repeat_while
        if isinstance(step, p.If):
            then, other, pred = self._sequence(step.then_body), self._sequence(step.else_body), step.predicate.id
            return lambda state: run(then if state[pred] else other, state)
        if isinstance(step, p.Switch):
            cases = {k: self._sequence(v) for k, v in step.cases.items()}
            default, control = self._sequence(step.default), step.control.id
            return lambda state: run(cases.get(int(state[control]), default), state)
        raise IpuRuntimeError(f"the IPU Model cannot run a {type(step).__name__} step")


def _no_op(state) -> None:
    pass


def _streaming_copy(step: p.StreamingCopy):
    """A window of a tensor in streaming memory loaded onto the tiles, or
    stored from them into its place (the tensor's memory, which the
    compiler writes only when nothing else reads it)."""
    bid, shape, tid, tile_shape = step.buffer.tensor.id, step.buffer.shape, step.tile.id, step.tile.shape
    dtype, window = step.tile.dtype, clamped_window(step.starts, step.buffer.shape, step.sizes)
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


# The helper thread, asleep, takes about 100 us to wake: a straight-line
# program wakes it this long (as its steps took) before a step that shares
# work...
PREWAKE_US = 150.0
# ... and lets it sleep through stretches without shared work at least this
# long: a spinning helper slows the caller's own work by ~10% on these VMs
# (the cores share more than they show), which over such a stretch costs
# more than waking it again (100-200 us with its first hand-off). An MLP
# training step, whose 1.1-1.7 ms stretch it now spins through, ran 1-2%
# faster than with 400 us (about as fast as spinning throughout).
IDLE_US = 2000.0
# Runs of a straight-line program whose steps are timed (the fastest of
# them counts) before its helper schedule is made.
TIMED_RUNS = 2


def _helper_schedule(fns: list, est: list) -> tuple[set, set]:
    """(positions before which the helper is woken, positions after which
    it goes back to sleep) in a straight-line program's steps, est[i] the
    microseconds step i took: it spins only around the steps that share
    work (fn.shares)."""
    shares = [i for i, fn in enumerate(fns) if getattr(fn, "shares", False)]
    wake, rest = set(), set()
    previous = -1
    for j in shares:
        if previous >= 0 and sum(est[previous + 1:j]) < IDLE_US:
            previous = j
            continue          # it keeps spinning through a short stretch
        if previous >= 0:
            rest.add(previous)
        k, ahead = j, 0.0
        while k > previous + 1 and ahead < PREWAKE_US:
            k -= 1
            ahead += est[k]
        wake.add(k)
        previous = j
    if previous >= 0:
        rest.add(previous)
    return wake, rest


# The host's side of HostCall steps: fn(callback id, operands, result specs,
# caller) -> results. The front end that registers host callbacks
# (jax_ipu.callbacks) installs it when the plugin starts.
host_caller: Callable | None = None


def _host_call(step: p.HostCall):
    readers = [reader(v) for v in step.inputs]
    specs = [(t.shape, t.dtype) for t in step.outputs]
    ids = [t.id for t in step.outputs]

    def call(state, caller=None):
        # The host gets copies: a callback may keep what it is given.
        if host_caller is None:
            raise IpuRuntimeError("this program calls the host, and no host callbacks are installed")
        return host_caller(step.callback_id, [np.array(r(state)) for r in readers], specs, caller)

    def host_call(state):
        helper.end_session()     # the host may keep us waiting: the helper stops spinning
        replica = links.current()
        if replica.launch is None:
            results = call(state)
        elif step.partition is None:   # every IPU of the launch calls the host (pmap, shard_map)
            results = call(state, (replica.launch, replica.rank, replica.launch.size))
        else:                    # one partition calls the host; the others get its results
            caller = replica.rank - replica.partition + step.partition
            posted = None
            if replica.rank == caller:
                try:
                    posted = (True, call(state))
                except BaseException as exc:   # the other partitions fail with it
                    posted = (False, exc)
            ok, outcome = replica.launch.exchange(replica.rank, posted, lambda slots: slots[caller])
            if not ok:
                if replica.rank == caller:
                    raise outcome
                raise IpuRuntimeError(f"the host callback failed on partition {step.partition}: "
                                      f"{type(outcome).__name__}: {outcome}")
            results = outcome if replica.rank == caller else [np.array(v) for v in outcome]
        for tid, value in zip(ids, results):
            state[tid] = value
    return host_call


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
    _QUIET = _make_extobj(all="ignore")

    def _quiet_numpy():
        """Ignores floating-point errors on this thread until _restore_numpy
        (np.errstate, without its per-use setup: it is paid on every run)."""
        return _extobj_contextvar.set(_QUIET)

    def _restore_numpy(token) -> None:
        _extobj_contextvar.reset(token)
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

    def __init__(self, target: Target):
        self.target = target
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
            loaded = self._loaded[id(program)] = _Loaded(program)
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
            for i, ((tid, shape, dtype), array) in enumerate(zip(loaded.inputs, inputs)):
                if type(array) is not np.ndarray or array.dtype != dtype or array.shape != shape:
                    raise IpuRuntimeError(
                        f"input {i} of {program.name}: expected {dtype.name}{list(shape)}, got "
                        f"{getattr(array, 'dtype', type(array).__name__)}{list(getattr(array, 'shape', ()))}")
                state[tid] = array
        else:
            for tid, array in zip(loaded.input_ids, inputs):
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
