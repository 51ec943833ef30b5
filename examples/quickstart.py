"""A first program on the IPU Model: a small MLP layer, run on the IPU and
checked against the CPU backend.

    python examples/quickstart.py
"""
import jax
import jax.numpy as jnp
import numpy as np

import jax_ipu


def layer(params, x):
    return jax.nn.relu(x @ params["w"] + params["b"]).sum(axis=0)


def main() -> None:
    ipu = jax.devices("ipu")[0]
    print("JAX devices:", jax.devices("ipu"), "| default backend:", jax.default_backend())
    print("IPU target :", ipu.device_kind)

    rng = np.random.default_rng(0)
    params = {"w": rng.standard_normal((256, 128)).astype(np.float32),
              "b": rng.standard_normal(128).astype(np.float32)}
    x = rng.standard_normal((64, 256)).astype(np.float32)

    on_ipu = jax.jit(layer)(jax.device_put(params, ipu), jax.device_put(x, ipu))
    on_cpu = jax.jit(layer)(params, x)
    print("result on  :", on_ipu.devices())
    print("first values:", np.asarray(on_ipu)[:4])
    err = float(jnp.max(jnp.abs(np.asarray(on_ipu) - np.asarray(on_cpu))))
    print(f"max |ipu - cpu| = {err:.2e}")

    compiled = jax.jit(layer).lower(jax.device_put(params, ipu), jax.device_put(x, ipu)).compile()
    cost = compiled.cost_analysis()
    cycles = cost.get("estimated_cycles", 0.0)
    print(f"IPU Model estimate: {cycles:,.0f} cycles = {jax_ipu.estimated_seconds(cycles, ipu) * 1e6:.1f} us "
          f"on {jax_ipu.target(ipu).describe()}")
    assert err < 1e-3, "IPU and CPU disagree"


if __name__ == "__main__":
    main()
