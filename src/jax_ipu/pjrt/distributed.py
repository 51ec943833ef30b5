"""Several processes (jax.distributed): the IPUs of every process, and the
transport that carries collectives between processes.

Each process models its own JAX_IPU_DEVICE_COUNT IPUs. At client creation
the processes swap descriptions of their IPUs through the key-value store
JAX hands the plugin (as the CUDA plugin swaps its local topologies), so
that every process lists every IPU with a unique id and its process index.

Collectives between IPUs of one process stay in model.links. Between
processes, the contributions of a process's IPUs travel over Gloo (TCP),
the collective library JAX's own CPU backend uses between processes: each
exchange is an all_gather of bytes run by that backend across its
processes, which rendezvoused through the same key-value store when
jax.distributed started it. docs/multi-ipu.md says why Gloo and not MPI.

Every exchange first swaps a header (the program, the collective's number
in the run, the contribution's dtype and shape), so that processes running
different programs fail naming both instead of mixing data; launches that
span processes take turns in the order they were launched, the same order
in every process (JAX's multi-controller contract), so that two of them
never meet in opposite orders.

A process whose own run fails (or whose Python exits) while the others
may still wait for it in an exchange says so in the key-value store
(`stopped/<process>`: how many exchanges it entered, and why); a process
waiting in an exchange looks for such records while the transport waits,
and fails naming the process that stopped and its reason instead of
waiting for the collective timeout.
"""
from __future__ import annotations

import atexit
import json
import queue
import threading
import time

import numpy as np

from jax_ipu.errors import IpuError, IpuInvalidArgument, IpuRuntimeError
from jax_ipu.profile.breakdown import no_exchanges

# How long a process waits for the others to describe their IPUs.
TOPOLOGY_TIMEOUT_SECONDS = 300.0
# A header's fixed size: what every process sends first at an exchange.
HEADER_BYTES = 1024
# Seconds an exchange waits before it first looks for a stopped process,
# and between looks: exchanges normally end within milliseconds.
FIRST_LOOK_SECONDS = 0.05
LOOK_EVERY_SECONDS = 0.1
# At exit, how long to wait for a transport call given up on to end.
EXIT_WAIT_SECONDS = 30.0
# PJRT_ProcessState of UpdateGlobalProcessInfo (pjrt_c_api.h).
_STATES = {0: "unspecified", 1: "uninitialized", 2: "disconnected", 3: "connected", 4: "error"}


class KeyValueError(IpuRuntimeError):
    """A get or put on jax.distributed's key-value store failed."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


def describe_local(config, target) -> dict:
    """What the other processes must agree on, and what names this one."""
    import os
    import socket
    return {"device_count": config.device_count, "target": target.name, "num_tiles": target.num_tiles,
            "host": socket.gethostname(), "pid": os.getpid()}


def exchange_topology(store, process_index: int, process_count: int, mine: dict,
                      timeout: float = TOPOLOGY_TIMEOUT_SECONDS) -> list[dict]:
    """Every process's description, by process index; refuses processes
    that model different IPUs (their counts, targets or tile counts),
    naming both."""
    store.put(f"topology/{process_index}", json.dumps(mine))
    described = []
    for p in range(process_count):
        if p == process_index:
            described.append(mine)
            continue
        try:
            described.append(json.loads(store.get(f"topology/{p}", timeout)))
        except KeyValueError as exc:
            raise IpuRuntimeError(
                f"process {process_index} waited {timeout:.0f} s for process {p} to describe its IPUs ({exc}). "
                "Start every process with jax.distributed.initialize(...) before its first JAX call, and "
                "check num_processes") from None
    for p, theirs in enumerate(described):
        for key, setting in (("device_count", "JAX_IPU_DEVICE_COUNT"), ("target", "JAX_IPU_TARGET"),
                             ("num_tiles", "JAX_IPU_MODEL_NUM_TILES")):
            if theirs[key] != mine[key]:
                raise IpuInvalidArgument(
                    f"process {p} ({theirs['host']}, pid {theirs['pid']}) models {key} = {theirs[key]} but "
                    f"process {process_index} ({mine['host']}, pid {mine['pid']}) models {mine[key]}: every "
                    f"process must model the same IPUs; set {setting} alike in all of them")
    return described


class Processes:
    """This process among the others: the store, the transport (made at the
    first exchange), the turns of launches spanning processes, and what the
    framework reports of the other processes."""

    def __init__(self, store, process_index: int, process_count: int, devices_per_process: int,
                 timeout: float):
        self.store = store
        self.index = process_index
        self.count = process_count
        self.devices_per_process = devices_per_process
        self.timeout = timeout
        self._transport = None
        self._transport_lock = threading.Lock()
        self._turn = threading.Condition()
        self._next_ticket = 0         # handed to launches spanning processes, in launch order
        self._serving = 0             # the ticket whose exchanges may run now
        self._ended: set[int] = set()
        self.lost: str | None = None  # why the processes are out of step, once they are
        self.stats = no_exchanges()
        # Exchanges entered so far (the same sequence in every process), and
        # whether this process has said it stopped; under _entering.
        self._entering = threading.Lock()
        self.entered = 0
        self._stopped = False
        self._runner: _Runner | None = None
        self._abandoned: _Job | None = None   # a transport call given up on
        atexit.register(self._at_exit)

    def process_of(self, device_id: int) -> int:
        return device_id // self.devices_per_process

    # -- what the framework tells of the others (PJRT_Client_UpdateGlobalProcessInfo) --
    def update(self, infos: list[tuple[int, int, int, str]]) -> None:
        for task, state, _, message in infos:
            if task != self.index and _STATES.get(state) in ("disconnected", "error"):
                why = f"process {task} is {_STATES[state]} (jax.distributed's coordination service"
                self.lose(why + (f": {message})" if message else ")"))

    def lose(self, why: str) -> None:
        with self._turn:
            if self.lost is None:
                self.lost = why
            self._turn.notify_all()

    # -- this process stopping on its own --
    def stop(self, why: str) -> None:
        """This process will take part in no further exchange (its own run
        failed, or it is exiting): tells the others, through the key-value
        store, after how many exchanges, so that one waiting for it in a
        later exchange fails now. Nothing when the processes are already
        out of step for another reason (that one was told)."""
        with self._entering:
            if self._stopped or self.lost is not None:
                return
            self._stopped = True
            entered = self.entered
            self.lose(f"this process stopped taking part in collectives between processes ({why})")
        try:
            self.store.put(f"stopped/{self.index}", json.dumps({"exchanges": entered, "why": why}))
        except Exception:    # the store is gone (jax.distributed shut down): nobody is left to tell
            pass

    def _at_exit(self) -> None:
        self.stop("its Python interpreter exited")
        job = self._abandoned
        if job is not None and not job.done.is_set():
            # A transport call given up on still waits for a process that
            # stopped. It ends (an error) when that process exits, which it
            # does once every process has reached jax.distributed's shutdown
            # barrier: reach it now, not after JAX's own exit handler has
            # cleared the backends, so that the call ends while the
            # interpreter is whole (a thread coming back into a finalizing
            # interpreter aborts the process).
            try:
                import jax
                jax.distributed.shutdown()
            except Exception:
                pass
            job.done.wait(EXIT_WAIT_SECONDS)

    def _stopped_peer(self, number: int) -> str | None:
        """Why a process that will not take part in exchange `number` stopped."""
        for p in range(self.count):
            if p == self.index:
                continue
            record = _peek(self.store, f"stopped/{p}")
            if record is not None:
                record = json.loads(record)
                if record["exchanges"] <= number:
                    return (f"process {p} stopped after {record['exchanges']} exchange(s) between processes "
                            f"({record['why']}), and this is exchange {number + 1}")
        return None

    # -- turns --
    def ticket(self) -> int:
        with self._turn:
            self._next_ticket += 1
            return self._next_ticket - 1

    def wait_turn(self, ticket: int, what: str) -> None:
        deadline = time.monotonic() + self.timeout
        with self._turn:
            while self._serving != ticket and self.lost is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise IpuRuntimeError(
                        f"{what} waited {self.timeout:.0f} s for the programs launched before it on IPUs of "
                        "several processes (JAX_IPU_COLLECTIVE_TIMEOUT)")
                self._turn.wait(min(left, 1.0))
            if self.lost is not None:
                raise IpuRuntimeError(f"{what}: {self.lost}")

    def done(self, ticket: int) -> None:
        """The launch holding `ticket` has ended: once all before it have,
        the next one may exchange."""
        with self._turn:
            self._ended.add(ticket)
            while self._serving in self._ended:
                self._ended.remove(self._serving)
                self._serving += 1
            self._turn.notify_all()

    # -- the transport --
    def transport(self):
        with self._transport_lock:
            if self._transport is None:
                self._transport = GlooOverCpuBackend(self.index, self.count, self.timeout)
            return self._transport

    def exchange(self, header: dict, payload: bytes, what: str, counts: dict | None = None
                 ) -> list[tuple[dict, bytes]]:
        """Every process's (header, payload), by process index. Headers
        that differ in anything but the payload's size are refused, naming
        both processes' programs. The bytes sent and received, and the
        seconds, are added to `stats` and to `counts` (one launch's)."""
        with self._entering:
            if self.lost is not None:
                raise IpuRuntimeError(f"{what}: {self.lost}")
            number = self.entered
            self.entered += 1
            if self._runner is None:
                self._runner = _Runner()
        began = time.perf_counter()
        header = dict(header, nbytes=len(payload))
        text = json.dumps(header, sort_keys=True).encode()
        if len(text) > HEADER_BYTES:
            text = json.dumps(dict(header, program=header["program"][:200]), sort_keys=True).encode()
        transport = self.transport()

        def swap():
            rows = transport.all_gather(np.frombuffer(text.ljust(HEADER_BYTES, b" "), np.uint8))
            headers = [json.loads(bytes(row).decode()) for row in rows]
            _check_alike(headers, self.index)
            width = max(h["nbytes"] for h in headers)
            data = np.zeros(width, np.uint8)
            data[:len(payload)] = np.frombuffer(payload, np.uint8)
            return headers, (transport.all_gather(data) if width else np.zeros((self.count, 0), np.uint8))

        try:
            headers, rows = self._wait(self._runner.run(swap), number, what)
        except IpuError:
            raise
        except Exception as exc:   # the transport's own failure: a peer gone, a timeout
            why = self.lost or f"{type(exc).__name__}: {exc}"
            self.lose(f"the transport between processes failed ({why})")
            raise IpuRuntimeError(f"{what}: collective between processes failed: {why}") from None
        received = sum(h["nbytes"] for h in headers) - len(payload)
        for c in (self.stats, counts) if counts is not None else (self.stats,):
            c["exchanges"] += 1
            c["bytes_sent"] += len(payload)
            c["bytes_received"] += received
            c["seconds"] += time.perf_counter() - began
        return [(h, bytes(rows[p][:h["nbytes"]])) for p, h in enumerate(headers)]

    def _wait(self, job: _Job, number: int, what: str):
        """The job's result; while it waits, looks for processes that will
        not come (a stopped record, or the framework's report of a process
        gone), and then gives up on it: the transport is left to the job."""
        wait = FIRST_LOOK_SECONDS
        while not job.done.wait(wait):
            wait = LOOK_EVERY_SECONDS
            why = self.lost or self._stopped_peer(number)
            if why is not None and not job.done.is_set():
                self._abandoned = job
                self.lose(why)
                raise IpuRuntimeError(f"{what}: collective between processes abandoned: {why}. A failure in "
                                      "one process stops the collectives of all of them: restart every process")
        return job.result()


def _peek(store, key: str):
    try:
        return store.try_get(key)
    except NotImplementedError:   # a jaxlib without kv_try_get
        try:
            return store.get(key, 0.001)
        except KeyValueError:
            return None


class _Job:
    def __init__(self, fn):
        self.fn = fn
        self.done = threading.Event()
        self.value = self.error = None

    def result(self):
        if self.error is not None:
            raise self.error
        return self.value


class _Runner:
    """One thread that runs the transport's calls, so that the thread
    waiting for one can look for stopped processes meanwhile. A daemon:
    a call left waiting for a process that will not come does not keep
    the interpreter from exiting."""

    def __init__(self):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._serve, name="jax-ipu processes", daemon=True).start()

    def run(self, fn) -> _Job:
        job = _Job(fn)
        self._jobs.put(job)
        return job

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                job.value = job.fn()
            except BaseException as exc:
                job.error = exc
            job.done.set()


def _check_alike(headers: list[dict], me: int) -> None:
    mine = {k: v for k, v in headers[me].items() if k != "nbytes"}
    for p, theirs in enumerate(headers):
        other = {k: v for k, v in theirs.items() if k != "nbytes"}
        if other != mine:
            def show(h):
                return (f"{h['program']} (fingerprint {h['fingerprint']}), its collective #{h['step']} "
                        f"on {h['dtype']}{h['shape']}")
            raise IpuInvalidArgument(
                f"processes run different programs across their IPUs: process {me} runs {show(mine)}, process "
                f"{p} runs {show(other)}. Every process must call the same jitted functions with the same "
                "shapes, in the same order")


class GlooOverCpuBackend:
    """All-gathers of bytes between processes, one per exchange, over Gloo:
    a shard_map all_gather on JAX's CPU backend over one CPU device of each
    process. JAX made that backend's Gloo collectives with the distributed
    client; its TCP pairs rendezvoused through the coordination service's
    key-value store. A peer that dies makes Gloo fail its reads at once;
    one that hangs is cut off by XLA:CPU's collective timeout, set here."""

    def __init__(self, process_index: int, process_count: int, timeout: float):
        import jax
        from jax.sharding import Mesh, NamedSharding
        from jax.sharding import PartitionSpec as P

        try:
            cpus = jax.devices("cpu")
        except RuntimeError as exc:
            raise IpuRuntimeError(
                "collectives between processes run over Gloo on JAX's CPU backend, which is not enabled "
                f"({exc}): keep cpu in JAX_PLATFORMS (e.g. JAX_PLATFORMS=ipu,cpu)") from None
        first: dict[int, object] = {}
        for device in cpus:
            first.setdefault(device.process_index, device)
        if sorted(first) != list(range(process_count)):
            raise IpuRuntimeError(f"JAX's CPU backend spans processes {sorted(first)}, not all {process_count}: "
                                  "start jax.distributed before any JAX call in every process")
        self.index = process_index
        self.count = process_count
        self.mesh = Mesh(np.array([first[p] for p in range(process_count)]), ("processes",))
        self.device = first[process_index]
        self.sharding = NamedSharding(self.mesh, P("processes"))
        self.timeout = int(max(1, timeout))
        self._compiled: dict[int, object] = {}
        self._gather = jax.shard_map(lambda x: jax.lax.all_gather(x, "processes", tiled=True), mesh=self.mesh,
                                     in_specs=P("processes"), out_specs=P(), check_vma=False)

    def _program(self, n: int):
        compiled = self._compiled.get(n)
        if compiled is None:
            import jax
            shape = jax.ShapeDtypeStruct((self.count * n,), np.uint8, sharding=self.sharding)
            compiled = jax.jit(self._gather).lower(shape).compile(
                {"xla_cpu_collective_timeout_seconds": self.timeout})
            self._compiled[n] = compiled
        return compiled

    def all_gather(self, data: np.ndarray) -> np.ndarray:
        """[processes, len(data)]: every process's bytes."""
        import jax
        n = len(data)
        local = jax.device_put(data, self.device)
        global_in = jax.make_array_from_single_device_arrays((self.count * n,), self.sharding, [local])
        out = self._program(n)(global_in)
        return np.asarray(out.addressable_data(0)).reshape(self.count, n)


class ProcessLinks:
    """The other processes' side of one launch (model.links.Launch's
    `remote`): rank r of the launch runs in process `rank_process[r]`."""

    def __init__(self, processes: Processes, name: str, fingerprint: str, rank_process: list[int]):
        self.processes = processes
        self.name, self.fingerprint = name, fingerprint
        self.rank_process = rank_process
        self.ranks_of: dict[int, list[int]] = {}
        for rank, p in enumerate(rank_process):
            self.ranks_of.setdefault(p, []).append(rank)
        self.local_ranks = self.ranks_of[processes.index]
        self.ticket: int | None = None     # set when launched
        self._turn_taken = False
        self._crosses: dict = {}
        self.counts = no_exchanges()    # this launch's exchanges
        self._exchange_failed = False      # an exchange raised: every process saw it fail

    def crosses(self, groups) -> bool:
        found = self._crosses.get(groups)
        if found is None:
            rank_process = self.rank_process
            if not groups:
                found = len(self.ranks_of) > 1
            else:
                found = any(len({rank_process[r] for r in g if r < len(rank_process)}) > 1 for g in groups)
            self._crosses[groups] = found
        return found

    def exchange(self, slots: list, step: int) -> None:
        what = f"{self.name} on process {self.processes.index}"
        if not self._turn_taken:
            self.processes.wait_turn(self.ticket, what)
            self._turn_taken = True
        values = [np.asarray(slots[r]) for r in self.local_ranks]
        dtype, shape = values[0].dtype, values[0].shape
        header = {"program": self.name, "fingerprint": self.fingerprint, "step": step,
                  "dtype": dtype.name, "shape": list(shape)}
        try:
            rows = self.processes.exchange(header, b"".join(v.tobytes() for v in values), what, self.counts)
        except BaseException:
            self._exchange_failed = True
            raise
        for p, (_, payload) in enumerate(rows):
            if p == self.processes.index or p not in self.ranks_of:
                continue
            ranks = self.ranks_of[p]
            theirs = np.frombuffer(payload, dtype).reshape((len(ranks),) + shape)
            for i, rank in enumerate(ranks):
                slots[rank] = theirs[i, ...]   # a 0-d array, not a numpy scalar

    def failed(self, reason: str) -> None:
        """A replica of this launch failed here. Unless the failure came from
        an exchange (which every process saw), the other processes may wait
        for this one in exchanges it will not join: stop."""
        if not self._exchange_failed:
            self.processes.stop(f"its run of {self.name} failed: {reason}")

    def finish(self) -> None:
        if self.ticket is not None:
            self.processes.done(self.ticket)
