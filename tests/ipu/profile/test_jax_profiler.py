"""jax.profiler sees the IPUs: inside `jax.profiler.trace(dir)` each IPU's
executed steps are a device timeline in the trace JAX writes, in estimated
IPU time, named after the op and the user's source line. The trace is read
back with what users have: jaxlib's own reader (jax.profiler.ProfileData),
the Perfetto trace JSON that JAX writes beside it, and the protobuf."""
from __future__ import annotations

import glob
import gzip
import json
import re
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_ipu
from helpers import on_cpu, run_python
from jax_ipu.profile import tracing, xspace


def model(w, x):
    h = jnp.tanh(x @ w)
    return (h * 2.0).sum(axis=1)


MATMUL_LINE = model.__code__.co_firstlineno + 1
SUM_LINE = model.__code__.co_firstlineno + 2


def step(x):
    y = jax.lax.psum(jnp.sin(x), "i")
    jax.debug.print("step {}", y.sum())
    return jax.lax.fori_loop(0, 3, lambda i, c: c * 2.0, y)


PSUM_LINE = step.__code__.co_firstlineno + 1
PRINT_LINE = step.__code__.co_firstlineno + 2
LOOP_LINE = step.__code__.co_firstlineno + 3


def the_xplane(log_dir) -> str:
    paths = glob.glob(str(log_dir / "plugins" / "profile" / "*" / "*.xplane.pb"))
    assert len(paths) == 1, paths
    return paths[0]


def device_planes(space) -> dict:
    return {p.name: p for p in space.planes if p.name.startswith(xspace.PLANE_PREFIX)}


def events(plane, line_name: str) -> list[dict]:
    """The events of one line: name, offset and duration (ps), stats (the
    event's and its metadata's)."""
    (line,) = [line for line in plane.lines if line.name == line_name]

    def stats(found) -> dict:
        return {plane.stat_metadata[s.metadata_id].name: s.str_value or s.int64_value for s in found}
    out = []
    for e in line.events:
        metadata = plane.event_metadata[e.metadata_id]
        out.append({"name": metadata.name, "offset": e.offset_ps, "duration": e.duration_ps,
                    **stats(metadata.stats), **stats(e.stats)})
    return out


def within(found: list[dict], outer: dict) -> list[dict]:
    return [e for e in found if outer["offset"] <= e["offset"] < outer["offset"] + outer["duration"]]


def ps(cycles: int, clock: float) -> int:
    return round(cycles * 1e12 / clock)


@pytest.fixture(scope="module")
def traced(tmp_path_factory, ipu):
    """Two runs inside a trace, one before and one after it."""
    rng = np.random.default_rng(0)
    w = jax.device_put(rng.standard_normal((64, 32)).astype(np.float32), ipu)
    x = jax.device_put(rng.standard_normal((16, 64)).astype(np.float32), ipu)
    f = jax.jit(model)
    f(w, x).block_until_ready()                    # compiled and run outside the trace
    log_dir = tmp_path_factory.mktemp("trace")
    assert tracing.RUNNING == ()
    with jax.profiler.trace(log_dir, create_perfetto_trace=True):
        assert len(tracing.RUNNING) == 1
        f(w, x)
        result = f(w, x).block_until_ready()
    assert tracing.RUNNING == ()
    f(w, x).block_until_ready()
    np.testing.assert_allclose(np.asarray(result), on_cpu(model, np.asarray(w), np.asarray(x)),
                               rtol=2e-5, atol=2e-5)
    return log_dir, jax_ipu.last_profile(ipu)


def test_ipu_steps_in_the_trace_at_estimated_time(traced):
    log_dir, report = traced
    clock = report["target"]["clock_hz"]
    space = xspace.parse(open(the_xplane(log_dir), "rb").read())
    planes = device_planes(space)
    assert list(planes) == ["/device:CUSTOM:0"]      # only IPU 0 ran
    plane = planes["/device:CUSTOM:0"]

    # The two runs inside the trace, not the ones before and after it.
    programs = events(plane, "Programs")
    assert [p["name"] for p in programs] == ["jit_model", "jit_model"]
    assert [p["cycles"] for p in programs] == [report["cycles"]["device"]] * 2

    steps = events(plane, "Steps")
    expected = report["steps"] * 2
    assert [s["name"] for s in steps] == [s["name"] for s in expected]
    assert [s["duration"] for s in steps] == [ps(s["cycles"], clock) for s in expected]
    assert [s["cycles"] for s in steps] == [s["cycles"] for s in expected]
    assert {s["kind"] for s in steps} == {"compute set"}
    # Names lead back to the user's source lines.
    names = " | ".join(s["name"] for s in steps)
    assert re.search(rf"dot_general@\S*test_jax_profiler\.py:{MATMUL_LINE}:", names), names
    assert re.search(rf"fused tanh\S* @\S*test_jax_profiler\.py:{SUM_LINE}:", names), names   # with the multiply
    assert re.search(rf"reduce@\S*test_jax_profiler\.py:{SUM_LINE}:", names), names
    (matmul,) = [s for s in steps[:len(report["steps"])] if "dot_general" in s["name"]]
    assert re.fullmatch(rf"\S*test_jax_profiler\.py:{MATMUL_LINE}:\d+", matmul["source"]), matmul["source"]

    # Each step's exchange, compute and sync phases fill it, in order.
    phases = events(plane, "BSP phases")
    at = 0
    for s in steps:
        report_step = next(r for r in report["steps"] if r["name"] == s["name"])
        parts = [p for p in (("exchange", report_step["exchange_cycles"]),
                             ("compute", report_step["cycles"] - report_step["exchange_cycles"]
                              - report_step["sync_cycles"]),
                             ("sync", report_step["sync_cycles"])) if p[1] > 0]
        got = phases[at:at + len(parts)]
        at += len(parts)
        assert [(p["name"], p["cycles"]) for p in got] == parts
        assert got[0]["offset"] == s["offset"]
        assert [p["duration"] for p in got] == [ps(c, clock) for _, c in parts]
    assert at == len(phases)

    # The host link: two arguments before the steps, the result after.
    host = events(plane, "Host link")
    assert [h["name"] for h in host] == ["argument 0 to IPU", "argument 1 to IPU", "result 0 to host"] * 2
    transfers = report["host_transfers"]
    assert [h["bytes"] for h in host[:3]] == [t["bytes"] for t in transfers["host_to_device"]] + \
        [transfers["device_to_host"][0]["bytes"]]
    first, last = programs[0], programs[1]
    assert host[0]["offset"] == first["offset"]
    assert steps[0]["offset"] == host[1]["offset"] + host[1]["duration"]
    assert first["offset"] + first["duration"] == host[2]["offset"] + host[2]["duration"]
    assert last["offset"] >= first["offset"] + first["duration"]     # one IPU, one run at a time


def test_trace_read_by_jaxlib_and_perfetto_json(traced):
    log_dir, report = traced
    clock = report["target"]["clock_hz"]
    expected = [(s["name"], s["cycles"] / clock) for s in report["steps"]] * 2

    # jaxlib's reader of the .xplane.pb
    data = jax.profiler.ProfileData.from_file(the_xplane(log_dir))
    plane = data.find_plane_with_name("/device:CUSTOM:0")
    (line,) = [line for line in plane.lines if line.name == "Steps"]
    got = [(e.name, e.duration_ns) for e in line.events]
    assert [name for name, _ in got] == [name for name, _ in expected]
    # (its durations are whole nanoseconds, cut down from the picoseconds)
    np.testing.assert_array_equal([d for _, d in got], [(round(s * 1e12) // 1000) for _, s in expected])

    # The Perfetto trace JAX writes: the IPU is a process beside the host's.
    (path,) = glob.glob(str(log_dir / "plugins" / "profile" / "*" / "perfetto_trace.json.gz"))
    trace = json.load(gzip.open(path))["traceEvents"]
    names = {(e["pid"], e.get("tid")): e["args"]["name"] for e in trace
             if e.get("ph") == "M" and e["name"] in ("process_name", "thread_name")}
    (ipu_pid,) = [pid for (pid, tid), name in names.items() if tid is None and name == "/device:CUSTOM:0"]
    steps_tid = next(tid for (pid, tid), name in names.items() if pid == ipu_pid and name == "Steps")
    steps = sorted((e for e in trace if e.get("ph") == "X" and e["pid"] == ipu_pid and e["tid"] == steps_tid),
                   key=lambda e: e["ts"])
    assert [e["name"] for e in steps] == [name for name, _ in expected]
    np.testing.assert_allclose([e["dur"] for e in steps], [s * 1e6 for _, s in expected], rtol=0, atol=1e-6)
    # On the host's clock: each run starts after JAX dispatched it.
    programs_tid = next(tid for (pid, tid), name in names.items() if pid == ipu_pid and name == "Programs")
    runs = sorted(e["ts"] for e in trace if e.get("ph") == "X" and e["pid"] == ipu_pid and e["tid"] == programs_tid)
    dispatches = sorted(e["ts"] for e in trace if e.get("ph") == "X" and e["pid"] != ipu_pid
                        and e["name"] == "PjitFunction(model)")
    assert len(runs) == 2 and len(dispatches) >= 2
    for run, dispatch in zip(runs, dispatches[::len(dispatches) // 2], strict=True):
        assert dispatch <= run < dispatch + 10e6, (dispatch, run)


def test_collectives_host_callbacks_and_loops(tmp_path, ipus):
    assert len(ipus) >= 2
    g = jax.pmap(step, axis_name="i", devices=ipus[:2])
    x = np.arange(32, dtype=np.float32).reshape(2, 16)
    g(x).block_until_ready()
    with jax.profiler.trace(tmp_path):
        out = g(x).block_until_ready()
    total = np.sin(x).sum(axis=0)
    np.testing.assert_allclose(np.asarray(out), np.stack([total * 8] * 2), rtol=1e-5)
    space = xspace.parse(open(the_xplane(tmp_path), "rb").read())
    planes = device_planes(space)
    assert sorted(planes) == ["/device:CUSTOM:0", "/device:CUSTOM:1"]
    for plane in planes.values():
        steps = events(plane, "Steps")
        kinds = {s["name"]: s["kind"] for s in steps}
        (psum,) = [n for n, k in kinds.items() if k == "collective"]
        assert re.search(rf"all_reduce@\S*test_jax_profiler\.py:{PSUM_LINE}:", psum), psum
        (callback,) = [n for n, k in kinds.items() if k == "host callback"]
        assert re.search(rf"^host callback \d+ \S*@\S*test_jax_profiler\.py:{PRINT_LINE}:", callback), callback
        body = [s for s in steps if re.search(rf"multiply @\S*test_jax_profiler\.py:{LOOP_LINE}:", s["name"])]
        assert len(body) == 3                        # each iteration of the loop
        (psum_step,) = [s for s in steps if s["name"] == psum]
        assert "IPU-Links" in [p["name"] for p in within(events(plane, "BSP phases"), psum_step)]
        program = events(plane, "Programs")
        assert len(program) == 1 and program[0]["duration"] == sum(s["duration"] for s in steps) + sum(
            h["duration"] for h in events(plane, "Host link"))


def test_tracer_records_only_while_started(ipu, monkeypatch):
    f = jax.jit(lambda x: x * 3.0 + 1.0)
    x = jax.device_put(np.ones(8, np.float32), ipu)
    handed = []
    monkeypatch.setattr(tracing, "record", lambda *run: handed.append(run))
    f(x).block_until_ready()
    assert handed == []                             # no trace: runs hand nothing over
    monkeypatch.undo()
    tracer = tracing.Tracer()
    f(x).block_until_ready()
    assert tracer.collect() == b""                  # not started: nothing
    tracer.start()
    f(x).block_until_ready()
    f(x).block_until_ready()
    tracer.stop()
    f(x).block_until_ready()
    assert tracing.RUNNING == ()
    space = xspace.parse(tracer.collect())
    (plane,) = device_planes(space).values()
    assert len(events(plane, "Programs")) == 2
    assert tracer.collect() == b""                  # collected once


def test_device_tracer_level_read_from_the_options():
    assert tracing.device_tracer_level(b"\x08\x01\x10\x02\x18\x01 \x01(\x018\x01") == 1   # jaxlib's defaults
    assert tracing.device_tracer_level(b"\x08\x01\x10\x02") == 0
    assert not tracing.Tracer(b"\x08\x01\x10\x02").enabled
    with pytest.raises(ValueError, match="truncated"):
        tracing.device_tracer_level(b"\x18")


def test_a_failing_collection_is_reported_not_fatal():
    result = run_python(
        "import jax, jax.numpy as jnp\n"
        "from jax_ipu.profile import xspace\n"
        "def fail(*args, **kwargs):\n"
        "    raise RuntimeError('no xspace today')\n"
        "xspace.build = fail\n"
        "ipu = jax.devices('ipu')[0]\n"
        "f = jax.jit(lambda x: x * 2)\n"
        "x = jax.device_put(jnp.ones(4), ipu)\n"
        "import tempfile\n"
        "with jax.profiler.trace(tempfile.mkdtemp()):\n"
        "    f(x).block_until_ready()\n"
        "print('after the trace', f(x).tolist())\n")
    assert result.returncode == 0, result.stderr
    assert "after the trace [2.0, 2.0, 2.0, 2.0]" in result.stdout
    assert "RuntimeError: no xspace today" in result.stderr


def test_a_long_trace_keeps_its_first_steps(ipu, monkeypatch):
    f = jax.jit(lambda c: jax.lax.fori_loop(0, 10, lambda i, c: c * 2.0, c))
    x = jax.device_put(np.ones(8, np.float32), ipu)
    f(x).block_until_ready()
    steps_per_run = len(jax_ipu.last_profile(ipu)["steps"])
    monkeypatch.setattr(tracing, "MAX_STEPS", steps_per_run + 3)
    tracer = tracing.Tracer()
    tracer.start()
    f(x).block_until_ready()
    f(x).block_until_ready()
    space = xspace.parse(tracer.collect())
    (plane,) = device_planes(space).values()
    assert len(events(plane, "Steps")) == steps_per_run + 3
    programs = events(plane, "Programs")
    assert len(programs) == 2
    # The unlisted steps' time passes too (up to a picosecond of rounding a step).
    assert abs(programs[1]["duration"] - programs[0]["duration"]) <= steps_per_run
    assert list(space.warnings) == [f"jax-ipu: {steps_per_run - 3} IPU steps beyond the first "
                                    f"{steps_per_run + 3} of this trace are not shown"]


def test_a_trace_stopped_by_a_host_callback(tmp_path, ipu):
    def stop(v):
        jax.profiler.stop_trace()          # on the IPU's worker, inside the run
        return v
    f = jax.jit(lambda x: jax.pure_callback(stop, jax.ShapeDtypeStruct((4,), jnp.float32), x * 2))
    x = jax.device_put(np.ones(4, np.float32), ipu)
    jax.profiler.start_trace(tmp_path)
    began = time.monotonic()
    np.testing.assert_array_equal(np.asarray(f(x)), np.full(4, 2.0, np.float32))
    # Waiting for the worker's runs would wait for this one: a hang, not a slow run.
    assert time.monotonic() - began < 60
    assert tracing.RUNNING == ()
    assert glob.glob(str(tmp_path / "plugins" / "profile" / "*" / "*.xplane.pb"))
