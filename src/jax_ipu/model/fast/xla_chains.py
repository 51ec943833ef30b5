"""Large element-wise chains with ops numpy does slowly run as one kernel
compiled by XLA:CPU (jaxlib's, already in this process) instead of one
numpy pass per op.

Why: numpy's float32 tanh, exp, log, sin... are scalar loops on AVX2
machines (an order of magnitude slower than a multiply) and our
emulations of XLA's integer division, float-to-int conversion or
reduce_precision take several passes; XLA fuses the chain into one loop and
vectorises it. The values are then XLA's, element by element, which is what
the Model's numpy kernels imitate anyway; a chain is element-wise, so the
vertices' partition over tiles does not change them.

Float16 chains go to XLA too, whatever their ops (numpy's float16
arithmetic is a scalar loop, even for an add), with every op
rounded to its type as on the IPU: see _rounded. Their unary ops are only
taken when XLA gives numpy's bits for every float16 input on this host
(_f16_op_agrees); the binary ones are IEEE operations, correctly rounded on
both.

Used when jax has a CPU backend in this process (not with
JAX_PLATFORMS=ipu) and JAX_IPU_MODEL_XLA_CHAINS is not 0; a chain XLA cannot
take (total-order compares; float16 ops whose values would differ; odd
broadcasts) runs on numpy as before.
"""
from __future__ import annotations

import collections
import functools
import logging
import os
import threading

import numpy as np

from jax_ipu.graph import codelets
from jax_ipu.graph.views import View
from jax_ipu.ops import FAST_IN_NUMPY, OPS, function_for, ufunc_for

log = logging.getLogger(__name__)

ENABLED = os.environ.get("JAX_IPU_MODEL_XLA_CHAINS", "1").strip().lower() not in {"0", "false", "no", "off"}
# From this many elements a chain with a slow op goes to XLA. Below it the
# gain is small and XLA's thread pool, woken for the kernel, slows the
# matmuls that follow (model-speed.md).
MIN_ELEMENTS = 1 << 17
# dtypes whose arithmetic XLA:CPU does as the IPU does (float16 with each
# op's result rounded: _rounded).
_DTYPES = frozenset(np.dtype(t) for t in (np.float32, np.int32, np.uint32, np.int16, np.uint16,
                                          np.int8, np.uint8, np.bool_))
_F16 = np.dtype(np.float16)
# Unary float ops both compute exactly (correctly rounded or exact).
_EXACT_UNARY = frozenset({"negate", "abs", "sqrt", "floor", "ceil", "round_nearest_even", "is_finite", "sign"})
# Ops of float16 operands XLA:CPU computes as numpy does, by IEEE's rules
# (correctly rounded arithmetic, exact selections and comparisons; max and
# min of +0 and -0 are XLA's, -0 below +0, where numpy returns its first
# operand, as in float32 chains on XLA). Unary
# float ops are checked instead, on every float16 value (_f16_op_agrees).
_F16_EXACT = frozenset({"add", "subtract", "multiply", "divide", "maximum", "minimum", "compare", "select",
                        "clamp", "constant"})



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
    half = _has_f16(k)
    return (ENABLED and size >= MIN_ELEMENTS
            and (half or any(ins.op not in FAST_IN_NUMPY for ins in k.instructions))
            and all(np.dtype(s.dtype) in _DTYPES or np.dtype(s.dtype) == _F16 for s in k.inputs)
            and all(ins.dtype in _DTYPES or ins.dtype == _F16 for ins in k.instructions)
            and (not half or _f16_ops_agree(k))
            and all(s.shape == k.shape or (s.size == 1 if isinstance(s, View) else np.ndim(s) == 0)
                    for s in k.inputs)
            and all(t.shape == k.shape for _, t in k.outputs))


def _has_f16(k: codelets.ElementwiseChain) -> bool:
    return (any(ins.dtype == _F16 for ins in k.instructions)
            or any(np.dtype(s.dtype) == _F16 for s in k.inputs))


def _f16_ops_agree(k: codelets.ElementwiseChain) -> bool:
    """Whether every op of a chain holding float16 values gives numpy's
    values on XLA:CPU: the IEEE ones; conversions between float types (and
    from bool), which round to nearest even on both; unary float16 ops
    whose XLA kernel gives numpy's bits for all 65,536 float16 inputs;
    unary float32 ops that are exact. (The chain then gives the numpy
    kernel's bits, where a float32 chain on XLA takes XLA's values.)"""
    dtypes = [np.dtype(s.dtype) for s in k.inputs] + [ins.dtype for ins in k.instructions]
    for ins in k.instructions:
        operands = [dtypes[a] for a in ins.args]
        if ins.op == "bitcast_convert":
            return False          # a NaN's payload would show, which XLA need not keep as numpy does
        if ins.op == "convert":
            if ins.dtype.kind != "f" or operands[0].kind not in "fb":
                return False
        elif ins.op == "compare" and dict(ins.attrs).get("compare_type") == "TOTALORDER":
            return False
        elif ins.op in _F16_EXACT:
            continue
        elif _F16 in operands:
            if OPS[ins.op].arity != 1 or ins.attrs or not _f16_op_agrees(ins.op):
                return False
        elif any(d.kind == "f" for d in operands) and ins.op not in _EXACT_UNARY:
            # A float32 step of the chain (XLA's rsqrt or exp is an ulp off numpy's).
            return False
    return True


@functools.cache
def _f16_op_agrees(op: str) -> bool:
    """Whether XLA:CPU's float16 `op` gives the bits of the Model's numpy
    kernel (ops.py's) for every float16 input, checked once per process.
    Transcendental float16 ops are approximations that may differ between
    the two (exp: 4 of 65,536 values on one AVX-512 host), and such an op
    keeps its chain on numpy."""
    found = _cpu()
    if found is None:
        return False
    import jax

    values = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    ufunc = ufunc_for(op, _F16)
    with np.errstate(all="ignore"):
        want = np.asarray(ufunc(values) if ufunc is not None else function_for(op)(values, dtype=_F16, attrs={}))
    try:
        got = np.asarray(jax.jit(OPS[op].lax(jax.lax))(jax.device_put(values, found[0])))
    except Exception as exc:       # noqa: BLE001 - an op XLA will not take stays on numpy
        log.info("float16 %s stays on numpy (%s)", op, exc)
        return False
    if got.dtype != want.dtype or got.shape != want.shape:
        return False
    if want.dtype != _F16:
        return bool(np.array_equal(got, want))
    same = (got.view(np.uint16) == want.view(np.uint16)) | (np.isnan(got) & np.isnan(want))
    return bool(same.all())


def _rounded(jax, value, zero, shape=None):
    """`value`, a float op's result or an immediate, through an identity
    XLA:CPU and LLVM cannot see through (its bits xor'ed with `zero`, a
    run-time argument that is 0), so that it is rounded to its type before
    the next op reads it, and no immediate is folded into another op. Without it, XLA keeps a fused chain's float16 intermediates in
    float32 and contracts a multiply into the add that reads it (h + h*h*h
    * c, GELU's start: many elements differed from per-op rounding);
    with it, each op rounds as on the IPU and in numpy. Float32 ops get it
    too, so that a float16 chain's float32 steps (a layer norm's
    statistics) round as numpy's do, with no fused multiply-add. `shape`:
    made opaque element by element, as a divisor must be."""
    width = {2: np.uint16, 4: np.uint32}.get(np.dtype(value.dtype).itemsize)
    if np.dtype(value.dtype).kind != "f" or width is None:
        return value
    zero = zero.astype(width)
    if shape:
        # Varying by element (an index and'ed with zero): no broadcast left.
        zero = jax.lax.broadcasted_iota(width, shape, len(shape) - 1) & zero
    bits = jax.lax.bitcast_convert_type(value, width) ^ zero
    return jax.lax.bitcast_convert_type(bits, value.dtype)


_compile_lock = threading.Lock()
# Executables by what they compute (_signature): a network repeats its
# blocks, so a large float16 training step has hundreds of chains of a
# few dozen kinds, each compiled once.
_EXECUTABLES: collections.OrderedDict = collections.OrderedDict()
EXECUTABLES_KEPT = 1024


def _signature(k: codelets.ElementwiseChain, device, arg_regs: list[int], transposed: int) -> str:
    """What _compile's executable depends on, without the tensors' identities."""
    inputs = []
    for reg, source in enumerate(k.inputs):
        if isinstance(source, View):
            _, shape, view_ops = _fed(k, reg)
            inputs.append(("view", str(source.dtype), tuple(source.tensor.shape), tuple(shape), _key(view_ops)))
        else:
            inputs.append(_key(np.asarray(source)))
    return repr((id(device), tuple(k.shape), tuple(arg_regs), transposed, inputs,
                 [(ins.op, tuple(ins.args), str(ins.dtype), _key(ins.attrs)) for ins in k.instructions],
                 [(reg, str(t.dtype), tuple(t.shape)) for reg, t in k.outputs]))


def _key(obj):
    """obj (attributes, view ops) as a hashable key, arrays by their bytes
    (numpy's repr elides the middle of a large one)."""
    if isinstance(obj, (np.ndarray, np.generic)):
        return ("array", str(obj.dtype), obj.shape, np.asarray(obj).tobytes())
    if isinstance(obj, (tuple, list)):
        return tuple(_key(x) for x in obj)
    if isinstance(obj, dict):
        return tuple(sorted((k, _key(v)) for k, v in obj.items()))
    return repr(obj)


def _compiled(k: codelets.ElementwiseChain, device, arg_regs: list[int], transposed: int):
    """_compile's executable, shared by chains computing the same thing
    (called under _compile_lock)."""
    key = _signature(k, device, arg_regs, transposed)
    executable = _EXECUTABLES.get(key)
    if executable is None:
        executable = _EXECUTABLES[key] = _compile(k, device, arg_regs, transposed)
        while len(_EXECUTABLES) > EXECUTABLES_KEPT:
            _EXECUTABLES.popitem(last=False)
    else:
        _EXECUTABLES.move_to_end(key)
    return executable


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
                variants[key] = _compiled(k, device, arg_regs, key)
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
    # The run-time zero of _rounded (float16 chains), put once: executions
    # read it and never donate it.
    zero = [put(core.ShapedArray((), np.uint32), sharding, [np.zeros((), np.uint32)], devices, True, False,
                jaxlib.HostBufferSemantics.IMMUTABLE_ONLY_DURING_CALL)] if _has_f16(k) else []

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
                # copies, more slowly than this copy.
                if value.nbytes > STAGING_KEPT:
                    value = aligned_copy(value)
                else:
                    if staging is None:
                        staging = feed[5] = _aligned_empty(value.nbytes)
                    value = _copy_into(staging, value)
            args.append(put(aval, sharding, [value], devices, True, False, zero_copy))
        executable = variants.get(key) or executable_for(key)
        results = executable.execute_sharded(args + zero).disassemble_into_single_device_arrays()
        for (tid, _), [result] in zip(outs, results, strict=True):
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
# transposed layout into C order nor builds the
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

    half = _has_f16(k)

    def chain(*args):
        if half:
            *args, zero = args
        regs = list(k.inputs)
        if half:
            # Immediates too: XLA turns a division by a constant into a
            # product with its reciprocal, which rounds differently.
            regs = [r if isinstance(r, View) else _rounded(jax, jax.numpy.asarray(r), zero) for r in regs]
        for i, (reg, value) in enumerate(zip(arg_regs, args, strict=True)):
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
            if half and ins.op == "divide":
                # XLA turns a division by a broadcast into a product with the
                # broadcast reciprocal, which rounds differently: the divisor
                # is made opaque element by element (a broadcast of an opaque
                # scalar would still be a broadcast).
                operands[1] = _rounded(jax, full(operands[1]), zero, k.shape)
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
            regs.append(_rounded(jax, value, zero) if half else value)
        return [full(regs[r]) for r, _ in k.outputs]

    def full(value):
        return value if np.ndim(value) else jax.lax.broadcast_in_dim(value, k.shape, ())

    sharding = SingleDeviceSharding(device)
    specs = [jax.ShapeDtypeStruct(shape[::-1] if transposed >> i & 1 else shape, view.dtype, sharding=sharding)
             for i, (view, shape, _) in enumerate(_fed(k, r) for r in arg_regs)]
    if half:
        specs.append(jax.ShapeDtypeStruct((), np.uint32, sharding=sharding))
    # keep_unused: run_on_xla passes every argument, read or not (the zero
    # of a float16 chain whose results are all bool is never read).
    return jax.jit(chain, keep_unused=True).lower(*specs).compile().runtime_executable()


# Conversions between float16 and float32 of at least this many elements go
# to XLA:CPU (convert): numpy's casts are scalar loops, XLA's kernel a
# vectorised one, several times as fast on a 64-byte aligned array. Any
# other array would be copied by XLA first: numpy converts it.
CONVERT_MIN_ELEMENTS = 1 << 17
_CONVERTED = frozenset({(np.dtype(np.float16), np.dtype(np.float32)), (np.dtype(np.float32), np.dtype(np.float16))})
_converters: dict = {}


def convert(array: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """array.astype(dtype): the same values (both round to nearest even and
    keep subnormals, infinities and NaNs), through an XLA:CPU kernel when
    that is faster (a read-only array then); numpy's astype otherwise."""
    dtype = np.dtype(dtype)
    if (not ENABLED or array.size < CONVERT_MIN_ELEMENTS or (array.dtype, dtype) not in _CONVERTED
            or not array.flags.c_contiguous or array.ctypes.data % ALIGNMENT):
        return array.astype(dtype)
    run = _converter(array.size, array.dtype, dtype)
    return array.astype(dtype) if run is None else run(array).reshape(array.shape)


def _converter(n: int, source: np.dtype, dtype: np.dtype):
    """fn(array) converting n elements, or None without XLA:CPU."""
    key = (n, source, dtype)
    run = _converters.get(key)
    if run is not None or key in _converters:
        return run
    found = _cpu()
    if found is None:
        _converters[key] = None
        return None
    device, jaxlib = found
    import jax
    from jax._src import core
    from jax.sharding import SingleDeviceSharding

    sharding = SingleDeviceSharding(device)
    with _compile_lock:
        executable = jax.jit(lambda x: x.astype(dtype)).lower(
            jax.ShapeDtypeStruct((n,), source, sharding=sharding)).compile().runtime_executable()
    aval, put, devices = core.ShapedArray((n,), source), jaxlib.batched_device_put, [device]
    zero_copy = jaxlib.HostBufferSemantics.ZERO_COPY

    def run(array):
        arg = put(aval, sharding, [array.reshape(-1)], devices, True, False, zero_copy)
        [[result]] = executable.execute_sharded([arg]).disassemble_into_single_device_arrays()
        return np.asarray(result)
    if len(_converters) >= EXECUTABLES_KEPT:
        _converters.clear()
    _converters[key] = run
    return run


def aligned_empty(shape, dtype) -> np.ndarray:
    """np.empty(shape, dtype) starting at a multiple of ALIGNMENT (from
    4 KiB), so that XLA:CPU kernels (chains, convert) read it in place."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if nbytes < 4096:
        return np.empty(shape, dtype)
    return _aligned_empty(nbytes).view(dtype).reshape(shape)
