"""JAX's `jax_plugins` entry point: registers the `ipu` platform.

JAX imports this module and calls initialize() when it first looks for
backends; CPU stays the default backend unless JAX_PLATFORMS=ipu.
"""
PLATFORM = "ipu"
# Below CPU's priority (0): CPU stays the default backend, as Graphcore's
# performance guide advises (initialise on CPU, run the update on the IPU).
PRIORITY = -100


def initialize() -> None:
    from jax._src import xla_bridge
    from jax._src.interpreters import mlir
    from jaxlib.mlir.dialects import stablehlo

    from jax_ipu.frontend import callbacks, jax_rules
    from jax_ipu.pjrt import _capi

    def version(text: str) -> tuple[int, ...]:
        return tuple(int(part) for part in text.split("."))

    _capi.set_plugin_attributes([
        ("xla_version", 2),
        ("stablehlo_current_version", version(stablehlo.get_current_version())),
        ("stablehlo_minimum_version", version(stablehlo.get_minimum_version())),
    ])
    # JAX only donates buffers on platforms it lists; IPU donation is real
    # (the donated array stays in tile memory and is reused in place).
    if PLATFORM not in mlir._platforms_with_donation:
        mlir._platforms_with_donation.append(PLATFORM)
    xla_bridge._nonexperimental_plugins.add(PLATFORM)
    capsule = _capi.api_capsule()
    xla_bridge.register_plugin(PLATFORM, priority=PRIORITY, c_api=capsule)
    # JAX registers the profiler of plugins it loads from a library path,
    # not of those given as a capsule: jax.profiler traces show the IPUs
    # once registered here (profile/tracing.py).
    from jax._src.lib import _profiler
    _profiler.register_plugin_profiler(capsule)
    jax_rules.register()
    callbacks.install()
