"""Large element-wise chains with ops numpy does slowly run as one kernel
compiled by XLA:CPU (jaxlib's, already in this process) instead of one
numpy pass per op.

Why: numpy's float32 tanh, exp, log, sin... are scalar loops on AVX2
machines (tanh 2.7 ns an element against 0.12 ns for a multiply) and our
emulations of XLA's integer division, float-to-int conversion or
reduce_precision take several passes; XLA fuses the chain into one loop and
vectorises it. The values are then XLA's, element by element, which is what
the Model's numpy kernels imitate anyway; a chain is element-wise, so the
vertices' partition over tiles does not change them.

Used when jax has a CPU backend in this process (not with
JAX_PLATFORMS=ipu) and JAX_IPU_MODEL_XLA_CHAINS is not 0; a chain XLA cannot
take (float16 arithmetic, whose per-op rounding must stay the IPU's;
total-order compares; odd broadcasts) runs on numpy as before.
"""
from __future__ import annotations

import functools
import logging
import os
import threading

import numpy as np

from jax_ipu.graph import codelets
from jax_ipu.ops import FAST_IN_NUMPY, OPS
from jax_ipu.graph.views import View

log = logging.getLogger(__name__)

ENABLED = os.environ.get("JAX_IPU_MODEL_XLA_CHAINS", "1").strip().lower() not in {"0", "false", "no", "off"}
# From this many elements a chain with a slow op goes to XLA. Below it the
# gain is small (a 64K-element tanh: 235 us against 285 us) and XLA's
# thread pool, woken for the kernel, slows the matmuls that follow: an MLP's
# forward and backward took 4% longer with 64K-element chains on XLA.
MIN_ELEMENTS = 1 << 17
# dtypes whose arithmetic XLA:CPU does as the IPU does (float16 and
# bfloat16 are widened inside a fusion, so they stay on numpy).
_DTYPES = frozenset(np.dtype(t) for t in (np.float32, np.int32, np.uint32, np.int16, np.uint16,
                                          np.int8, np.uint8, np.bool_))



@functools.cache
def _cpu():
    """(the CPU device, jaxlib's module) or None when this process has no
    XLA:CPU backend (JAX_PLATFORMS without cpu)."""
    try:
        import jax
        from jax._src.lib import _jax
        return jax.devices("cpu")[0], _jax
    except Exception as exc:       # noqa: BLE001 - any failure just means numpy
        log.info("element-wise chains run on numpy: no XLA:CPU backend (%s)", exc)
        return None


def wanted(k: codelets.ElementwiseChain) -> bool:
    """Whether this chain should run on XLA:CPU."""
    size = int(np.prod(k.shape, dtype=np.int64))
    return (ENABLED and size >= MIN_ELEMENTS
            and any(ins.op not in FAST_IN_NUMPY for ins in k.instructions)
            and all(np.dtype(s.dtype) in _DTYPES for s in k.inputs)
            and all(ins.dtype in _DTYPES for ins in k.instructions)
            and all(s.shape == k.shape or (s.size == 1 if isinstance(s, View) else np.ndim(s) == 0)
                    for s in k.inputs)
            and all(t.shape == k.shape for _, t in k.outputs))


_compile_lock = threading.Lock()


def build(k: codelets.ElementwiseChain, reader):
    """fn(state) running the chain as one XLA:CPU kernel, or None when XLA
    cannot take it (then numpy does)."""
    found = _cpu()
    if found is None:
        return None
    device, jaxlib = found
    arg_regs = [r for r, s in enumerate(k.inputs) if isinstance(s, View)]
    variants = {}          # layout key -> executable

    def executable_for(key: int):
        with _compile_lock:
            if key not in variants:
                variants[key] = _compile(k, device, arg_regs, key)
            return variants[key]
    try:
        executable_for(0)
    except Exception as exc:       # noqa: BLE001 - numpy runs what XLA will not take
        log.info("element-wise chain on numpy (%s: %s)", type(exc).__name__, exc)
        return None
    from jax._src import core
    from jax.sharding import SingleDeviceSharding

    sharding = SingleDeviceSharding(device)
    zero_copy = jaxlib.HostBufferSemantics.ZERO_COPY
    put = jaxlib.batched_device_put
    feeds = []
    for reg in arg_regs:
        source, shape, _ = _fed(k, reg)
        # The staging buffer is made at the first misaligned input, if small.
        feeds.append([reader(source), shape, source.dtype,
                      core.ShapedArray(shape, source.dtype), core.ShapedArray(shape[::-1], source.dtype), None])
    outs = [(t.id, t.dtype) for _, t in k.outputs]
    devices = [device]

    def run_on_xla(state):
        args = []
        key = 0
        for i, feed in enumerate(feeds):
            get, shape, dtype, aval, transposed_aval, staging = feed
            value = get(state)
            if value.shape != shape:
                value = value.reshape(shape)
            if value.flags.c_contiguous:
                pass
            elif value.flags.f_contiguous:
                # A tensor the Model holds transposed (a transposing Copy keeps
                # its source's layout): the kernel reads it in that layout,
                # which costs XLA far less than a strided copy costs numpy.
                value, aval = value.T, transposed_aval
                key |= 1 << i
            else:
                value = np.ascontiguousarray(value)
            if value.ctypes.data % ALIGNMENT:
                # XLA:CPU takes 64-byte aligned memory as it is; any other it
                # copies, slowly (50 us for 256 KiB, against 10 us here).
                if value.nbytes > STAGING_KEPT:
                    value = aligned_copy(value)
                else:
                    if staging is None:
                        staging = feed[5] = _aligned_empty(value.nbytes)
                    value = _copy_into(staging, value)
            args.append(put(aval, sharding, [value], devices, True, False, zero_copy))
        executable = variants.get(key) or executable_for(key)
        results = executable.execute_sharded(args).disassemble_into_single_device_arrays()
        for (tid, dtype), [result] in zip(outs, results):
            value = np.asarray(result)          # XLA's buffer, read-only: never written in place
            target = state[tid]
            if target is not None and target.flags.writeable:   # a donated buffer, written in place
                np.copyto(target, value, casting="unsafe")
            else:
                state[tid] = value
    return run_on_xla


def _copy_into(staging: np.ndarray, value: np.ndarray) -> np.ndarray:
    out = staging[:value.nbytes].view(value.dtype).reshape(value.shape)
    np.copyto(out, value)
    return out


# XLA:CPU's minimum alignment for using host memory in place.
ALIGNMENT = 64
# Misaligned inputs up to this size are copied into a buffer the chain
# keeps; larger ones into a fresh one each run (kept, they held a large
# model's size again on every IPU).
STAGING_KEPT = 1 << 20


def aligned_copy(array) -> np.ndarray:
    """A C-ordered copy of `array`; from 4 KiB, starting at a multiple of
    ALIGNMENT, so that chain kernels read it in place (host-to-device
    transfers land in these)."""
    array = np.asarray(array)
    if array.nbytes < 4096:
        return np.array(array, order="C", copy=True)
    out = _aligned_empty(array.nbytes).view(array.dtype).reshape(array.shape)
    np.copyto(out, array)
    return out


def _aligned_empty(nbytes: int) -> np.ndarray:
    """nbytes of uint8 starting at a multiple of ALIGNMENT."""
    raw = np.empty(nbytes + ALIGNMENT, np.uint8)
    start = -raw.ctypes.data % ALIGNMENT
    return raw[start:start + nbytes]


# View ops the kernel applies itself: the host then neither copies a
# transposed layout into C order (100 us for 256 KiB) nor builds the
# repeated elements of a broadcast.
_KERNEL_VIEW_OPS = {"reshape", "transpose", "broadcast"}


def _fed(k: codelets.ElementwiseChain, reg: int):
    """(the view the host reads for input `reg`, its shape in the kernel,
    the view ops the kernel applies to it)."""
    source = k.inputs[reg]
    if source.size > 1 and source.ops and all(op[0] in _KERNEL_VIEW_OPS for op in source.ops):
        return View(source.tensor), source.tensor.shape, source.ops
    return source, (k.shape if source.size > 1 else ()), ()


_LAX_VIEW_OPS = {
    "reshape": lambda lax, x, shape: lax.reshape(x, tuple(shape)),
    "transpose": lambda lax, x, perm: lax.transpose(x, tuple(perm)),
    "broadcast": lambda lax, x, shape, dims: lax.broadcast_in_dim(x, tuple(shape), tuple(dims)),
}


def _compile(k: codelets.ElementwiseChain, device, arg_regs: list[int], transposed: int):
    """The chain as an XLA:CPU executable taking the registers `arg_regs`;
    bit i of `transposed` says argument i comes transposed (its C-order
    data is the tensor's transpose)."""
    import jax
    from jax.sharding import SingleDeviceSharding

    ops = {name: op.lax(jax.lax) for name, op in OPS.items()}

    def chain(*args):
        regs = list(k.inputs)
        for i, (reg, value) in enumerate(zip(arg_regs, args)):
            if transposed >> i & 1:
                value = jax.lax.transpose(value, tuple(range(value.ndim))[::-1])
            _, _, view_ops = _fed(k, reg)
            for op in view_ops:
                value = _LAX_VIEW_OPS[op[0]](jax.lax, value, *op[1:])
            regs[reg] = value.reshape(k.shape) if view_ops else value
        for ins in k.instructions:
            operands = [regs[a] for a in ins.args]
            if any(np.ndim(a) for a in operands):     # lax broadcasts no scalar operand of a select
                operands = [full(a) for a in operands]
            attrs = dict(ins.attrs)
            if ins.op == "constant":
                value = np.asarray(attrs["value"], ins.dtype)
            elif ins.op == "convert":
                value = jax.lax.convert_element_type(operands[0], ins.dtype)
            elif ins.op == "bitcast_convert":
                value = jax.lax.bitcast_convert_type(operands[0], ins.dtype)
            elif ins.op in ("compare", "reduce_precision"):
                value = ops[ins.op](*operands, **attrs)
            else:
                value = ops[ins.op](*operands)
            if np.dtype(value.dtype) != ins.dtype:
                raise TypeError(f"{ins.op} gave {value.dtype}, the chain says {ins.dtype}")
            regs.append(value)
        return [full(regs[r]) for r, _ in k.outputs]

    def full(value):
        return value if np.ndim(value) else jax.lax.broadcast_in_dim(value, k.shape, ())

    sharding = SingleDeviceSharding(device)
    specs = [jax.ShapeDtypeStruct(shape[::-1] if transposed >> i & 1 else shape, view.dtype, sharding=sharding)
             for i, (view, shape, _) in enumerate(_fed(k, r) for r in arg_regs)]
    return jax.jit(chain).lower(*specs).compile().runtime_executable()
