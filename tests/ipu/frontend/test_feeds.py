"""Infeeds and outfeeds for on-device training loops, on ipu and (the same
code) on cpu."""
import functools
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jax_ipu
from helpers import run_python

SPEC = (jax.ShapeDtypeStruct((8, 4), jnp.float32), jax.ShapeDtypeStruct((8,), jnp.int32))


def batches(n, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((8, 4)).astype(np.float32), rng.integers(0, 3, 8).astype(np.int32))
            for _ in range(n)]


def make_train(feed, losses):
    def loss_fn(w, x, y):
        logits = x @ w
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], axis=1))

    def train(w, steps):
        def body(i, w):
            x, y = jax_ipu.infeed(feed)
            loss, grad = jax.value_and_grad(loss_fn)(w, x, y)
            jax_ipu.outfeed(losses, {"step": i, "loss": loss})
            return w - 0.5 * grad
        return lax.fori_loop(0, steps, body, w)
    return jax.jit(train, static_argnums=1, donate_argnums=0)


@pytest.mark.parametrize("platform", ["ipu", "cpu"])
def test_on_device_loop_fed_from_the_host_matches_a_python_loop(platform):
    device = jax.devices(platform)[0]
    feed, losses = jax_ipu.InfeedQueue(SPEC, timeout=30), jax_ipu.OutfeedQueue()
    data = batches(6)
    for b in data:
        feed.put(b)
    w = make_train(feed, losses)(jax.device_put(np.zeros((4, 3), np.float32), device), 6)
    w.block_until_ready()  # programs run asynchronously: the outfeed fills as they run
    assert w.devices() == {device}
    outs = list(losses)
    assert [int(o["step"]) for o in outs] == list(range(6))

    w_ref = np.zeros((4, 3), np.float32)
    for x, y in data:  # the same steps, one jit call each, on the CPU
        def loss_fn(w, x=x, y=y):
            return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(x @ w), y[:, None], axis=1))
        loss, grad = jax.value_and_grad(loss_fn)(w_ref)
        w_ref = w_ref - 0.5 * grad
    np.testing.assert_allclose(np.asarray(w), np.asarray(w_ref), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(float(outs[-1]["loss"]), float(loss), rtol=1e-5)


def test_batches_can_arrive_while_the_loop_runs(ipu):
    feed, losses = jax_ipu.InfeedQueue(SPEC, timeout=30), jax_ipu.OutfeedQueue()
    data = batches(5)

    def producer():
        for b in data:
            feed.put(b)
    thread = threading.Thread(target=producer)
    w = make_train(feed, losses)(jax.device_put(np.zeros((4, 3), np.float32), ipu), 5)
    thread.start()
    w.block_until_ready()
    thread.join()
    assert len(list(losses)) == 5


@pytest.mark.parametrize("platform", ["ipu", "cpu"])
def test_put_keeps_the_batch_as_it_was_when_put(platform):
    """A loader that refills one buffer between puts: each put is a copy."""
    feed = jax_ipu.InfeedQueue(jax.ShapeDtypeStruct((4,), np.float32))

    @functools.partial(jax.jit, static_argnums=1)
    def total(acc, n):
        return lax.fori_loop(0, n, lambda i, a: a + jax_ipu.infeed(feed), acc)
    buffer = np.zeros(4, np.float32)
    for i in range(3):
        buffer[:] = i + 1
        feed.put(buffer)
    buffer[:] = 100
    got = total(jax.device_put(np.zeros(4, np.float32), jax.devices(platform)[0]), 3)
    np.testing.assert_array_equal(np.asarray(got), np.full(4, 6.0))


def test_mismatched_batches_are_refused_at_put():
    feed = jax_ipu.InfeedQueue(SPEC)
    with pytest.raises(jax_ipu.FeedError, match="float32\\[8, 4\\]"):
        feed.put((np.zeros((8, 5), np.float32), np.zeros(8, np.int32)))
    with pytest.raises(jax_ipu.FeedError, match="int32"):
        feed.put((np.zeros((8, 4), np.float32), np.zeros(8, np.float32)))
    with pytest.raises(jax_ipu.FeedError, match="structure"):
        feed.put([np.zeros((8, 4), np.float32)])
    named = jax_ipu.InfeedQueue({"image": jax.ShapeDtypeStruct((2, 3), np.float32),
                                 "label": jax.ShapeDtypeStruct((2,), np.int32)})
    with pytest.raises(jax_ipu.FeedError, match=r"item\['image'\] is float64\[2, 3\].*astype\(np.float32\)"):
        named.put({"image": np.zeros((2, 3)), "label": np.zeros(2, np.int32)})   # numpy's float64 default
    with pytest.raises(jax_ipu.FeedError, match=r"item\['label'\] is int32\[3\], the queue takes int32\[2\]$"):
        named.put({"image": np.zeros((2, 3), np.float32), "label": np.zeros(3, np.int32)})


# Failures of executions with ordered effects are tested in fresh
# processes, so that nothing of them can reach other tests.
FAILING_FEED = """
import jax, jax_ipu, numpy as np, threading
from jax import lax
spec = jax.ShapeDtypeStruct((4,), np.float32)
feed, out = jax_ipu.InfeedQueue(spec, timeout={timeout}), jax_ipu.OutfeedQueue()
def train(w):
    def body(i, w):
        w = w + jax_ipu.infeed(feed)
        jax_ipu.outfeed(out, w)
        return w
    return lax.fori_loop(0, 3, body, w)
feed.put(np.ones(4, np.float32))
{before}
w = jax.jit(train)(jax.device_put(np.zeros(4, np.float32), jax.devices('ipu')[0]))
try:
    w.block_until_ready()
except Exception as e:
    print('ERROR', e)
print('steps that ran', len(list(out)))
{after}
"""


def test_an_empty_infeed_times_out_with_a_clear_error():
    result = run_python(FAILING_FEED.format(timeout=0.5, before="", after=""))
    assert result.returncode == 0, result.stderr
    assert "ERROR DEADLINE_EXCEEDED: infeed: nothing arrived within 0.5 s" in result.stdout
    assert "steps that ran 1" in result.stdout


def test_a_loop_runs_again_once_fed_after_a_timeout():
    """The timed-out run's error does not stick to the feed's ordered
    effects: fed, the same loop runs (as on the CPU)."""
    after = ("feed.put(np.ones(4, np.float32)); feed.put(np.ones(4, np.float32)); feed.put(np.ones(4, np.float32))\n"
             "print('AGAIN', np.asarray(jax.jit(train)(jax.device_put(np.zeros(4, np.float32), "
             "jax.devices('ipu')[0]))))")
    result = run_python(FAILING_FEED.format(timeout=0.5, before="", after=after))
    assert result.returncode == 0, result.stderr
    assert "ERROR DEADLINE_EXCEEDED" in result.stdout and "AGAIN [3. 3. 3. 3.]" in result.stdout
    assert "Exception ignored" not in result.stderr


def test_closing_a_queue_wakes_a_waiting_program():
    after = "try:\n    feed.put(np.ones(4, np.float32))\nexcept jax_ipu.FeedError as e:\n    print('PUT', e)"
    result = run_python(FAILING_FEED.format(timeout=60, before="threading.Timer(0.3, feed.close).start()",
                                            after=after))
    assert result.returncode == 0, result.stderr
    assert "ERROR" in result.stdout and "was closed while a program waited on it" in result.stdout
    assert "PUT infeed is closed" in result.stdout


def test_outfeed_get_waits_and_times_out():
    out = jax_ipu.OutfeedQueue(timeout=0.2)
    with pytest.raises(jax_ipu.FeedTimeout):
        out.get()


def test_replicas_share_a_queue_deterministically(ipus):
    """Under pmap each IPU reads the queue: in its k-th read IPU d of N gets
    item k*N + d (from where the launch began), as Graphcore's replicated
    infeed; each step's outfeed items are queued in IPU order. A second
    launch goes on from where the first ended."""
    n = len(ipus)
    feed = jax_ipu.InfeedQueue(jax.ShapeDtypeStruct((2,), np.float32), timeout=30)
    out = jax_ipu.OutfeedQueue()

    def epoch(acc):
        def body(i, acc):
            batch = jax_ipu.infeed(feed)
            jax_ipu.outfeed(out, {"first": batch[0], "who": lax.axis_index("d")})
            return acc * 10 + batch
        return lax.fori_loop(0, 3, body, acc)
    run = jax.pmap(epoch, axis_name="d", devices=ipus)
    for launch in range(2):
        for k in range(3 * n):
            feed.put(np.full(2, launch * 3 * n + k, np.float32))
        got = np.asarray(run(np.zeros((n, 2), np.float32)))[:, 0]
        first = launch * 3 * n
        want = [sum((first + k * n + d) * 10 ** (2 - k) for k in range(3)) for d in range(n)]
        np.testing.assert_array_equal(got, want)
        items = [out.get(timeout=10) for _ in range(3 * n)]
        assert [int(i["who"]) for i in items] == list(range(n)) * 3
        assert [float(i["first"]) for i in items] == [first + k for k in range(3 * n)]
    assert len(feed) == 0 and len(out) == 0
