"""Compiled ipu programs saved and loaded through JAX's API
(jax.experimental.serialize_executable), in this process and in another,
and compiled.as_text()."""
from __future__ import annotations

import pickle

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import serialize_executable as se
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import jax_ipu
from helpers import on_cpu, run_python


def step(w, x):
    loss, grad = jax.value_and_grad(lambda w: jnp.mean(jnp.tanh(x @ w) ** 2))(w)
    return w - 0.1 * grad, loss


def _data():
    rng = np.random.default_rng(0)
    return rng.standard_normal((16, 8)).astype(np.float32), rng.standard_normal((4, 16)).astype(np.float32)


def _round_trip(compiled, devices):
    """JAX runs a loaded executable on `execution_devices` (all the
    backend's devices unless told): the devices it was compiled for."""
    payload, in_tree, out_tree = se.serialize(compiled)
    return se.deserialize_and_load(payload, in_tree, out_tree, backend="ipu", execution_devices=devices)


def test_a_loaded_executable_gives_the_same_results_estimates_and_memory(ipu):
    w, x = jax.device_put(_data(), ipu)
    compiled = jax.jit(step).lower(w, x).compile()
    loaded = _round_trip(compiled, [ipu])
    expected = compiled(w, x)
    got = loaded(w, x)
    for e, g, c in zip(expected, got, on_cpu(step, *_data()), strict=True):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(e))
        np.testing.assert_allclose(np.asarray(g), c, rtol=1e-5, atol=1e-6)
    assert loaded.cost_analysis() == compiled.cost_analysis()
    assert loaded.cost_analysis()["estimated_cycles"] > 0
    assert loaded.memory_analysis().peak_memory_in_bytes == compiled.memory_analysis().peak_memory_in_bytes
    loaded(w, x)[0].block_until_ready()
    profile = jax_ipu.last_profile(ipu)
    compiled(w, x)[0].block_until_ready()
    original = jax_ipu.last_profile(ipu)
    for key in ("steps", "compute_sets", "memory", "static_estimate", "cycles", "cost_analysis"):
        assert profile[key] == original[key], key


def test_as_text_shows_the_program_and_what_it_compiled_to(ipu):
    compiled = jax.jit(step).lower(*jax.device_put(_data(), ipu)).compile()
    text = compiled.as_text()
    assert text.startswith("HloModule jit_step")
    assert "f32[16,8]" in text and "f32[4,16]" in text             # its signature
    # What the IPU runs: compute sets named after the ops, cycles, memory.
    assert "ipu_program=" in text and "compute sets" in text and "estimated" in text
    assert "tanh" in text and "dot_general" in text and "memory: peak" in text
    assert _round_trip(compiled, [ipu]).as_text() == text


def test_the_summary_is_an_mlir_string_literal():
    # What XLA parses at every compile and load: quotes and backslashes
    # escaped, every byte of what is not printable ASCII as \\XX.
    from jaxlib.mlir import ir

    from jax_ipu.pjrt.executable import _mlir_string

    cases = ["", "plain text", 'a "quoted" \\ path\\', "lines\nand\ttabs\x00\x7f", "caf\u00e9 \u2192 \U0001f600"]
    for text in cases:
        literal = _mlir_string(text)
        assert set(literal) <= {chr(c) for c in range(32, 127)}, literal
        with ir.Context():
            assert ir.StringAttr(ir.Attribute.parse(literal)).value == text, (text, literal)


def test_donation_in_a_loaded_executable(ipu):
    w, x = jax.device_put(_data(), ipu)
    loaded = _round_trip(jax.jit(step, donate_argnums=0).lower(w, x).compile(), [ipu])
    before = jax_ipu.transfer_stats(ipu)
    new_w, _ = loaded(w, x)
    new_w.block_until_ready()
    assert w.is_deleted()
    assert jax_ipu.transfer_stats(ipu) == before          # the donated state stayed on the IPU
    np.testing.assert_allclose(np.asarray(new_w), on_cpu(step, *_data())[0], rtol=1e-5, atol=1e-6)


def test_callbacks_and_feeds_in_a_loaded_executable(ipu):
    seen = []

    def f(x):
        jax.debug.callback(lambda v: seen.append(np.asarray(v)), x.sum())
        return jax.pure_callback(lambda v: np.sort(v), jax.ShapeDtypeStruct(x.shape, x.dtype), x) * 2

    x = jax.device_put(np.array([3.0, 1.0, 2.0], np.float32), ipu)
    loaded = _round_trip(jax.jit(f).lower(x).compile(), [ipu])
    np.testing.assert_array_equal(np.asarray(loaded(x)), [2.0, 4.0, 6.0])
    jax.effects_barrier()
    assert [float(v) for v in seen] == [6.0]

    spec = jax.ShapeDtypeStruct((2,), jnp.float32)
    feed, out = jax_ipu.InfeedQueue(spec, timeout=30), jax_ipu.OutfeedQueue()

    def loop(total):
        def body(i, total):
            total = total + jax_ipu.infeed(feed).sum()
            jax_ipu.outfeed(out, total)
            return total
        return lax.fori_loop(0, 3, body, total)

    total = jax.device_put(np.float32(0), ipu)
    loaded = _round_trip(jax.jit(loop).lower(total).compile(), [ipu])
    for i in range(3):
        feed.put(np.full(2, i + 1, np.float32))
    assert float(loaded(total)) == 12.0
    assert [float(v) for v in out] == [2.0, 6.0, 12.0]


def test_an_executable_over_two_ipus(ipus):
    mesh = Mesh(np.array(ipus[:2]), ("batch",))
    w, x = _data()
    w = jax.device_put(w, NamedSharding(mesh, P()))
    x = jax.device_put(x, NamedSharding(mesh, P("batch")))
    compiled = jax.jit(step).lower(w, x).compile()
    loaded = _round_trip(compiled, list(ipus[:2]))
    got = loaded(w, x)
    assert got[0].sharding.device_set == set(ipus[:2])
    for e, g in zip(compiled(w, x), got, strict=True):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(e))


_LOAD_ELSEWHERE = """
import pickle, sys, jax, jax_ipu, numpy as np
from jax.experimental import serialize_executable as se
import jax_ipu.compiler
def no_compile(*a, **k):
    raise AssertionError("compiled instead of loading")
jax_ipu.compiler.compile_module = no_compile
payload, in_tree, out_tree, args = pickle.load(open(sys.argv[1] if len(sys.argv) > 1 else {path!r}, "rb"))
loaded = se.deserialize_and_load(payload, in_tree, out_tree, backend="ipu")
ipu = jax.devices("ipu")[0]
out = loaded(*jax.device_put(args, ipu))
jax.block_until_ready(out)
np.save({result!r}, np.concatenate([np.ravel(np.asarray(o)) for o in out]))
p = jax_ipu.last_profile(ipu)
print(repr((p["cycles"]["device"], p["static_estimate"]["cycles"], len(p["compute_sets"]), loaded.cost_analysis()["estimated_cycles"])))
"""


def test_a_saved_executable_runs_in_another_process(ipu, tmp_path):
    args = _data()
    compiled = jax.jit(step).lower(*jax.device_put(args, ipu)).compile()
    path, result = tmp_path / "step.pkl", tmp_path / "result.npy"
    # (The pytrees are the caller's to keep: pickled here, by the test.)
    with open(path, "wb") as f:
        pickle.dump((*se.serialize(compiled), args), f)
    done = run_python(_LOAD_ELSEWHERE.format(path=str(path), result=str(result)))
    assert done.returncode == 0, done.stderr[-3000:]
    out = compiled(*jax.device_put(args, ipu))
    jax.block_until_ready(out)
    np.testing.assert_array_equal(np.load(result), np.concatenate([np.ravel(np.asarray(o)) for o in out]))
    profile = jax_ipu.last_profile(ipu)
    assert eval(done.stdout.strip().splitlines()[-1]) == (
        profile["cycles"]["device"], profile["static_estimate"]["cycles"], len(profile["compute_sets"]),
        compiled.cost_analysis()["estimated_cycles"])


def test_a_program_calling_the_host_is_refused_in_another_process(ipu, tmp_path):
    def f(x):
        jax.debug.print("x={x}", x=x)
        return x + 1

    compiled = jax.jit(f).lower(jax.device_put(np.ones(3, np.float32), ipu)).compile()
    path = tmp_path / "f.pkl"
    with open(path, "wb") as file:
        pickle.dump((*se.serialize(compiled), (np.ones(3, np.float32),)), file)
    done = run_python(_LOAD_ELSEWHERE.format(path=str(path), result=str(tmp_path / "r.npy")))
    assert done.returncode != 0
    assert "calls host callbacks" in done.stderr and "Compile it again in this process" in done.stderr


def test_an_executable_for_another_tile_count_is_refused(tmp_path):
    code = """
import jax, numpy as np, pickle
from jax.experimental import serialize_executable as se
ipu = jax.devices("ipu")[0]
c = jax.jit(lambda x: x * 2).lower(jax.device_put(np.ones(4, np.float32), ipu)).compile()
pickle.dump((*se.serialize(c), (np.ones(4, np.float32),)), open({path!r}, "wb"))
"""
    path = tmp_path / "x.pkl"
    done = run_python(code.format(path=str(path)), JAX_IPU_MODEL_NUM_TILES="32")
    assert done.returncode == 0, done.stderr[-2000:]
    done = run_python(_LOAD_ELSEWHERE.format(path=str(path), result=str(tmp_path / "r.npy")),
                      JAX_IPU_MODEL_NUM_TILES="64")
    assert done.returncode != 0
    assert "compiled for ipu2 with 32 tiles" in done.stderr and "compile it again" in done.stderr
