"""Host callbacks inside ipu programs, on-device loops included, with
ordered effects kept in order."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import io_callback

from helpers import on_cpu, run_python


def test_debug_print(ipu, capfd):
    def f(x):
        jax.debug.print("value {x} sum {s}", x=x, s=x.sum())
        return x * 2
    y = jax.jit(f)(jax.device_put(np.arange(3, dtype=np.float32), ipu))
    jax.effects_barrier()
    np.testing.assert_array_equal(np.asarray(y), [0, 2, 4])
    assert "value [0. 1. 2.] sum 3.0" in capfd.readouterr().out


def test_debug_callback_inside_a_device_loop(ipu):
    seen = []

    def f(x):
        def body(i, x):
            jax.debug.callback(lambda i, x: seen.append((int(i), float(x))), i, x.sum(), ordered=True)
            return x + 1
        return lax.fori_loop(0, 5, body, x)
    y = jax.jit(f)(jax.device_put(np.zeros(4, np.float32), ipu))
    jax.effects_barrier()
    np.testing.assert_array_equal(np.asarray(y), np.full(4, 5.0))
    assert seen == [(i, 4.0 * i) for i in range(5)]


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.float16, np.uint8], ids=lambda d: np.dtype(d).name)
def test_pure_callback_results_feed_the_program(ipu, dtype):
    def f(x):
        y = jax.pure_callback(lambda a: (a[::-1] * 2).astype(a.dtype), jax.ShapeDtypeStruct(x.shape, x.dtype), x)
        return y + x
    x = np.arange(6).astype(dtype)
    got = jax.jit(f)(jax.device_put(x, ipu))
    want = on_cpu(f, x)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert got.devices() == {ipu}


def test_ordered_io_callbacks_keep_their_order(ipu):
    log = []

    def f(x):
        for k in range(4):
            io_callback(lambda v, k=k: log.append((k, float(v))), None, x * k, ordered=True)
        return io_callback(lambda: np.float32(42), jax.ShapeDtypeStruct((), np.float32), ordered=True) + x
    y = jax.jit(f)(jax.device_put(np.float32(1.5), ipu))
    assert float(y) == 43.5
    assert log == [(k, 1.5 * k) for k in range(4)]


@pytest.mark.parametrize("donate", [False, True], ids=["kept", "donated"])
def test_a_compiled_program_with_ordered_effects_runs_again(ipu, donate):
    # jit(f).lower(x).compile() called several times: from the second call
    # JAX's AOT fast path would drop the runtime token of ordered effects.
    log = []

    def f(x):
        io_callback(lambda v: log.append(float(v)), None, x.sum(), ordered=True)
        jax.debug.print("{s}", s=x.sum(), ordered=True)
        return x * 2
    x = jax.device_put(np.ones(3, np.float32), ipu)
    compiled = jax.jit(f, donate_argnums=0 if donate else ()).lower(x).compile()
    for _ in range(4):
        x = compiled(x)
    jax.effects_barrier()
    np.testing.assert_array_equal(np.asarray(x), np.full(3, 16.0))
    assert log == [3.0, 6.0, 12.0, 24.0]


def test_callback_returning_the_wrong_shape_is_a_clear_error(ipu):
    def f(x):
        return jax.pure_callback(lambda a: np.zeros(3, np.float32), jax.ShapeDtypeStruct((4,), np.float32), x)
    with pytest.raises(Exception, match=r"the host callback at \S+test_callbacks.py:\d+.*: result 0 should be "
                                        r"float32\[4\] \(its result_shape_dtypes\), it returned float32\[3\]"):
        jax.jit(f)(jax.device_put(np.ones(4, np.float32), ipu)).block_until_ready()


def test_an_ordered_callbacks_wrong_result_is_named_at_its_line():
    """The ordering token an ordered io_callback also returns is not counted:
    its only result is result 0, and the error names the user's line."""
    code = """
import jax, jax.numpy as jnp, numpy as np
from jax.experimental import io_callback
def f(x):
    extra = io_callback(lambda: np.ones(3, np.float32), jax.ShapeDtypeStruct((), jnp.float32), ordered=True)
    return x + extra
try:
    jax.jit(f)(jax.device_put(np.float32(1), jax.devices('ipu')[0])).block_until_ready()
except Exception as e:
    print('ERROR', e)
"""
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert "the host callback at <string>:5" in result.stdout, result.stdout
    assert "result 0 should be float32[] (its result_shape_dtypes), it returned float32[3]" in result.stdout


def test_callback_exception_reaches_the_user(ipu):
    def boom(a):
        raise ValueError("the user's callback failed")

    def f(x):
        return jax.pure_callback(boom, jax.ShapeDtypeStruct(x.shape, x.dtype), x)
    with pytest.raises(Exception, match="the user's callback failed"):
        jax.jit(f)(jax.device_put(np.ones(2, np.float32), ipu)).block_until_ready()


def test_ordered_callbacks_run_again_after_one_failed():
    """A failed ordered io_callback reports its error through the run's
    results; the next ordered programs still run (as on the CPU), and the
    process exits without re-raising it."""
    code = """
import jax, jax.numpy as jnp, numpy as np
from jax.experimental import io_callback
state = {'fail': True, 'seen': []}
def cb(x):
    if state['fail']:
        raise RuntimeError('host side failure')
    state['seen'].append(float(x[0]))
    return x
f = jax.jit(lambda x: io_callback(cb, jax.ShapeDtypeStruct((3,), jnp.float32), x, ordered=True) * 2)
x = jax.device_put(np.ones(3, np.float32), jax.devices('ipu')[0])
try:
    f(x).block_until_ready()
except Exception as e:
    print('FIRST', 'host side failure' in str(e))
state['fail'] = False
print('NEXT', np.asarray(f(x)), np.asarray(f(x + 1)))
jax.effects_barrier()
print('SEEN', state['seen'])
"""
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert "FIRST True" in result.stdout and "NEXT [2. 2. 2.] [4. 4. 4.]" in result.stdout
    assert "SEEN [1.0, 2.0]" in result.stdout and "Exception ignored" not in result.stderr


def test_host_exchange_is_charged_at_the_host_link_rate(ipu):
    from jax_ipu.compiler import compile_module
    from jax_ipu.graph.programs import HostCall, leaves
    from jax_ipu.stablehlo import import_module
    from jax_ipu.targets import get_target

    def f(x):
        return jax.pure_callback(np.negative, jax.ShapeDtypeStruct(x.shape, x.dtype), x)
    text = jax.jit(f).lower(jax.device_put(np.ones(1 << 16, np.float32), ipu)).as_text()
    target = get_target("ipu2")
    program = compile_module(import_module(text), target)
    calls = [s for s in leaves(program.body) if isinstance(s, HostCall)]
    assert len(calls) == 1 and calls[0].host_bytes == 2 * 4 * (1 << 16)
    link_cycles = calls[0].host_bytes / target.host_link_bytes_per_second * target.clock_hz
    assert calls[0].cycles >= link_cycles


@pytest.mark.parametrize("ordered", [True, False])
def test_a_failed_callback_is_reported_once_not_at_every_barrier(ordered):
    # The failing run's error reaches its outputs; JAX's runtime tokens (the
    # runs' completion events) stay clean, so effects_barrier and exit do
    # not raise it again (as on XLA:CPU), and later programs run.
    code = f"""
import jax, numpy as np
from jax.experimental import io_callback
ipu = jax.devices("ipu")[0]
x = jax.device_put(np.ones(2, np.float32), ipu)
def bad(v):
    raise ValueError("callback failed")
f = jax.jit(lambda a: a + io_callback(bad, jax.ShapeDtypeStruct((), np.float32), a.sum(), ordered={ordered}))
try:
    np.asarray(f(x))
    raise SystemExit("no error")
except jax.errors.JaxRuntimeError as error:
    assert "callback failed" in str(error), error
for _ in range(3):
    jax.effects_barrier()
g = jax.jit(lambda a: a + io_callback(lambda v: np.float32(1), jax.ShapeDtypeStruct((), np.float32), a.sum(),
                                      ordered={ordered}))
print(np.asarray(g(x)).tolist())
"""
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "[2.0, 2.0]"
    # (JAX itself logs the callback's exception once, as on XLA:CPU.)
    assert "Exception ignored" not in proc.stderr and "JaxRuntimeError" not in proc.stderr, proc.stderr[-2000:]


def test_a_callback_may_run_programs_on_the_ipu_that_runs_it(ipu, cpu):
    # The inner program runs in place (queued, it would wait behind the run
    # that waits for it), as on XLA:CPU.
    inner = jax.jit(lambda v: jnp.cos(v) + 1)

    def cb(v):
        return np.asarray(inner(jax.device_put(np.asarray(v), ipu)))
    f = jax.jit(lambda x: lax.fori_loop(0, 2, lambda i, c: jax.pure_callback(
        cb, jax.ShapeDtypeStruct(c.shape, c.dtype), c) * 2, x))
    x = np.linspace(-1, 1, 5).astype(np.float32)
    want = np.asarray(f(jax.device_put(x, cpu)))
    np.testing.assert_allclose(np.asarray(f(jax.device_put(x, ipu))), want, rtol=1e-6)


def test_a_callback_given_a_value_its_ipu_computes_later_fails_clearly(ipu):
    # y is queued (by another thread) behind the run whose callback wants
    # it: a clear error instead of waiting forever, raised by the call (it
    # waits for its run, which calls the host).
    import threading
    started, dispatched, box = threading.Event(), threading.Event(), {}
    inner = jax.jit(lambda v: v + 1)

    def cb(v):
        started.set()
        dispatched.wait(30)
        return np.asarray(inner(box["y"]))
    f = jax.jit(lambda x: jax.pure_callback(cb, jax.ShapeDtypeStruct(x.shape, x.dtype), x))
    x = jax.device_put(np.ones(4, np.float32), ipu)

    def other_thread():
        started.wait(30)
        box["y"] = jax.jit(lambda v: v * 3)(x)
        dispatched.set()
    thread = threading.Thread(target=other_thread)
    thread.start()
    with pytest.raises(jax.errors.JaxRuntimeError, match="still being computed"):
        f(x)
    thread.join()
    np.testing.assert_array_equal(np.asarray(box["y"]), 3.0)


@pytest.mark.parametrize("loop", [False, True])
def test_a_call_of_a_program_calling_the_host_returns_when_its_callbacks_are_done(ipu, capfd, loop):
    """As on XLA:CPU: what a program's callbacks print or record is there
    when the call returns, before anything waits for its results (code
    reads printed output or recorded values next)."""
    seen = []

    def body(i, c):
        jax.debug.print("step {i}", i=i)
        io_callback(lambda v: seen.append(int(v)), None, i, ordered=True)
        return c + 1.0

    def f(x):
        if loop:
            return jax.lax.fori_loop(0, 50, body, x)
        for i in range(5):
            x = body(i, x)
        return x
    x = jax.device_put(np.zeros(3, np.float32), ipu)
    for _ in range(3):
        seen.clear()
        jax.jit(f)(x)           # no block_until_ready
        n = 50 if loop else 5
        assert seen == list(range(n))
        out = capfd.readouterr().out
        assert out.count("step ") == n and out.rstrip().endswith(f"step {n - 1}")


@pytest.mark.parametrize("callback_on", [0, 1])
def test_a_callback_in_a_sharded_jit_carries_jaxs_maximal_sharding(ipus, callback_on):
    """As JAX lowers callbacks for its own platforms: the call is annotated
    maximal on the calling device (Shardy's maximal mesh), and it runs
    there, once for the whole value."""
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from jax_ipu.frontend import callbacks

    mesh = Mesh(np.array(ipus[:2]), ("x",))
    callers = []

    def host(v):
        callers.append(callbacks.caller())
        return v + np.arange(v.shape[0], dtype=v.dtype)
    f = jax.jit(lambda x: jax.pure_callback(host, x, x, sharding=jax.sharding.SingleDeviceSharding(ipus[callback_on])),
                in_shardings=NamedSharding(mesh, P("x")), out_shardings=NamedSharding(mesh, P("x")))
    x = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(np.asarray(f(x)), 2 * x)
    assert callers == [None]         # once, for both IPUs
    text = f.lower(x).as_text()
    assert f"sdy.sharding = #sdy.sharding_per_value<[<@maximal_mesh_{callback_on}, []>]>" in text, text
    assert f"sdy.mesh @maximal_mesh_{callback_on} = <[], device_ids=[{callback_on}]>" in text, text


def test_an_ordered_callbacks_token_shares_its_maximal_sharding(ipus):
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(ipus[:2]), ("x",))
    seen = []
    f = jax.jit(lambda x: x + io_callback(lambda v: (seen.append(float(v.sum())), np.float32(1))[1],
                                          jax.ShapeDtypeStruct((), np.float32), x, ordered=True),
                in_shardings=NamedSharding(mesh, P("x")))
    x = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(np.asarray(f(x)), x + 1)
    jax.effects_barrier()
    assert seen == [6.0]
    text = f.lower(x).as_text()
    assert "sdy.sharding = #sdy.sharding_per_value<[<@maximal_mesh_0, []>, <@maximal_mesh_0, []>]>" in text, text
