"""Several processes with jax.distributed on loopback: every process lists
every IPU, runs its share of each program, and the collectives between
processes (over Gloo on JAX's CPU backend) give what the same programs give
on one process with as many IPUs, bit for bit. Also: a killed peer and
processes running different programs fail clearly, in bounded time.

The process groups (distributed_worker.py) start together once for the
module, each process bounded by a timeout."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

WORKER = os.path.join(os.path.dirname(__file__), "distributed_worker.py")
TIMEOUT_SECONDS = 300
ALL = "devices,collectives,training,pmap,multihost,second_initialize,between_processes"

# name: (processes, IPUs per process, cases)
GROUPS = {
    "two": (2, 2, ALL),
    "one_of_four": (1, 4, "devices,collectives,training"),
    "three": (3, 1, "devices,collectives,training,pmap"),
    "one_of_three": (1, 3, "devices,collectives,training"),
    "killed": (2, 1, "killed_peer"),
    "mismatch": (2, 1, "mismatch"),
    "own_failure": (2, 1, "own_failure"),
    "exits": (2, 1, "exits"),
    "uneven": (2, None, "devices"),      # process 0 models 1 IPU, process 1 two
    "pods_of_two": (1, 4, "link_domains", {"JAX_IPU_IPUS_PER_LINK_DOMAIN": "2"}),
    "one_pod": (1, 4, "link_domains"),
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(name, root, processes, per_process, cases, extra_env=None):
    out = os.path.join(root, name)
    os.makedirs(out)
    port = _free_port()
    started = []
    for p in range(processes):
        env = dict(os.environ, JAX_PLATFORMS="ipu,cpu",
                   JAX_IPU_DEVICE_COUNT=str(per_process if per_process else p + 1), **(extra_env or {}))
        log = open(os.path.join(out, f"log{p}"), "w")
        started.append((subprocess.Popen([sys.executable, WORKER, str(p), str(processes), str(port), out, cases],
                                         env=env, stdout=log, stderr=subprocess.STDOUT), log))
    return out, started


def _finish(out, started, deadline):
    results, logs = [], []
    for p, (proc, log) in enumerate(started):
        try:
            proc.wait(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        with open(os.path.join(out, f"log{p}")) as f:
            logs.append(f.read())
        path = os.path.join(out, f"p{p}.json")
        results.append(json.load(open(path)) if os.path.exists(path) else None)
    return results, logs


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{group: ([results per process, None where it wrote none], [logs])}"""
    root = str(tmp_path_factory.mktemp("distributed"))
    started = {name: _start(name, root, *spec) for name, spec in GROUPS.items()}
    deadline = time.monotonic() + TIMEOUT_SECONDS
    return {name: _finish(out, procs, deadline) for name, (out, procs) in started.items()}


def results_of(runs, name):
    results, logs = runs[name]
    for p, r in enumerate(results):
        assert r is not None, f"process {p} of {name} wrote no results; its log ends:\n{logs[p][-3000:]}"
    return results


def merged(results, case, key):
    """Every process's shards of one result, by device id."""
    out = {}
    for r in results:
        out.update(r[case][key])
    return out


@pytest.mark.parametrize("group, processes, per_process", [("two", 2, 2), ("three", 3, 1)])
def test_every_process_lists_every_ipu_with_its_process(runs, group, processes, per_process):
    for p, r in enumerate(results_of(runs, group)):
        devices = r["devices"]
        assert devices["process_count"] == processes and devices["process_index"] == p
        assert devices["all"] == [[d, d // per_process] for d in range(processes * per_process)]
        assert devices["local"] == list(range(p * per_process, (p + 1) * per_process))


@pytest.mark.parametrize("collective", ["psum", "all_gather", "ppermute", "psum_scatter", "all_to_all", "pmax",
                                        "axis_index"])
@pytest.mark.parametrize("group, reference", [("two", "one_of_four"), ("three", "one_of_three")])
def test_collectives_across_processes_equal_one_process(runs, collective, group, reference):
    across = merged(results_of(runs, group), "collectives", collective)
    alone = results_of(runs, reference)[0]["collectives"][collective]
    assert across == alone           # bit for bit: same contributions, same order


def test_collectives_are_right(runs):
    """The one-process reference itself, against numpy."""
    n = 4
    x = np.arange(n * n * 3, dtype=np.float32).reshape(n * n, 3) / 7
    blocks = np.split(x, n)
    got = results_of(runs, "one_of_four")[0]["collectives"]
    for d in range(n):
        np.testing.assert_allclose(got["psum"][str(d)], sum(blocks), rtol=1e-6)
        np.testing.assert_array_equal(got["all_gather"][str(d)], x)
        np.testing.assert_array_equal(got["ppermute"][str(d)], blocks[(d - 1) % n])
        np.testing.assert_allclose(got["psum_scatter"][str(d)], np.split(sum(blocks), n)[d], rtol=1e-6)
        np.testing.assert_array_equal(got["all_to_all"][str(d)],
                                      np.concatenate([np.split(b, n)[d] for b in blocks]))
        np.testing.assert_array_equal(got["pmax"][str(d)], np.maximum.reduce(blocks))


@pytest.mark.parametrize("group, reference", [("two", "one_of_four"), ("three", "one_of_three")])
def test_data_parallel_training_equals_one_process(runs, group, reference):
    alone = results_of(runs, reference)[0]["training"]
    for r in results_of(runs, group):
        assert r["training"] == alone
    assert np.all(np.isfinite(alone["losses"]))


@pytest.mark.parametrize("group, processes, per_process", [("two", 2, 2), ("three", 3, 1)])
def test_pmap_over_every_processes_ipus(runs, group, processes, per_process):
    data = [np.arange(per_process * 2, dtype=np.float32).reshape(per_process, 2) + 10 * p for p in range(processes)]
    total = np.concatenate(data).sum(0)
    for r in results_of(runs, group):
        np.testing.assert_array_equal(r["pmap"], np.broadcast_to(total, (per_process, 2)))


def test_multihost_utils(runs):
    for r in results_of(runs, "two"):
        m = r["multihost"]
        assert m["default_backend"] == "ipu"      # so these ran over the IPUs' collectives
        assert m["process_allgather"] == [[0, 7], [1, 7]]
        assert m["broadcast_one_to_all"] == [5.0]


def test_second_initialize_is_refused(runs):
    for r in results_of(runs, "two"):
        assert r["second_initialize"] and "initialize" in r["second_initialize"]


def test_a_killed_peer_fails_the_others_quickly(runs):
    survivor, killed = runs["killed"][0]
    assert killed is None                       # it died before writing
    assert survivor is not None, runs["killed"][1][0][-3000:]
    failure = survivor["killed_peer"]
    assert failure is not None, "the collective with a dead peer did not fail"
    assert "between processes failed" in failure["error"]
    assert failure["seconds"] < 120             # bounded: far below the collective timeout


def test_different_programs_in_two_processes_fail_naming_both(runs):
    for p, r in enumerate(results_of(runs, "mismatch")):
        message = r["mismatch"]
        assert message is not None
        assert "run different programs" in message
        assert f"process {p} runs" in message and f"process {1 - p} runs" in message


def test_different_ipu_counts_are_refused(runs):
    _, logs = runs["uneven"]
    for log in logs:
        assert "JAX_IPU_DEVICE_COUNT" in log and "models device_count" in log, log[-3000:]


def test_data_parallel_example_two_terminals_equals_one_process(tmp_path):
    """examples/data_parallel.py as two terminals would start it, and on one
    process with as many IPUs: the same losses."""
    example = os.path.join(os.path.dirname(__file__), "..", "..", "..", "examples", "data_parallel.py")
    port = _free_port()

    def start(argv, count):
        env = dict(os.environ, JAX_PLATFORMS="ipu,cpu", JAX_IPU_DEVICE_COUNT=str(count))
        return subprocess.Popen([sys.executable, example, "--steps", "3"] + argv, env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    two = [start(["--coordinator", f"127.0.0.1:{port}", "--num-processes", "2", "--process-id", str(p)], 2)
           for p in range(2)]
    one = start([], 4)
    outputs = []
    for proc in two + [one]:
        try:
            out, _ = proc.communicate(timeout=TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        outputs.append(out)
    losses = [[line for line in out.splitlines() if line.startswith("losses:")] for out in outputs]
    assert losses[0] and losses[2], outputs
    assert losses[0] == losses[2]
    assert "2 process(es) x 2 IPUs" in outputs[0] and "1 process(es) x 4 IPUs" in outputs[2]


def test_collectives_between_link_domains_are_charged_as_gw_link_time(runs):
    """4 IPUs in IPU-Link domains of 2: a psum over all crosses GW-Links, one
    within each pair does not; in one domain (the default 64) neither."""
    split = results_of(runs, "pods_of_two")[0]["link_domains"]
    whole = results_of(runs, "one_pod")[0]["link_domains"]
    assert split["all"]["gw_link"] > 0 and split["all"]["ipu_link"] == 0
    assert split["pairs"]["gw_link"] == 0 and split["pairs"]["ipu_link"] > 0
    assert whole["all"]["gw_link"] == 0 and whole["all"]["ipu_link"] > 0
    # The gateway's 25 GB/s and its latency make the crossing ring slower.
    assert split["all"]["gw_link"] > whole["all"]["ipu_link"]


def test_profiles_count_the_bytes_moved_between_processes(runs):
    """A run whose psum spans processes carries its launch's exchange in its
    profile (2 local IPUs' [4, 3] float32 blocks sent, the other process's
    received); programs inside one process exchange nothing; profiling
    sessions total the runs'; the process's total (after the earlier
    cases' exchanges) grows by the same."""
    for r in results_of(runs, "two"):
        b = r["between_processes"]
        for run in b["across"]:
            assert run["exchanges"] == 1
            assert run["bytes_sent"] == run["bytes_received"] == 2 * 4 * 3 * 4
            assert run["seconds"] > 0
        for run in b["inside"] + [b["alone"]]:
            assert run == {"exchanges": 0, "bytes_sent": 0, "bytes_received": 0, "seconds": 0.0}
        (line,) = b["text"]                           # the report's summary says so
        assert "between processes: 1 exchange(s), 96 B sent, 96 B received" in line
        assert b["before"]["exchanges"] > 0          # the earlier cases' collectives
        for key in ("exchanges", "bytes_sent", "bytes_received"):
            assert b["after_across"][key] - b["before"][key] == 2 * b["across"][0][key]
            assert b["after"][key] == b["after_across"][key]
        # A profiling session's report of the program (one per local IPU) totals its two runs.
        assert len(b["sessions"]) == 2
        for runs_total in b["sessions"]:
            assert (runs_total["exchanges"], runs_total["bytes_sent"], runs_total["bytes_received"]) == (2, 192, 192)


def test_a_process_whose_run_fails_stops_the_others_at_once(runs):
    """The last process's host callback raises before a psum: the other
    process, waiting for it there, fails naming it and the error, long
    before the collective timeout; later collectives fail at once in both."""
    waiting, failed = results_of(runs, "own_failure")
    failure = waiting["own_failure"]["failure"]
    assert failure is not None, "the psum completed without the failed process"
    assert "process 1 stopped" in failure["error"] and "bad batch on process 1" in failure["error"]
    assert failure["seconds"] < 60
    assert "bad batch on process 1" in failed["own_failure"]["failure"]["error"]
    assert "process 1 stopped" in waiting["own_failure"]["later"]["error"]
    assert "this process stopped taking part" in failed["own_failure"]["later"]["error"]
    for r in (waiting, failed):
        assert r["own_failure"]["later"]["seconds"] < 10
    for log in runs["own_failure"][1]:
        assert "terminate called" not in log        # the call given up on ended before the interpreter did


def test_a_process_that_exits_stops_the_others_at_once(runs):
    """The last process's script ends with an exception while the other
    waits for it in a collective (its sockets stay open while JAX waits at
    shutdown): the other fails at once, saying why."""
    (waiting, left), logs = runs["exits"]
    assert left is None and "process leaves before the collective" in logs[1]
    assert waiting is not None, logs[0][-3000:]
    failure = waiting["exits"]
    assert failure is not None and "process 1 stopped" in failure["error"]
    assert "interpreter exited" in failure["error"]
    assert failure["seconds"] < 60
    assert "terminate called" not in logs[0]
