"""A pytest plugin (run.py passes `-p as_gpu` for the files it lists in
AS_GPU_FILES): JAX's tests then take the device under test for a GPU
(jax._src.test_util's jax_test_dut), so that those JAX gates on a TPU or a
GPU (memory kinds, host offloading, compute_on in memories_test) run on
the IPU, which implements them. Checks JAX keeps for GPUs alone (stream
annotations) fail and are listed in known_failures.txt."""


def pytest_configure(config):
    import jax
    from jax._src import test_util  # noqa: F401  (defines the jax_test_dut option)

    jax.config.update("jax_test_dut", "gpu")
