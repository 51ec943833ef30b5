"""Host callbacks inside ipu programs: jax.debug.print / debug.callback,
jax.pure_callback and io_callback (and so jax_ipu's feeds).

JAX emits Python callbacks only for the platforms it knows. For `ipu` the
plugin lowers them to `stablehlo.custom_call @jax_ipu.host_callback` whose
backend_config is the callback's id in this process's registry; the
compiler turns that into a host exchange (operands stream to the host, the
function runs, results stream back), charged at the host-link rate.
"""
from __future__ import annotations

import itertools
import threading

import numpy as np

from jax_ipu.errors import IpuRuntimeError
from jax_ipu.ir import HOST_CALLBACK_TARGET
from jax_ipu.targets import AS_32

# JAX runs every host callback's function on its CPU backend, placing the
# operands there first; without one (JAX_PLATFORMS=ipu) it says NO_CPU.
NO_CPU = "failed to find a local CPU device"
CPU_HINT = ("JAX runs host callbacks (jax.debug.print, debug.callback, pure_callback, io_callback, jax_ipu's "
            "feeds) on its CPU backend, which JAX_PLATFORMS=ipu leaves out: set JAX_PLATFORMS=ipu,cpu instead "
            "(the IPU stays JAX's default backend, as the platform listed first).")
_registry: dict[int, object] = {}
_ids = itertools.count()
_lock = threading.Lock()
# An attribute of a callback's function that may wait for the caller to do
# something after dispatching the program (an infeed waiting for items).
# A program calling such a callback returns from its call at once (its
# callbacks' errors reach its results); any other program calling the host
# returns once its run has ended, as on XLA:CPU, so that what its callbacks
# print or record is there when the call returns, and the call raises their
# errors.
WAITS_FOR_HOST = "_jax_ipu_waits_for_host"
_waiting: set[int] = set()


def register(fn, where: str = "", hidden_results: int = 0, waits_for_host: bool = False) -> int:
    """An id for `fn`. `where` (the user's source line) names it in errors;
    its first `hidden_results` results (the ordering token) are not the
    user's and are not counted when a result is named."""
    with _lock:
        callback_id = next(_ids)
        _registry[callback_id] = (fn, where, hidden_results)
        if waits_for_host:
            _waiting.add(callback_id)
    return callback_id


def waits_for_host(callback_id: int) -> bool:
    """Whether the callback may wait for what its caller does after
    dispatching the program (see WAITS_FOR_HOST)."""
    return callback_id in _waiting


def _user_function_waits(callback) -> bool:
    """Whether the function JAX's lowering wraps (io_callback's and
    pure_callback's closure over a _FlatCallback) is marked WAITS_FOR_HOST."""
    for cell in getattr(callback, "__closure__", None) or ():
        try:
            inner = getattr(cell.cell_contents, "callback_func", None)
        except ValueError:           # an empty cell
            continue
        if getattr(inner, WAITS_FOR_HOST, False):
            return True
    return False


_caller = threading.local()


def caller():
    """(launch, rank, count) while IPU `rank` of the `count` that each run
    the callback in one launch (pmap, shard_map) calls the host; None for a
    program on one IPU, or on a backend other than ipu."""
    return getattr(_caller, "value", None)


def call(callback_id: int, args: list[np.ndarray], result_specs,
         caller_of_this_call=None) -> list[np.ndarray]:
    """Runs a registered callback on host copies of `args` and checks what
    it returns against `result_specs` [(shape, dtype)]. caller() returns
    `caller_of_this_call` while it runs."""
    try:
        fn, where, hidden = _registry[callback_id]
    except KeyError:
        raise IpuRuntimeError(f"host callback {callback_id} is not registered in this process "
                              "(programs with callbacks cannot be serialized)") from None
    name = f"the host callback at {where}" if where else "the host callback"
    outer, _caller.value = caller(), caller_of_this_call     # a callback may run programs calling the host
    try:
        results = fn(*args)
    except RuntimeError as exc:
        if NO_CPU in str(exc):
            raise IpuRuntimeError(f"{name} could not run: {exc} {CPU_HINT}") from exc
        raise
    finally:
        _caller.value = outer
    if len(results) != len(result_specs):
        raise IpuRuntimeError(f"{name} returned {len(results) - hidden} values, "
                              f"the program expects {len(result_specs) - hidden}")
    out = []
    for i, (value, (shape, dtype)) in enumerate(zip(results, result_specs, strict=True)):
        value = np.asarray(value)
        if AS_32.get(value.dtype) == dtype:   # a 64-bit result of a program run as 32-bit
            value = value.astype(dtype)
        if value.shape != tuple(shape) or value.dtype != dtype:
            raise IpuRuntimeError(f"{name}: result {i - hidden} should be {np.dtype(dtype).name}{list(shape)} "
                                  f"(its result_shape_dtypes), it returned {value.dtype.name}{list(value.shape)}")
        out.append(value)
    return out


def _once_on(axis_context, sharding) -> int | None:
    """The partition that calls the host for all, in a program over several
    partitions with bulk-array semantics (jit of sharded arrays): JAX gives
    such a callback a maximal sharding on one device (the first, unless
    pure_callback's `sharding` names another), so that it runs once on
    the whole value. None: every IPU calls it (one device, pmap, or
    shard_map's per-shard semantics)."""
    from jax._src import sharding_impls

    if not isinstance(axis_context, sharding_impls.ShardingContext) or axis_context.num_devices <= 1:
        return None
    for entry in getattr(sharding, "shardings", None) or ():       # Shardy: SdyArrayList
        ids = getattr(entry, "logical_device_ids", None)
        if ids:
            return int(ids[0])
    devices = getattr(sharding, "tile_assignment_devices", None)  # GSPMD: a maximal OpSharding
    return int(devices[0]) if devices else 0


def _with_token_sharding(sharding, token, result_avals):
    """A Shardy annotation of the call's results, its token first (as JAX
    annotates its own callbacks' tokens: on the calling device); with no
    result but the token, the one annotation is the token's."""
    from jax._src.sharding_impls import SdyArray, SdyArrayList

    if token is None or not result_avals or not isinstance(sharding, SdyArrayList):
        return sharding
    first = sharding.shardings[0]
    return SdyArrayList((SdyArray(mesh_shape=(), dim_shardings=(), logical_device_ids=first.logical_device_ids),
                         *sharding.shardings))


def _emit(original):
    """Wraps jax's emit_python_callback: `ipu` gets the host-callback custom
    call; every other platform keeps JAX's own lowering."""
    from jax._src.interpreters import mlir
    from jax._src.lib.mlir.dialects import hlo

    def emit_python_callback(ctx, callback, token, operands, operand_avals, result_avals, *,
                             has_side_effect, returns_token=True, partitioned=False, sharding=None):
        if list(ctx.module_context.platforms) != ["ipu"]:
            return original(ctx, callback, token, operands, operand_avals, result_avals,
                            has_side_effect=has_side_effect, returns_token=returns_token,
                            partitioned=partitioned, sharding=sharding)
        waits = _user_function_waits(callback)
        if token is not None:
            # The compiled program passes tokens as empty bool arrays.
            inner = callback

            def callback(token_value, *args):
                return (token_value, *inner(*args))
        from jax_ipu.stablehlo import locations
        callback_id = register(callback, where=locations.describe(str(mlir.ir.Location.current)),
                               hidden_results=0 if token is None else 1, waits_for_host=waits)
        config = str(callback_id)
        once = _once_on(ctx.module_context.axis_context, sharding)
        if once is not None:
            config += f"@{once}"
        result_types = [mlir.aval_to_ir_type(ctx.module_context, a) for a in result_avals]
        all_operands = list(operands)
        if token is not None:
            all_operands = [token, *all_operands]
            result_types = [hlo.TokenType.get(), *result_types]
        op = mlir.custom_call(HOST_CALLBACK_TARGET, result_types=result_types, operands=all_operands,
                              backend_config=config, has_side_effect=has_side_effect)
        if sharding is not None:
            # JAX's own annotation of the call (maximal on the calling
            # device, or manual in shard_map), which code reading the
            # lowered text looks for; the compiler reads the partition
            # from backend_config.
            mlir.set_sharding(ctx.module_context, op, _with_token_sharding(sharding, token, result_avals))
        results = list(op.results)
        if token is not None:
            token, *results = results
        return results, token, None

    emit_python_callback.__wrapped__ = original
    return emit_python_callback


def _no_fast_path_with_ordered_effects(original):
    """Wraps MeshExecutable.create_cpp_call, the fast path of an AOT-compiled
    program (jit(f).lower(...).compile()) from its second call on. JAX
    refuses it for programs with host callbacks or unordered effects but
    not for ordered effects alone, which on its own platforms always come
    with host callbacks. ipu callbacks are custom calls, not JAX host
    callbacks, so the fast path would call the program without its runtime
    token ('main takes 2 arguments, got 1'); such programs keep the Python
    path, which passes the token, as jit's own fast path does."""
    def create_cpp_call(self, params):
        if getattr(getattr(self, "unsafe_call", None), "ordered_effects", None):
            return None
        return original(self, params)

    create_cpp_call.__wrapped__ = original
    return create_cpp_call


def install() -> None:
    """Registers the ipu lowerings of JAX's callback primitives, and this
    module as the host side of the Model's HostCall steps (idempotent)."""
    from jax._src import callback, debugging
    from jax._src.interpreters import mlir, pxla

    from jax_ipu.model import engine
    from jax_ipu.pjrt import executable

    engine.host_caller = call
    executable.host_waits = waits_for_host

    if not hasattr(callback.emit_python_callback, "__wrapped__"):
        callback.emit_python_callback = _emit(callback.emit_python_callback)
    if not hasattr(pxla.MeshExecutable.create_cpp_call, "__wrapped__"):
        pxla.MeshExecutable.create_cpp_call = _no_fast_path_with_ordered_effects(
            pxla.MeshExecutable.create_cpp_call)
    # JAX registers these two only for the platforms it knows.
    mlir.register_lowering(debugging.debug_callback_p, debugging.debug_callback_lowering, platform="ipu")
    mlir.register_lowering(debugging.debug_print_p, debugging.debug_print_lowering_rule, platform="ipu",
                           cacheable=False)
