"""One process of the multi-process tests (tests/ipu/multi_ipu/test_several_processes.py).

    python distributed_worker.py PROCESS_ID NUM_PROCESSES PORT OUT_DIR CASE[,CASE...]

With NUM_PROCESSES > 1 it starts jax.distributed on loopback; with 1 it
runs the same programs on one process's IPUs (JAX_IPU_DEVICE_COUNT of
them), the reference the multi-process results must equal. It writes what
each case computed on this process's IPUs to OUT_DIR/p<PROCESS_ID>.json.
"""
from __future__ import annotations

import functools
import json
import os
import sys
import time

process_id, num_processes, port, out_dir = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
cases = sys.argv[5].split(",")

import jax  # noqa: E402

if num_processes > 1:
    from jax._src.lib import _jax
    # Gloo binds the address the host name resolves to; these tests stay on loopback.
    _jax.make_gloo_tcp_collectives = functools.partial(_jax.make_gloo_tcp_collectives, hostname="127.0.0.1")
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes, process_id, initialization_timeout=120,
                               heartbeat_timeout_seconds=20, shutdown_timeout_seconds=20)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P

results: dict = {}


def local_rows(sharding, x):
    """This process's rows of x, split over the mesh's first axis."""
    index = sharding.addressable_devices_indices_map(x.shape)
    rows = sorted({sl[0].start or 0 for sl in index.values()})
    step = x.shape[0] // len(sharding.mesh.devices.flat)
    return np.concatenate([x[r:r + step] for r in rows])


def shards(array) -> dict:
    """{device id: its shard}, this process's."""
    return {str(s.device.id): np.asarray(s.data).tolist() for s in array.addressable_shards}


ipus = jax.devices("ipu")
mesh = Mesh(np.array(ipus), ("d",))
rows = NamedSharding(mesh, P("d"))
n = len(ipus)
x = np.arange(n * n * 3, dtype=np.float32).reshape(n * n, 3) / 7


def global_x():
    return jax.make_array_from_process_local_data(rows, local_rows(rows, x), x.shape)


SHARDED = P("d")


def shard_map(f, out=SHARDED):
    return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("d"), out_specs=out, check_vma=False))


def case_devices():
    results["devices"] = {"all": [[d.id, d.process_index] for d in ipus],
                          "local": [d.id for d in jax.local_devices(backend="ipu")],
                          "process_index": jax.process_index(), "process_count": jax.process_count()}


def case_collectives():
    arr = global_x()
    out = {}
    out["psum"] = shards(shard_map(lambda v: lax.psum(v, "d"))(arr))
    out["all_gather"] = shards(shard_map(lambda v: lax.all_gather(v, "d", tiled=True), P(None))(arr))
    out["ppermute"] = shards(shard_map(lambda v: lax.ppermute(v, "d", [(i, (i + 1) % n) for i in range(n)]))(arr))
    out["psum_scatter"] = shards(shard_map(lambda v: lax.psum_scatter(v, "d", tiled=True))(arr))
    out["all_to_all"] = shards(shard_map(lambda v: lax.all_to_all(v, "d", 0, 0, tiled=True))(arr))
    out["pmax"] = shards(shard_map(lambda v: lax.pmax(v, "d"))(arr))
    out["axis_index"] = shards(shard_map(lambda v: v * 0 + lax.axis_index("d"))(arr))
    results["collectives"] = out


def case_training():
    """A data-parallel MLP: jit over NamedSharding-placed batches, the
    gradient all-reduce made by the partitioner."""
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((3, 16)).astype(np.float32) / 2
    w2 = rng.standard_normal((16, 1)).astype(np.float32) / 4
    y = np.sin(x.sum(1, keepdims=True)).astype(np.float32)
    replicated = NamedSharding(mesh, P())
    params = jax.device_put((w1, w2), replicated)

    def loss(params, xb, yb):
        h = jnp.tanh(xb @ params[0])
        return jnp.mean((h @ params[1] - yb) ** 2)

    @jax.jit
    def step(params, xb, yb):
        value, grads = jax.value_and_grad(loss)(params, xb, yb)
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), value

    xb = global_x()
    yb = jax.make_array_from_process_local_data(rows, local_rows(rows, y), y.shape)
    losses = []
    for _ in range(3):
        params, value = step(params, xb, yb)
        losses.append(float(value.addressable_data(0)))
    results["training"] = {"losses": losses, "w2": np.asarray(params[1].addressable_data(0)).tolist()}


def case_pmap():
    local = jax.local_devices(backend="ipu")
    data = np.arange(len(local) * 2, dtype=np.float32).reshape(len(local), 2) + 10 * jax.process_index()
    out = jax.pmap(lambda v: lax.psum(v, "i"), axis_name="i", devices=ipus)(data)
    results["pmap"] = np.asarray(out).tolist()


def case_multihost():
    from jax.experimental import multihost_utils
    gathered = multihost_utils.process_allgather(np.array([jax.process_index(), 7], np.int32))
    multihost_utils.sync_global_devices("distributed tests")
    broadcast = multihost_utils.broadcast_one_to_all(np.array([jax.process_index() + 5.0], np.float32))
    results["multihost"] = {"process_allgather": np.asarray(gathered).tolist(),
                            "broadcast_one_to_all": np.asarray(broadcast).tolist(),
                            "default_backend": jax.default_backend()}


def case_second_initialize():
    try:
        jax.distributed.initialize(f"127.0.0.1:{port}", num_processes, process_id)
        results["second_initialize"] = None
    except Exception as exc:   # what a user sees
        results["second_initialize"] = f"{type(exc).__name__}: {exc}"


def case_mismatch():
    """Process 1 runs a different program from the others."""
    arr = global_x()
    scale = 2.0 if jax.process_index() == 1 else 1.0
    try:
        out = shard_map(lambda v: lax.psum(v * scale, "d"))(arr)
        out.block_until_ready()
        results["mismatch"] = None
    except Exception as exc:
        results["mismatch"] = str(exc)


def case_killed_peer():
    """The last process dies before a collective; the others must fail, fast."""
    arr = global_x()
    f = shard_map(lambda v: lax.psum(v, "d"))
    f(arr).block_until_ready()                  # the transport is up
    if jax.process_index() == num_processes - 1:
        os.kill(os.getpid(), 9)
    began = time.monotonic()
    try:
        for _ in range(3):
            f(arr).block_until_ready()
        results["killed_peer"] = None
    except Exception as exc:
        results["killed_peer"] = {"error": str(exc), "seconds": time.monotonic() - began}


def case_between_processes():
    """What this process exchanged with the others: in the profile of a run
    whose collective spans processes, none in runs of local programs, and
    in all through jax_ipu.transfers_between_processes()."""
    import jax_ipu
    local = jax.local_devices(backend="ipu")
    before = jax_ipu.transfers_between_processes()
    def across_processes(v):
        return lax.psum(v, "d")
    total = shard_map(across_processes)
    arr = global_x()
    jax.effects_barrier()
    with jax_ipu.profiling() as session:         # twice: the session totals the runs'
        for _ in range(2):
            total(arr).block_until_ready()
    # By name: whatever else ran meanwhile (a global array's assembly, an
    # earlier case's last run finishing) is not this program's.
    sessions = [r["runs"]["between_processes"] for r in session.results if "across_processes" in r["program"]]
    across = [jax_ipu.last_profile(d)["between_processes"] for d in local]
    from jax_ipu.profile.text import summary
    text = summary(jax_ipu.last_profile(local[0]))
    after_across = jax_ipu.transfers_between_processes()
    here = Mesh(np.array(local), ("d",))
    jax.jit(jax.shard_map(lambda v: lax.psum(v, "d"), mesh=here, in_specs=P("d"), out_specs=P("d")))(
        jax.device_put(np.ones((len(local), 3), np.float32), NamedSharding(here, P("d")))).block_until_ready()
    inside = [jax_ipu.last_profile(d)["between_processes"] for d in local]
    jax.jit(lambda v: v + 1)(jax.device_put(np.ones(3, np.float32), local[0])).block_until_ready()
    alone = jax_ipu.last_profile(local[0])["between_processes"]
    results["between_processes"] = {"before": before, "across": across, "after_across": after_across,
                                    "sessions": sessions,
                                    "text": [line for line in text.splitlines() if "between processes" in line],
                                    "inside": inside, "alone": alone,
                                    "after": jax_ipu.transfers_between_processes()}


def _failing_program():
    """A psum after a host callback that raises on the last process only."""
    def check(v):
        if jax.process_index() == num_processes - 1:
            raise ValueError(f"bad batch on process {jax.process_index()}")
        return v
    return shard_map(lambda v: lax.psum(jax.pure_callback(check, jax.ShapeDtypeStruct(v.shape, v.dtype), v),
                                        "d"))


def _timed_failure(f, arr) -> dict | None:
    began = time.monotonic()
    try:
        f(arr).block_until_ready()
        return None
    except Exception as exc:
        return {"error": str(exc), "seconds": time.monotonic() - began}


def case_own_failure():
    """One process's run fails on its own (its callback raises) while the
    others wait for it in the psum that follows: they must fail at once,
    naming it, and so must later collectives, everywhere."""
    arr = global_x()
    total = shard_map(lambda v: lax.psum(v, "d"))
    total(arr).block_until_ready()              # the transport is up
    results["own_failure"] = {"failure": _timed_failure(_failing_program(), arr),
                              "later": _timed_failure(total, arr)}


def case_exits():
    """The last process leaves (an uncaught exception ends its script)
    while the others wait for it in a collective."""
    arr = global_x()
    f = shard_map(lambda v: lax.psum(v, "d"))
    f(arr).block_until_ready()
    if jax.process_index() == num_processes - 1:
        raise SystemExit("process leaves before the collective")
    results["exits"] = _timed_failure(f, arr)


def case_link_domains():
    """Where a collective's time goes when its IPUs are in one IPU-Link
    domain or in several (JAX_IPU_IPUS_PER_LINK_DOMAIN)."""
    import jax_ipu
    arr = global_x()
    out = {}
    for name, groups in (("all", None), ("pairs", [[0, 1], [2, 3]])):
        f = shard_map(lambda v, groups=groups: lax.psum(v, "d", axis_index_groups=groups))
        f(arr).block_until_ready()
        out[name] = jax_ipu.last_profile(jax.local_devices(backend="ipu")[0])["time_breakdown"]
    results["link_domains"] = out


for case in cases:
    globals()[f"case_{case}"]()
with open(os.path.join(out_dir, f"p{process_id}.json.tmp"), "w") as f:
    json.dump(results, f)
os.replace(os.path.join(out_dir, f"p{process_id}.json.tmp"), os.path.join(out_dir, f"p{process_id}.json"))
sys.stdout.flush()
# A process whose peer died cannot leave jax.distributed cleanly (JAX waits
# for the dead peer at shutdown, then aborts): the results are written.
if "killed_peer" in cases:
    os._exit(0)
