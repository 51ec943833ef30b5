"""Profiles of executed programs: contents through real jitted programs on
the IPU Model, the ways to switch them on, and `jax-ipu report`."""
from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_ipu
from helpers import run_python
from jax_ipu import cli, config


def mlp(w1, w2, x):
    return jnp.tanh(x @ w1) @ w2


@pytest.fixture(scope="module")
def mlp_args(ipu):
    rng = np.random.default_rng(0)
    shapes = [(64, 128), (128, 10), (32, 64)]
    return [jax.device_put(rng.standard_normal(s).astype(np.float32), ipu) for s in shapes]


def test_profile_contents(tmp_path, ipu, mlp_args):
    f = jax.jit(mlp)
    with jax_ipu.profiling(str(tmp_path)) as session:
        for _ in range(3):
            f(*mlp_args).block_until_ready()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["jit_mlp-0.json", "jit_mlp-0.trace.json"]
    path = tmp_path / "jit_mlp-0.json"
    report = json.loads(path.read_text())
    assert report["compiled"] and report["trace_file"] == "jit_mlp-0.trace.json"
    assert report == json.loads(json.dumps(session.results[0]))
    target = jax_ipu.target(ipu)
    assert report["format"] == "jax-ipu-profile/1" and report["program"] == "jit_mlp" and report["device"] == 0
    assert report["target"]["num_tiles"] == target.num_tiles and report["target"]["clock_hz"] == target.clock_hz

    mem = report["memory"]
    tiles = mem["per_tile"]
    for key in ("always_live", "arguments", "constants", "code", "not_always_live_peak", "peak"):
        assert len(tiles[key]) == target.num_tiles
    always = np.array(tiles["always_live"])
    np.testing.assert_array_equal(always, np.add(tiles["arguments"], tiles["constants"]) + tiles["code"])
    np.testing.assert_array_equal(tiles["peak"], always + tiles["not_always_live_peak"])
    assert sum(tiles["arguments"]) == sum(a.nbytes for a in mlp_args)
    assert mem["fits"] and mem["max_bytes"] == max(tiles["peak"]) == tiles["peak"][mem["max_tile"]]
    assert mem["total_bytes"] == sum(tiles["peak"]) and mem["tiles_over_limit"] == 0
    assert mem["largest_tensors_on_max_tile"]

    steps = report["steps"]
    assert {s["kind"] for s in steps} <= {"Execute", "Copy"}
    assert report["cycles"]["device"] == sum(s["cycles"] for s in steps) == report["cost_analysis"]["estimated_cycles"]
    assert report["exchange_bytes"] == sum(s["exchange_bytes"] for s in steps)
    sets = report["compute_sets"]
    assert any(cs["name"].startswith("matmul") for cs in sets)
    assert [cs["name"] for cs in sets] == [s["name"] for s in steps if s["kind"] == "Execute"]
    for cs in sets:
        assert cs["vertices"] >= cs["tiles"] >= 1 and sum(cs["codelets"].values()) == cs["vertices"]

    host = report["host_transfers"]
    assert [t["bytes"] for t in host["host_to_device"]] == [a.nbytes for a in mlp_args]
    assert [t["bytes"] for t in host["device_to_host"]] == [32 * 10 * 4]
    assert host["bytes"] == sum(a.nbytes for a in mlp_args) + 32 * 10 * 4
    seconds = report["estimated_seconds"]
    assert seconds["device"] == pytest.approx(report["cycles"]["device"] / target.clock_hz)
    assert seconds["host_transfers"] == pytest.approx(host["bytes"] / target.host_link_bytes_per_second)
    assert seconds["total"] == pytest.approx(seconds["device"] + seconds["host_transfers"])
    runs = report["runs"]
    assert runs["count"] == 3 and runs["total_cycles"] == 3 * report["cycles"]["device"]
    assert report["memory_stats"]["arguments"] == sum(a.nbytes for a in mlp_args)


def test_loops_are_profiled_per_run(ipu):
    f = jax.jit(lambda x, n: jax.lax.fori_loop(0, n, lambda i, y: jnp.sin(y) * 2, x))
    x = jax.device_put(np.ones(100, np.float32), ipu)
    with jax_ipu.profiling() as session:
        for n in (1, 5):
            f(x, jax.device_put(np.int32(n), ipu)).block_until_ready()
    (report,) = session.results
    runs = report["runs"]
    assert runs["count"] == 2 and runs["min_cycles"] < runs["max_cycles"]
    assert runs["total_cycles"] == runs["min_cycles"] + runs["max_cycles"]
    assert report["cycles"]["device"] == runs["max_cycles"] == sum(s["cycles"] for s in report["steps"])


def test_profiles_are_per_program_and_device(ipus):
    f, g = jax.jit(lambda x: x + 1), jax.jit(lambda x: x * 2)
    with jax_ipu.profiling() as session:
        for device in ipus:
            x = jax.device_put(np.ones(8, np.float32), device)
            f(x).block_until_ready()
            g(x).block_until_ready()
    assert sorted((r["program"], r["device"]) for r in session.results) == [
        ("jit__lambda", 0), ("jit__lambda", 0), ("jit__lambda", 1), ("jit__lambda", 1)]
    assert jax_ipu.profile.ACTIVE is None


def test_last_profile_without_profiling(ipus):
    x = jax.device_put(np.arange(10, dtype=np.float32), ipus[1])
    jax.jit(lambda a: jnp.exp(a))(x).block_until_ready()
    report = jax_ipu.last_profile(ipus[1])
    assert report["device"] == 1 and report["program"] == "jit__lambda"
    assert report["compute_sets"] and report["cycles"]["device"] > 0
    assert "runs" not in report


def test_last_profile_after_every_step_is_a_fresh_copy(ipu, mlp_args):
    """A program's memory plan and compute sets are built into its report
    once (last_profile after every step took 8 ms an MLP step); each
    report is still the caller's own to change, and equal to a fresh build."""
    from jax_ipu.profile import report as report_module
    f = jax.jit(mlp)
    f(*mlp_args).block_until_ready()
    first = jax_ipu.last_profile(ipu)
    first["memory"]["per_tile"]["peak"][0] = -1
    first["memory"]["largest_tensors_on_max_tile"][0]["shape"].append(99)
    first["compute_sets"][0]["codelets"]["changed"] = 1
    f(*mlp_args).block_until_ready()
    second = jax_ipu.last_profile(ipu)
    from jax_ipu.pjrt import client
    program = client.CURRENT.device(ipu.id).last_program    # (other tests' programs share its name)
    assert second["memory"] == report_module.memory(program)
    assert second["compute_sets"] == report_module.compute_sets(program)
    assert second["memory"]["per_tile"]["peak"][0] >= 0 and "changed" not in second["compute_sets"][0]["codelets"]


def test_runs_still_going_when_the_session_ends_are_recorded(tmp_path, ipu, mlp_args):
    """Dispatch is asynchronous: a step called inside `profiling` and not
    waited for is still the session's (it was dropped: no results)."""
    f = jax.jit(lambda w1, w2, x: mlp(w1, w2, x) * 3)
    for warm in (False, True):
        with jax_ipu.profiling(str(tmp_path / f"p{warm}")) as session:
            f(*mlp_args)
        assert len(session.results) == 1 and session.results[0]["runs"]["count"] == 1
        assert sorted(os.listdir(tmp_path / f"p{warm}")) == ["jit__lambda-0.json", "jit__lambda-0.trace.json"]


def test_report_command(tmp_path, ipu, mlp_args, capsys):
    with jax_ipu.profiling(str(tmp_path)):
        jax.jit(mlp)(*mlp_args).block_until_ready()
    path = tmp_path / "jit_mlp-0.json"
    assert cli.main(["report", str(tmp_path)]) == 0      # a directory: the reports, not the timelines
    assert capsys.readouterr().out.count("Program jit_mlp") == 1
    assert cli.main(["report", str(path)]) == 0
    out = capsys.readouterr().out
    for text in ("Program jit_mlp on IPU 0", "Memory", "fits: peak", "always-live", "busiest tiles:",
                 "Execution (last run)", "cycles =", "host transfers:", "estimated IPU time:",
                 "compile-time estimate:", "timeline: jit_mlp-0.trace.json (open it in https://ui.perfetto.dev",
                 "Busiest steps", "Compute sets", "Execute matmul"):
        assert text in out, text
    assert cli.main(["report", str(tmp_path / "jit_mlp-0.trace.json")]) == 1
    assert "is a timeline" in capsys.readouterr().err
    bad = tmp_path / "other.json"
    bad.write_text("{}")
    assert cli.main(["report", str(bad)]) == 1
    assert "not a jax-ipu profile" in capsys.readouterr().err
    script = shutil.which("jax-ipu")
    if script:   # the installed entry point
        done = subprocess.run([script, "report", str(path)], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and "estimated IPU time" in done.stdout


@pytest.mark.parametrize("env", [
    {"JAX_IPU_PROFILE": "{dir}"},
    {"POPLAR_ENGINE_OPTIONS": '{{"autoReport.all": "true", "autoReport.directory": "{dir}"}}'},
])
def test_switched_on_by_the_environment(tmp_path, env):
    env = {k: v.format(dir=tmp_path / "report") for k, v in env.items()}
    done = run_python("import jax, jax.numpy as jnp\n"
                      "jax.jit(lambda x: x * 2, backend='ipu')(jnp.ones(4)).block_until_ready()", **env)
    assert done.returncode == 0, done.stderr
    files = sorted(os.listdir(tmp_path / "report"))
    assert files == ["jit__lambda-0.json", "jit__lambda-0.trace.json"]
    report = json.loads((tmp_path / "report" / files[0]).read_text())
    assert report["runs"]["count"] == 1


def test_engine_options_are_read():
    env = {"POPLAR_ENGINE_OPTIONS": '{"autoReport.all": true, "debug.allowOutOfMemory": "true"}'}
    c = config.from_environment(env)
    assert c.profile_directory == "." and c.allow_out_of_memory
    c = config.from_environment({"JAX_IPU_ALLOW_OUT_OF_MEMORY": "1", "JAX_IPU_PROFILE": "/x"})
    assert c.allow_out_of_memory and c.profile_directory == "/x"
    assert config.from_environment({}).profile_directory is None
    with pytest.raises(jax_ipu.IpuInvalidArgument, match="POPLAR_ENGINE_OPTIONS"):
        config.from_environment({"POPLAR_ENGINE_OPTIONS": "autoReport.all=true"})


# -- timelines (Chrome / Perfetto trace events) --

def _complete_events(trace, pid=0):
    return [e for e in trace["traceEvents"] if e["ph"] == "X" and e["pid"] == pid]


def test_timeline_is_valid_trace_events(tmp_path, ipu, mlp_args):
    with jax_ipu.profiling(str(tmp_path)) as session:
        jax.jit(mlp)(*mlp_args).block_until_ready()
    (report,) = session.results
    trace = json.loads((tmp_path / "jit_mlp-0.trace.json").read_text())
    assert trace["otherData"]["format"] == "jax-ipu-trace/1" and trace["displayTimeUnit"] == "ns"
    events = trace["traceEvents"]
    for e in events:       # the fields the trace-event format requires
        assert {"name", "ph", "pid"} <= set(e) and e["ph"] in ("X", "M", "i")
        if e["ph"] == "X":
            assert isinstance(e["ts"], float) and e["dur"] >= 0 and isinstance(e["tid"], int)
    names = {(e["name"], e["args"]["name"]) for e in events if e["ph"] == "M" and e["name"] != "process_sort_index"}
    assert ("thread_name", "program steps") in names and ("thread_name", "host link") in names
    assert any(n == "process_name" and v.startswith("IPU 0: jit_mlp on IPU Model ipu2") for n, v in names)
    clock = report["target"]["clock_hz"]
    steps = [e for e in _complete_events(trace) if e["cat"] in ("Execute", "Copy")]
    assert [(e["name"], e["args"]["cycles"]) for e in steps] == [(s["name"], s["cycles"]) for s in report["steps"]]
    # Back to back in estimated time, in microseconds at the target's clock.
    for a, b in itertools.pairwise(steps):
        assert b["ts"] == pytest.approx(a["ts"] + a["dur"])
    assert sum(e["dur"] for e in steps) == pytest.approx(report["cycles"]["device"] / clock * 1e6)
    assert any(e["cat"] == "Execute" and e["name"].startswith("matmul") for e in steps)
    # Each step's exchange, compute and sync phases fill it exactly.
    phases = [e for e in _complete_events(trace) if e["cat"] in ("exchange", "compute", "sync")]
    for step in steps:
        inside = [p for p in phases if step["ts"] - 1e-9 <= p["ts"] < step["ts"] + step["dur"] - 1e-9]
        assert {p["name"] for p in inside} >= {"compute", "sync"}
        assert sum(p["args"]["cycles"] for p in inside) == step["args"]["cycles"]
    host = [e for e in _complete_events(trace) if e["cat"] == "host transfer"]
    assert [e["args"]["bytes"] for e in host] == [a.nbytes for a in mlp_args] + [32 * 10 * 4]
    assert host[-1]["ts"] == pytest.approx(steps[-1]["ts"] + steps[-1]["dur"])


def test_timeline_per_device_and_from_a_saved_report(tmp_path, ipus, capsys):
    x = jax.device_put(np.ones(64, np.float32), ipus[1])
    jax.jit(lambda a: jnp.exp(a) * 2)(x).block_until_ready()
    report = jax_ipu.last_profile(ipus[1])
    path = tmp_path / "run.json"
    path.write_text(json.dumps(report))
    assert cli.main(["trace", str(path)]) == 0
    out = tmp_path / "run.trace.json"
    assert capsys.readouterr().out.strip() == str(out)
    trace = json.loads(out.read_text())
    assert {e["pid"] for e in trace["traceEvents"]} == {1}        # IPU 1's process
    assert sum(e["args"]["cycles"] for e in _complete_events(trace, 1) if e["cat"] == "Execute") == \
        report["cycles"]["device"]


def test_loop_iterations_on_the_timeline(ipu):
    f = jax.jit(lambda x, n: jax.lax.fori_loop(0, n, lambda i, y: jnp.sin(y) * 2, x))
    x = jax.device_put(np.ones(100, np.float32), ipu)
    f(x, jax.device_put(np.int32(4), ipu)).block_until_ready()
    report = jax_ipu.last_profile(ipu)
    from jax_ipu.profile.trace import trace_events
    steps = [e for e in _complete_events(trace_events(report)) if e["cat"] in ("Execute", "Copy")]
    body = [e for e in steps if e["name"].startswith("fused sine")]
    assert len(body) == 4


# -- the static estimate in reports --

def test_report_shows_loops_of_unknown_trip_count(ipu, capsys, tmp_path):
    f = jax.jit(lambda x, n: jax.lax.fori_loop(0, n, lambda i, y: jnp.sin(y) * 2, x))
    x = jax.device_put(np.ones(100, np.float32), ipu)
    f(x, jax.device_put(np.int32(5), ipu)).block_until_ready()
    report = jax_ipu.last_profile(ipu)
    static = report["static_estimate"]
    (loop,) = static["unknown_trip_loops"]
    # The run counts the real iterations; the static figure counts none.
    assert report["cycles"]["device"] == static["cycles"] + 5 * loop["cycles_per_iteration"]
    assert report["cost_analysis"]["loops_with_unknown_trip_count"] == 1
    path = tmp_path / "r.json"
    path.write_text(json.dumps(report))
    assert cli.main(["report", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"compile-time estimate: {static['cycles']:,} cycles" in out
    assert f"+ {loop['cycles_per_iteration']:,} cycles per iteration of while@" in out
    assert "trip count unknown at compile time" in out


# -- a program that does not fit: its report, from the compiler's plan --

OOM_PROGRAM = """
import jax, jax.numpy as jnp, numpy as np, jax_ipu
x = jax.device_put(np.zeros((512, 1024), np.float32), jax.devices("ipu")[0])   # fits; with its result it does not
try:
    {open}jax.jit(lambda a: jnp.tanh(a * 2 + 1))(x)
except Exception as exc:
    print("ERROR", type(exc).__name__)
"""


@pytest.mark.parametrize("how", ["JAX_IPU_PROFILE", "autoReport", "profiling"])
def test_out_of_memory_writes_a_report(tmp_path, how):
    directory = tmp_path / "report"
    env = {"JAX_IPU_MODEL_NUM_TILES": "4"}
    code = OOM_PROGRAM.format(open="")
    if how == "JAX_IPU_PROFILE":
        env["JAX_IPU_PROFILE"] = str(directory)
    elif how == "autoReport":
        env["POPLAR_ENGINE_OPTIONS"] = json.dumps({"autoReport.all": "true", "autoReport.directory": str(directory)})
    else:
        code = OOM_PROGRAM.format(open=f"with jax_ipu.profiling({str(directory)!r}): ")
    done = run_python(code, **env)
    assert done.returncode == 0, done.stderr
    assert "ERROR JaxRuntimeError" in done.stdout
    (path,) = directory.iterdir()          # no run, no timeline
    assert path.name == "jit__lambda-0.json"
    report = json.loads(path.read_text())
    assert report["compiled"] is False and report["device"] is None
    assert report["error"].startswith("out of memory on tile")
    mem = report["memory"]
    assert not mem["fits"] and mem["tiles_over_limit"] >= 1 and mem["max_bytes"] > mem["bytes_per_tile"]
    assert len(mem["per_tile"]["peak"]) == 4
    assert mem["largest_tensors_on_max_tile"][0]["shape"] == [512, 1024]
    assert report["steps"] == [] and report["compute_sets"]
    shown = run_python(f"from jax_ipu import cli; cli.main(['report', {str(path)!r}])")
    out = shown.stdout
    for text in ("Program jit__lambda did not compile", "out of memory on tile", "DOES NOT FIT",
                 "busiest tiles:", "over", "largest tensors on tile", "argument 0 float32[512, 1024]",
                 "compile-time estimate"):
        assert text in out, (text, out)


def test_out_of_memory_without_profiling_writes_nothing(tmp_path):
    done = run_python(OOM_PROGRAM.format(open=""), JAX_IPU_MODEL_NUM_TILES="4")
    assert "ERROR JaxRuntimeError" in done.stdout and jax_ipu.profile.ACTIVE is None


def test_devices_command_lists_each_ipu_once(ipus, capsys):
    assert cli.main(["devices"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(ipus)
    for device, line in zip(ipus, lines, strict=True):
        description = jax_ipu.target(device).describe()
        assert line == f"{device!r}: {description}" and line.count(description) == 1
