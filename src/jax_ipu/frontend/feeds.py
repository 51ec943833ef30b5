"""Infeeds and outfeeds: host queues that programs read and write while
they run, so a training loop can stay on the device (lax.fori_loop,
while_loop, scan) and be fed batch by batch.

    feed = jax_ipu.InfeedQueue(batch_spec)        # a pytree of ShapeDtypeStruct
    losses = jax_ipu.OutfeedQueue()
    def train(params, steps):
        def body(i, params):
            x, y = jax_ipu.infeed(feed)
            params, loss = update(params, x, y)
            jax_ipu.outfeed(losses, loss)
            return params
        return lax.fori_loop(0, steps, body, params)
    feed.put((x0, y0)); ...                       # before or while it runs
    jax.jit(train, static_argnums=1, donate_argnums=0)(params, 10)
    print(list(losses))

jax 0.10 has no lax.infeed/outfeed and PJRT has no infeed calls, so the
feeds are ordered host callbacks: the same code runs on cpu and gpu (JAX's
io_callback), and on ipu as host exchanges charged at the host-link rate.
"""
from __future__ import annotations

import threading

import jax
import numpy as np
from jax.experimental import io_callback

from jax_ipu.errors import IpuError
from jax_ipu.frontend import callbacks

DEFAULT_TIMEOUT = 60.0


class FeedError(IpuError):
    pjrt_code = "INVALID_ARGUMENT"


class FeedTimeout(IpuError):
    pjrt_code = "DEADLINE_EXCEEDED"


class _Queue:
    """Items in arrival order. When several IPUs each run the callback (pmap,
    shard_map: callbacks.caller() says which of how many), they share the
    queue deterministically, as Graphcore's replicated feeds: in its k-th
    read, IPU d of N takes item k*N + d counted from where the launch began;
    outfeed items of one step are queued in IPU order once all have come."""

    def __init__(self, name: str, timeout: float):
        self.name = name
        self.timeout = timeout
        self._items: dict[int, object] = {}    # arrival number -> item, in arrival order
        self._arrived = 0
        self._ready = threading.Condition()
        self._closed = False
        self._launch = None                    # (launch, first arrival number, reads per IPU)
        self._writing = None                   # (launch, step -> {IPU: item} until all have come,
                                               #  writes per IPU)

    _empty_advice = ("put more items, before the loop needs them or from another thread, or raise the "
                     "queue's timeout; note that dispatching another program with feeds or callbacks waits "
                     "for this one to finish, so a thread that does so cannot feed it")

    def _check_open(self) -> None:
        if self._closed:
            raise FeedError(f"{self.name} is closed")

    def _append(self, item) -> None:
        self._items[self._arrived] = item
        self._arrived += 1

    def _push(self, item) -> None:
        caller = callbacks.caller()
        with self._ready:
            self._check_open()
            if caller is None:
                self._append(item)
            else:                              # one step's items, in IPU order
                launch, rank, size = caller
                if self._writing is None or self._writing[0] is not launch:
                    self._writing = (launch, {}, {})
                _, rounds, writes = self._writing
                step = writes.get(rank, 0)
                writes[rank] = step + 1
                rounds.setdefault(step, {})[rank] = item
                while rounds and len(rounds[min(rounds)]) == size:
                    done = rounds.pop(min(rounds))
                    for r in sorted(done):
                        self._append(done[r])
            self._ready.notify_all()

    def _claim(self):
        """The arrival number the caller reads next (None: the first there)."""
        caller = callbacks.caller()
        if caller is None:
            return None
        launch, rank, size = caller
        if self._launch is None or self._launch[0] is not launch:
            first = next(iter(self._items), self._arrived)
            self._launch = (launch, first, {})
        _, first, reads = self._launch
        k = reads.get(rank, 0)
        reads[rank] = k + 1
        return first + k * size + rank

    def _pop(self, timeout: float | None):
        with self._ready:
            key = self._claim()
            there = (lambda: self._items or self._closed) if key is None else \
                (lambda: key in self._items or self._closed)
            if not self._ready.wait_for(there, timeout):
                self._launch = None
                raise FeedTimeout(f"{self.name}: nothing arrived within {timeout} s ({self._empty_advice})")
            if self._closed:
                raise FeedError(f"{self.name} was closed while a program waited on it")
            return self._items.pop(next(iter(self._items)) if key is None else key)

    def close(self) -> None:
        """Wakes any waiting program with an error; later puts raise."""
        with self._ready:
            self._closed = True
            self._items.clear()
            self._ready.notify_all()

    def __len__(self) -> int:
        return len(self._items)


class InfeedQueue(_Queue):
    """Batches for programs to read with jax_ipu.infeed(queue). `spec` is a
    pytree of jax.ShapeDtypeStruct (or of example arrays); what is put must
    match it exactly."""

    def __init__(self, spec, *, timeout: float = DEFAULT_TIMEOUT, name: str = "infeed"):
        super().__init__(name, timeout)
        self.spec = jax.tree.map(lambda a: jax.ShapeDtypeStruct(np.shape(a), np.asarray(a).dtype
                                                                if not hasattr(a, "dtype") else a.dtype), spec)

    def put(self, item) -> None:
        leaves, tree = jax.tree.flatten(item)
        spec_leaves, spec_tree = jax.tree.flatten(self.spec)
        if tree != spec_tree:
            raise FeedError(f"{self.name}: expected the structure {spec_tree}, got {tree}")
        arrays = []
        paths = [jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_flatten_with_path(self.spec)[0]]
        for path, leaf, want in zip(paths, leaves, spec_leaves, strict=True):
            # A copy: loaders refill one buffer between puts, and the queue
            # must hold each batch as it was when put.
            array = np.array(leaf, copy=True)
            if array.shape != want.shape or array.dtype != want.dtype:
                advice = (f" (cast it: .astype(np.{np.dtype(want.dtype).name}))"
                          if array.shape == want.shape else "")
                raise FeedError(f"{self.name}: item{path} is {array.dtype.name}{list(array.shape)}, "
                                f"the queue takes {np.dtype(want.dtype).name}{list(want.shape)}{advice}")
            arrays.append(array)
        self._push(jax.tree.unflatten(tree, arrays))


class OutfeedQueue(_Queue):
    """Values programs write with jax_ipu.outfeed(queue, value)."""

    _empty_advice = ("no program has written more yet: wait longer with get(timeout=...), or check that "
                     "the program writing it runs and did not fail")

    def __init__(self, *, timeout: float = DEFAULT_TIMEOUT, name: str = "outfeed"):
        super().__init__(name, timeout)

    def get(self, timeout: float | None = None):
        return self._pop(self.timeout if timeout is None else timeout)

    def __iter__(self):
        """Drains what is there now."""
        while True:
            with self._ready:
                if not self._items:
                    return
                item = self._items.pop(next(iter(self._items)))
            yield item


def infeed(queue: InfeedQueue):
    """Inside a jitted program: the next item of `queue` (waits up to the
    queue's timeout, then the program fails with FeedTimeout)."""
    def pop():
        return queue._pop(queue.timeout)
    # The program may wait here for items the caller puts after dispatching
    # it: its call must return before it ends (callbacks.WAITS_FOR_HOST).
    setattr(pop, callbacks.WAITS_FOR_HOST, True)
    return io_callback(pop, queue.spec, ordered=True)


def outfeed(queue: OutfeedQueue, value) -> None:
    """Inside a jitted program: appends `value` (a pytree) to `queue`."""
    leaves, tree = jax.tree.flatten(value)

    def push(*host_leaves):
        queue._push(jax.tree.unflatten(tree, [np.asarray(leaf) for leaf in host_leaves]))
    io_callback(push, None, *leaves, ordered=True)
