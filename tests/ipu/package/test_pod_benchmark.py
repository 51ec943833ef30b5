"""benchmarks/pod.py, the POD-scale estimate, in its cheap mode (the stem
and one bottleneck block on 32 tiles, 4 IPUs): its figures are composed of
the compiled programs' estimates, and the gradient all-reduces are
charged as rings over the replicas' IPU-Links from the target's link
figures, one per gradient tensor."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from jax_ipu.targets import get_target

POD = os.path.join(os.path.dirname(__file__), "..", "..", "..", "benchmarks", "pod.py")


@pytest.fixture(scope="module")
def small():
    env = dict(os.environ)
    env.pop("JAX_IPU_DEVICE_COUNT", None)
    out = subprocess.run([sys.executable, POD, "--small", "--json"], env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout, json.loads(out.stdout.strip().splitlines()[-1])


def ring_all_reduce(target, nbytes: int, n: int) -> int:
    """2(n-1)/n of the data through each IPU's links, 2(n-1) hops, a sync."""
    per_cycle = target.ipu_link_bytes_per_second * target.ipu_links_per_hop / target.clock_hz
    return (math.ceil(2 * (n - 1) / n * nbytes / per_cycle) + 2 * (n - 1) * target.ipu_link_latency_cycles
            + target.ipu_sync_cycles)


def test_pod_step_is_its_micro_batches_and_its_update(small):
    text, r = small
    pod, accumulate, update = r["pod"], r["accumulate"], r["update"]
    assert pod["replicas"] == 4 and pod["accumulate"] == 2
    assert pod["cycles"] == 2 * accumulate["cycles"] + update["cycles"]
    clock = get_target("ipu2", num_tiles=32).clock_hz
    images = 2 * 2          # micro-batch 2, 2 accumulated
    assert pod["images_per_s_per_ipu"] == pytest.approx(images / (pod["cycles"] / clock))
    assert pod["images_per_s"] == pytest.approx(4 * pod["images_per_s_per_ipu"])
    assert r["one_ipu"]["images_per_s"] == pytest.approx(2 / (r["one_ipu"]["cycles"] / clock))
    assert pod["fits"] == (accumulate["fits"] and update["fits"])
    # Printed beside each other, and beside Graphcore's figure.
    assert "one IPU" in text and "images/s on 4 IPUs" in text and "1,720 images/s per IPU" in text


def test_gradient_all_reduces_are_rings_over_the_replicas_links(small):
    _, r = small
    update, pod = r["update"], r["pod"]
    target = get_target("ipu2", num_tiles=32)
    # JAX's pmean is an all-reduce per gradient tensor; the compiler
    # combines them into one buffer, which pays the hop latencies and the
    # sync once.
    assert pod["gradient_tensors"] > 1
    assert update["all_reduces"] == len(update["all_reduce_bytes"]) == 1
    assert set(update["all_reduce_groups"]) == {4}
    assert sum(update["all_reduce_bytes"]) == pod["gradient_bytes"]
    assert update["all_reduce_link_cycles"] == ring_all_reduce(target, pod["gradient_bytes"], 4)
    # The all-reduce step is its link time plus an on-tile reduction, in the update.
    assert update["all_reduce_link_cycles"] < update["all_reduce_cycles"] < update["cycles"]
