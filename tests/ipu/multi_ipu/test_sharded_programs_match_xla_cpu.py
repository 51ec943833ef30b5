"""Sharded programs that gave wrong answers or were refused (JAX's pjit and
shard_map tests found them): on 8 IPUs against 8 XLA:CPU devices with the
same mesh, values and result shardings (the programs are in
sharding_cases.py, run in one subprocess, which alone can have 8 devices
of each platform)."""
import json
import os

import pytest

from helpers import run_python

CASES = os.path.join(os.path.dirname(__file__), "sharding_cases.py")
NAMES = ["matmul_output_split_along_another_axis", "matmul_with_one_axis_split_on_both_dimensions_of_an_operand",
         "matmul_resharded_between_two_dimensional_layouts", "constraint_moves_an_axis_between_dimensions",
         "unreduced_sum_carried_into_a_shard_map", "unreduced_result_of_a_jit",
         "shard_map_without_replication_checks_and_its_gradient", "all_gather_to_reduced_and_its_gradient",
         "shard_map_over_some_axes", "nested_shard_maps", "device_put_between_meshes", "loop_over_split_weights",
         "offload_of_a_split_value", "partial_sums_offloaded_whole", "whole_value_stored_split",
         "reversed_split_dimension", "values_split_alike",
         "sharding_inspected_inside_jit"]


@pytest.fixture(scope="module")
def outcomes():
    proc = run_python(open(CASES).read(), JAX_IPU_DEVICE_COUNT="8", JAX_NUM_CPU_DEVICES="8")
    found = {}
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            entry = json.loads(line)
            found[entry["case"]] = entry["problems"]
    assert found, proc.stderr[-3000:]
    return found


@pytest.mark.parametrize("name", NAMES)
def test_matches_xla_cpu_on_the_same_mesh(outcomes, name):
    assert name in outcomes, f"{name} did not run"
    assert not outcomes[name], "\n".join(outcomes[name])
