"""Executors of compute-set kernels (graph.codelets): each runs all the
vertices of one compute set at once with vectorised numpy, in the
partitioned form the compiler planned (K-chunk partial products, partial
reductions, then a fixed-order combine), so rounding follows the plan.

build(kernel) -> fn(state), `state` being the engine's list of arrays by
tensor id. Everything that can be decided before a run is decided here."""
from __future__ import annotations

from typing import Callable

import numpy as np

from jax_ipu.graph import codelets
from jax_ipu.graph.views import View
from jax_ipu.model import blas, elementwise, helper, xla_chains

REDUCE_UFUNCS = {"add": np.add, "multiply": np.multiply, "maximum": np.maximum,
                 "minimum": np.minimum, "and": np.bitwise_and, "or": np.bitwise_or,
                 "xor": np.bitwise_xor}


def reader(view: View) -> Callable:
    """fn(state) -> the view's array, with the cheapest path for plain reads."""
    tid, shape = view.tensor.id, view.shape
    if not view.ops or view.is_whole_tensor:
        if shape == view.tensor.shape:
            return lambda state: state[tid]
        return lambda state: state[tid].reshape(shape)
    if all(op[0] in _STRIDED_OPS for op in view.ops):
        return _strided_reader(view)
    return lambda state: view.apply(lambda t: state[t.id])


def _value_reader(source: View | np.ndarray) -> Callable:
    """fn(state) -> a view's array, or the immediate `source` itself (an
    init value, a scale: held in vertex state)."""
    if isinstance(source, View):
        return reader(source)
    return lambda state: source


# View ops whose result is, on a C-ordered tensor, a strided view of its memory.
_STRIDED_OPS = frozenset({"reshape", "transpose", "slice", "broadcast"})


def _strided_reader(view: View) -> Callable:
    """reader() of a view of reshapes, transposes, slices and broadcasts.
    On a C-ordered array of the tensor, such a view is the same strided
    view of its memory on every run: its first read (view.apply) gives its
    layout, and later reads build that view at once (1 us, against 5-12 us
    for the ops one by one, and several times that on the cold caches
    after a large product). Any other array is read through view.apply."""
    tid, dtype, size = view.tensor.id, view.tensor.dtype, view.tensor.size
    layout = []           # [(shape, strides, byte offset, read-only)] once known

    def slow(state):
        return view.apply(lambda t: state[t.id])

    def first(state):
        a, out = state[tid], slow(state)
        if (not layout and type(a) is np.ndarray and type(out) is np.ndarray and a.dtype == dtype
                and a.size == size and a.flags.c_contiguous and a.size and out.size):
            offset = out.__array_interface__["data"][0] - a.__array_interface__["data"][0]
            if 0 <= offset < a.nbytes and np.shares_memory(a, out):
                layout.append((out.shape, out.strides, offset, not out.flags.writeable))
        return out

    def read(state):
        if not layout:
            return first(state)
        a = state[tid]
        if type(a) is not np.ndarray or a.dtype != dtype or a.size != size or not a.flags.c_contiguous:
            return slow(state)
        shape, strides, offset, read_only = layout[0]
        out = np.ndarray(shape, dtype, a, offset, strides)
        if read_only:
            out.flags.writeable = False
        return out
    return read


def _instruction(ins: codelets.Instruction, dtypes: list) -> tuple[Callable, bool]:
    """(fn(*operands), whether fn is a ufunc taking `out`)."""
    if ins.op == "constant":
        value = dict(ins.attrs)["value"]
        return (lambda: value), False
    ufunc = elementwise.ufunc_for(ins.op, dtypes[ins.args[0]])
    if ufunc is not None:
        return ufunc, True
    fn, attrs, dtype = elementwise.function_for(ins.op), dict(ins.attrs), ins.dtype
    return (lambda *a: fn(*a, dtype=dtype, attrs=attrs)), False


# Elements of a large fused chain evaluated at a time (a multiple of any
# SIMD width): 256 KiB of f32 per temporary, so that they stay in a core's
# L2; smaller chunks cost more in numpy calls than they save (on 1M
# elements with tanh and exp: 6.1 ms at 16K, 5.6 ms at 64K).
CHAIN_CHUNK = 65536
# Chains of ops numpy runs at memory speed (xla_chains.FAST_IN_NUMPY) take
# bigger chunks: each numpy call costs several microseconds, and two threads
# making many calls contend for the GIL (an SGD update of 401K elements on
# two threads: 161 us in 64K chunks, 112 us in 256K chunks).
FAST_CHAIN_CHUNK = 262144
# ... and are shared with the helper thread from this many elements (with
# the helper spinning, a hand-off costs about 10 us: an MLP training step
# was 2.5% faster with its 401K- and 262K-element updates shared; smaller
# chains cut in row halves were 5% slower, the two threads' many short
# numpy calls contending for the GIL).
FAST_SHARED_CHAIN = 1 << 17
# A chunked chain of at least this many elements shares its chunks with a
# helper thread (model/helper.py) when there is a second core.
SHARED_CHAIN = 2 * CHAIN_CHUNK


def _build_chain(k: codelets.ElementwiseChain):
    run = _axpy_chain(k)
    if run is not None:
        return run
    if xla_chains.wanted(k):
        run = xla_chains.build(k, reader)
        if run is not None:
            return run
    shape = k.shape
    n_inputs = len(k.inputs)
    fetch = []            # (register, fn(state))
    full = []             # register holds a chain-shaped array
    constants = {}
    for reg, source in enumerate(k.inputs):
        if isinstance(source, View):
            fetch.append((reg, reader(source)))
            full.append(source.shape == shape)
        else:
            constants[reg] = source
            full.append(False)
    dtypes = [s.dtype for s in k.inputs] + [i.dtype for i in k.instructions]
    output_regs = {reg for reg, _ in k.outputs}
    last_use = {}
    for i, ins in enumerate(k.instructions):
        for a in ins.args:
            last_use[a] = i
    plan = []             # (fn, args, dest, reusable register or None)
    for i, ins in enumerate(k.instructions):
        dest = n_inputs + i
        full.append(any(full[a] for a in ins.args))
        fn, is_ufunc = _instruction(ins, dtypes)
        if is_ufunc and fn in _SLOW_WITH_A_SCALAR and full[-1]:
            scalar = [i for i, a in enumerate(ins.args) if a in constants and np.ndim(constants[a]) == 0]
            if len(scalar) == 1:
                fn = _filled_operand(fn, scalar[0])
        # 0-d results are numpy scalars, which cannot be `out` buffers.
        reuse = next((a for a in ins.args if a >= n_inputs and full[a] and a not in output_regs
                      and last_use[a] == i and dtypes[a] == ins.dtype), None) \
            if is_ufunc and full[-1] and shape else None
        plan.append((fn, ins.args, dest, reuse))
    outputs = [(reg, t.id, t.dtype, full[reg] and reg >= n_inputs) for reg, t in k.outputs]
    template = [constants.get(r) for r in range(n_inputs + len(k.instructions))]
    size = int(np.prod(shape, dtype=np.int64))
    fast = all(ins.op in xla_chains.FAST_IN_NUMPY for ins in k.instructions)
    chunk = FAST_CHAIN_CHUNK if fast else CHAIN_CHUNK
    # The last instruction writes straight into the output's memory when it
    # is the chain's one output and a ufunc of that type (one pass fewer).
    last = len(plan) - 1
    direct = (len(outputs) == 1 and last >= 0 and outputs[0][0] == n_inputs + last and outputs[0][3]
              and isinstance(plan[last][0], np.ufunc)
              and all(dtypes[a] == outputs[0][2] for a in plan[last][1]) and dtypes[outputs[0][0]] == outputs[0][2])
    body = plan[:last] if direct else plan      # what _span runs into registers
    chunkable = (size >= 2 * CHAIN_CHUNK
                 and all(full[r] or np.size(s) == 1 if isinstance(s, View) else full[r] or np.ndim(s) == 0
                         for r, s in enumerate(k.inputs))
                 and all(ins.op != "bitcast_convert" and (ins.op != "constant" or np.ndim(dict(ins.attrs)["value"]) == 0)
                         for ins in k.instructions))

    def run_chunked(state):
        """The chain over CHAIN_CHUNK elements at a time, so that its
        temporaries stay in cache; element-wise, so the values are the same."""
        regs = template.copy()
        flat = []
        fetched = []
        for reg, get in fetch:
            value = get(state)
            fetched.append(value)
            if full[reg]:
                # One C-order copy of an input laid out otherwise (a transposing
                # Copy keeps its source's layout): evaluated whole, mixed layouts
                # cost 8x as much (2.6 ms for a 512x512 SGD update).
                flat.append((reg, np.ascontiguousarray(value).reshape(-1)))
            else:
                regs[reg] = value.reshape(())
        dests = []
        for reg, tid, dtype, _ in outputs:
            target = state[tid]
            if target is None:
                dest = np.empty(size, dtype)
                state[tid] = dest.reshape(shape)
            elif (target.flags.c_contiguous and target.flags.writeable
                  and not any(np.may_share_memory(target, v) and not _same_layout(target, v) for v in fetched)):
                dest = target.reshape(-1)    # written in place, chunk after chunk
            else:
                return run(state)
            dests.append((reg, dest))
        if size < (FAST_SHARED_CHAIN if fast else SHARED_CHAIN):
            _span(regs, flat, dests, 0, size)
            return
        # Element-wise: the helper thread may take the second half (each
        # element is computed by the same ufuncs either way).
        half = (size // 2 + 7) // 8 * 8 if fast else (size // 2 + CHAIN_CHUNK - 1) // CHAIN_CHUNK * CHAIN_CHUNK
        other_regs = regs.copy()
        helper.run_halves(lambda: _span(regs, flat, dests, 0, half),
                        lambda: _span(other_regs, flat, dests, half, size))

    def _span(regs, flat, dests, start, stop):
        for lo in range(start, stop, chunk):
            hi = min(lo + chunk, stop)
            for reg, value in flat:
                regs[reg] = value[lo:hi]
            for fn, args, dest, reuse in body:
                if reuse is None:
                    regs[dest] = fn(*[regs[a] for a in args])
                else:
                    regs[dest] = fn(*[regs[a] for a in args], out=regs[reuse])
            if direct:
                fn, args, _, _ = plan[last]
                fn(*[regs[a] for a in args], out=dests[0][1][lo:hi])
                continue
            for reg, dest in dests:
                np.copyto(dest[lo:hi], regs[reg], casting="unsafe")

    def run(state):
        regs = template.copy()
        for reg, get in fetch:
            regs[reg] = get(state)
        for fn, args, dest, reuse in plan:
            if reuse is None:
                regs[dest] = fn(*[regs[a] for a in args])
            else:
                regs[dest] = fn(*[regs[a] for a in args], out=regs[reuse])
        for reg, tid, dtype, computed in outputs:
            value = regs[reg]
            target = state[tid]
            if target is not None and target.flags.writeable:   # a donated buffer, written in place
                np.copyto(target, value, casting="unsafe")
            elif computed and type(value) is np.ndarray and value.base is None and value.dtype == dtype:
                state[tid] = value
            else:                             # an input, a view or a scalar: give it its own data
                state[tid] = np.array(np.broadcast_to(value, shape), dtype=dtype)
    if chunkable:
        run_chunked.shares = size >= (FAST_SHARED_CHAIN if fast else SHARED_CHAIN)
        return run_chunked
    return _straight_line(k, fetch, plan, outputs, template, shape) or run


_F32 = np.dtype(np.float32)


def _axpy_parts(k: codelets.ElementwiseChain):
    """(sign, c, x view, y view) when the chain is y + c * x or y - c * x
    (either operand order of the multiply; c a float32 scalar, an immediate
    or a one-element tensor such as a learning rate passed in; x and y
    float32 views of the chain's shape; the sum its one output), else
    None."""
    if not blas.has_axpy() or k.shape == () or len(k.outputs) != 1 or k.outputs[0][1].dtype != _F32:
        return None
    n = len(k.inputs)
    scalars, views, ops = {}, {}, []
    for reg, source in enumerate(k.inputs):
        if isinstance(source, View):
            if source.dtype != _F32:
                continue
            if source.tensor.size == 1:
                scalars[reg] = View(source.tensor)
            if source.shape == k.shape:
                views[reg] = source      # (a one-element chain's operands are both)
        elif np.ndim(source) == 0 and np.asarray(source).dtype == _F32:
            scalars[reg] = np.asarray(source)
    for i, ins in enumerate(k.instructions):
        value = dict(ins.attrs).get("value") if ins.op == "constant" else None
        if value is not None and np.ndim(value) == 0 and np.asarray(value).dtype == _F32:
            scalars[n + i] = np.asarray(value)
        elif ins.dtype == _F32:
            ops.append((n + i, ins))
        else:
            return None
    if len(ops) != 2:
        return None
    (product, mul), (total, add) = ops
    if mul.op != "multiply" or add.op not in ("add", "subtract") or k.outputs[0][0] != total:
        return None
    c, x = mul.args if mul.args[0] in scalars and mul.args[1] in views else mul.args[::-1]
    if c not in scalars or x not in views:
        return None
    if add.op == "subtract":
        if add.args[1] != product:
            return None
        y, sign = add.args[0], -1
    else:
        y, sign = (add.args[1] if add.args[0] == product else add.args[0]), 1
    if y not in views or product not in add.args or y == product:
        return None
    return sign, scalars[c], views[x], views[y]


def _axpy_chain(k: codelets.ElementwiseChain):
    """fn(state) for a chain y +- c * x (an SGD update) as one BLAS axpy:
    one pass, each element rounded once as XLA:CPU rounds it (blas.axpy).
    Written in place into the output's buffer when it is y's own memory
    (a donated parameter), else into a new array holding a copy of y.
    None when the chain is not of that form."""
    parts = _axpy_parts(k)
    if parts is None:
        return None
    sign, c, xv, yv = parts
    get_x, get_y, tid, shape = reader(xv), reader(yv), k.outputs[0][1].id, k.shape
    get_c = _value_reader(c)

    def run(state):
        x, y = get_x(state), get_y(state)
        alpha = sign * float(np.asarray(get_c(state)).reshape(-1)[0])
        target = state[tid]
        if (target is not None and type(target) is np.ndarray and target.flags.writeable
                and target.flags.c_contiguous and target.dtype == _F32 and target.size == x.size
                and not np.may_share_memory(target, x)
                and (_same_flat(target, y) or not np.may_share_memory(target, y))):
            out = target
        else:
            out = state[tid] = np.empty(shape, _F32)
        if not _same_flat(out, y):
            np.copyto(out.reshape(shape), y)
        if not blas.axpy(alpha, np.ascontiguousarray(x).reshape(-1), out.reshape(-1)):
            raise AssertionError("axpy chain built without BLAS axpy")   # has_axpy() was checked
    return run


def _same_flat(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two arrays are the same memory in the same C order."""
    return (a.flags.c_contiguous and b.flags.c_contiguous and a.size == b.size and a.dtype == b.dtype
            and a.__array_interface__["data"][0] == b.__array_interface__["data"][0])


def _straight_line(k, fetch, plan, outputs, template, shape):
    """`run` of a chain as one generated function: the same reads, ufunc
    calls and output rules, without the loops over the plan. Small chains
    run on every call of small programs, where those loops cost more than
    the arithmetic."""
    env = {"np": np, "ndarray": np.ndarray, "shape": shape}
    lines = ["def run(state):"]
    for reg, get in fetch:
        source = k.inputs[reg]
        plain = (not source.ops or source.is_whole_tensor) and source.shape == source.tensor.shape
        if plain:
            lines.append(f"    r{reg} = state[{source.tensor.id}]")
        else:
            env[f"g{reg}"] = get
            lines.append(f"    r{reg} = g{reg}(state)")
    for reg, value in enumerate(template):
        if value is not None:
            env[f"r{reg}"] = value          # immediates: read as globals
    for i, (fn, args, dest, reuse) in enumerate(plan):
        env[f"f{i}"] = fn
        operands = ", ".join(f"r{a}" for a in args)
        if reuse is None:
            lines.append(f"    r{dest} = f{i}({operands})")
        else:
            lines.append(f"    r{dest} = f{i}({operands}, out=r{reuse})")
    for j, (reg, tid, dtype, computed) in enumerate(outputs):
        env[f"d{j}"] = dtype
        lines.append(f"    target = state[{tid}]")
        lines.append("    if target is not None and target.flags.writeable:")
        lines.append(f"        np.copyto(target, r{reg}, casting='unsafe')")
        if computed:
            lines.append(f"    elif type(r{reg}) is ndarray and r{reg}.base is None and "
                         f"(r{reg}.dtype is d{j} or r{reg}.dtype == d{j}):")
            lines.append(f"        state[{tid}] = r{reg}")
        lines.append("    else:")
        lines.append(f"        state[{tid}] = np.array(np.broadcast_to(r{reg}, shape), dtype=d{j})")
    try:
        exec(compile("\n".join(lines), f"<chain {k.outputs[0][1].name if k.outputs else ''}>", "exec"), env)
    except SyntaxError:      # pragma: no cover - a bug here must not stop a run
        return None
    return env["run"]


# numpy's maximum and minimum take 3x as long with a scalar operand as with
# an array of it (no SIMD path for the scalar): the chain gives them one.
_SLOW_WITH_A_SCALAR = (np.maximum, np.minimum)


def _filled_operand(ufunc: np.ufunc, index: int):
    """ufunc(*args, out=None) with args[index], a scalar, as an array of the
    other operand's shape (kept across calls): the same values."""
    kept = []

    def call(*args, out=None):
        other = args[1 - index]
        filled = kept[0] if kept else None
        if filled is None or filled.size < other.size:
            filled = np.full(other.size, args[index], dtype=np.result_type(args[index]))
            kept[:] = [filled]
        args = list(args)
        args[index] = filled[:other.size].reshape(other.shape)
        return ufunc(*args, out=out)
    return call


def _same_layout(a: np.ndarray, b: np.ndarray) -> bool:
    return (a.shape == b.shape and a.strides == b.strides
            and a.__array_interface__["data"][0] == b.__array_interface__["data"][0])


def _build_fill(k: codelets.Fill):
    tid, shape, value = k.out.id, k.out.shape, k.value

    def run(state):
        state[tid] = np.full(shape, value, dtype=value.dtype)
    return run


def _operands(k: codelets.MatMulPartials):
    """fn(state) -> (lhs, rhs) in the partials' dtype."""
    lhs, rhs, acc = reader(k.lhs), reader(k.rhs), k.out.dtype

    def get(state):
        a, b = lhs(state), rhs(state)
        return (a if a.dtype == acc else a.astype(acc)), (b if b.dtype == acc else b.astype(acc))
    return get


def _build_matmul(k: codelets.MatMulPartials, whole: bool = False):
    operands, tid = _operands(k), k.out.id
    chunks, batch, m, n = k.out.shape
    size = k.lhs.shape[2] // chunks if chunks else 0

    def run(state):
        a, b = operands(state)
        out = np.empty((chunks, batch, m, n), dtype=k.out.dtype)
        blas.matmul_partials(a, b, out, chunks, size, whole)
        state[tid] = out
    run.shares = _shares(k, whole)
    return run


def _shares(k: codelets.MatMulPartials, whole: bool) -> bool:
    """Whether the product is cut in row halves for the helper thread."""
    batch, m, kk = k.lhs.shape
    return len(blas.row_blocks(batch, m, kk, k.rhs.shape[-1], whole)) > 1


class Combined:
    """What a combined matmul leaves in its partials tensor: the partials
    already summed over the chunks in the plan's order, [batch * m * n]."""
    __slots__ = ("value",)

    def __init__(self, value: np.ndarray):
        self.value = value


def _build_matmul_combined(k: codelets.MatMulPartials, whole: bool = False):
    """The partials are scratch, read only by the matmul's reduction
    (ReduceCombine over the chunks, "add"): they are summed here, row
    block by row block while in cache, in the same fixed order, and the
    reduction takes the sum."""
    operands, tid, acc = _operands(k), k.out.id, k.out.dtype
    chunks = k.out.shape[0]
    size = k.lhs.shape[2] // chunks if chunks else 0
    scratch = blas.CombineScratch()

    def run(state):
        a, b = operands(state)
        state[tid] = Combined(blas.matmul_combined(a, b, chunks, size, acc, scratch, whole).reshape(-1))
    run.shares = _shares(k, whole)
    return run


# Reductions over at most this many contiguous elements, of at least
# SHORT_AXIS_ROWS outputs, go element by element along the axis.
SHORT_AXIS = 16
SHORT_AXIS_ROWS = 256


def _build_reduce_partials(k: codelets.ReducePartials):
    get, tid, ufunc, acc = reader(k.input), k.out.id, REDUCE_UFUNCS[k.op], k.out.dtype
    run = _partials_runner(k, get, ufunc, acc)
    if k.init is None:
        def partials(state):
            state[tid] = run(state)
        return partials
    # A single stage: the one partial of each output is its result, then the init.
    init = _value_reader(k.init)
    shape = k.out.shape

    def single_stage(state):
        value = ufunc(init(state).astype(acc, copy=False), run(state).reshape(shape))
        state[tid] = np.asarray(value).astype(acc, copy=False).reshape(shape)
    return single_stage


def _partials_runner(k: codelets.ReducePartials, get, ufunc, acc):
    """fn(state) -> the partials [O, chunks]."""
    if k.outer and acc == np.float16 and ufunc in (np.add, np.multiply):
        def run_outer_in_order(state):
            x = get(state)
            total = x[:, 0].astype(acc)
            for i in range(1, x.shape[1]):
                ufunc(total, x[:, i], out=total)
            return np.ascontiguousarray(total.T)
        return run_outer_in_order
    if k.outer:
        def run_outer(state):
            # [chunks, O], each chunk's rows combined in order, as [O, chunks].
            return np.ascontiguousarray(ufunc.reduce(get(state), axis=1, dtype=acc).T)
        return run_outer

    rows, size = k.input.shape[0] * k.input.shape[1], k.input.shape[2]
    # numpy's fp16 add and multiply reductions accumulate in fp32; an fp16
    # accumulator (a reduce_window's) rounds each step, so it goes element
    # after element.
    in_order = acc == np.float16 and ufunc in (np.add, np.multiply)
    if 1 < size and (in_order or (size <= SHORT_AXIS and rows >= SHORT_AXIS_ROWS)):
        def run_short(state):
            # Element after element into the accumulator: numpy's reduce over
            # a short contiguous axis costs 10-20x as much (a max pool's 2x2
            # windows). Combined in order, as XLA:CPU combines a window's.
            x = get(state)
            total = x[..., 0].astype(acc)      # a copy of its own
            for i in range(1, size):
                ufunc(total, x[..., i], out=total)
            return total
        return run_short

    def run(state):
        return ufunc.reduce(get(state), axis=2, dtype=acc)
    return run


def takes_combined(k: codelets.ReduceCombine) -> bool:
    """Whether this reduction sums a matmul's partials over the chunks as
    _build_matmul_combined leaves them (the only reader that can)."""
    whole = k.partials.tensor.shape
    return (k.op == "add" and k.axis == 0 and k.partials.is_whole_tensor
            and k.partials.shape == (whole[0], int(np.prod(whole[1:], dtype=np.int64))))


def _build_reduce_combine(k: codelets.ReduceCombine):
    get, tid, ufunc, axis = reader(k.partials), k.out.id, REDUCE_UFUNCS[k.op], k.axis
    init = None if k.init is None else _value_reader(k.init)
    dtype, shape = k.out.dtype, k.out.shape
    acc = k.partials.dtype
    # The matmul's reduction may find its partials already combined.
    pid, may_be_combined = k.partials.tensor.id, takes_combined(k)

    def run(state):
        raw = state[pid]
        if may_be_combined and type(raw) is Combined:
            value = raw.value
        elif acc == np.float16 and ufunc in (np.add, np.multiply):    # each step rounded (see above)
            parts = np.moveaxis(get(state), axis, 0)
            value = parts[0].astype(acc)
            for part in parts[1:]:
                ufunc(value, part, out=value)
        else:
            value = ufunc.reduce(get(state), axis=axis, dtype=acc)
        if init is not None:
            value = ufunc(init(state).astype(acc, copy=False), value)
        state[tid] = np.asarray(value).astype(dtype, copy=False).reshape(shape)   # value is new
    return run


def _build_tree_reduce(k: codelets.TreeReduce):
    readers = [reader(v) for v in k.inputs]
    dtypes = [v.dtype for v in k.inputs] * 2 + [i.dtype for i in k.body]
    steps = [(_instruction(ins, dtypes)[0], ins.args) for ins in k.body]
    results = k.results
    inits = None if k.init is None else [_value_reader(i) for i in k.init]
    outs = [(t.id, t.dtype, t.shape) for t in k.outs]

    def body(operands: list) -> list:
        regs = list(operands)
        for fn, args in steps:
            regs.append(fn(*[regs[a] for a in args]))
        return [regs[r] for r in results]

    def run(state):
        xs = [np.moveaxis(get(state), k.axis, 0) for get in readers]
        # Pairs neighbours (2i, 2i + 1), the earlier element first, so that
        # a body that is not commutative (argmax between two NaNs keeps its
        # first operand) sees its operands in order, as XLA:CPU's does.
        while xs[0].shape[0] > 1:
            count = xs[0].shape[0]
            half = count // 2
            combined = body([x[0:2 * half:2] for x in xs] + [x[1:2 * half:2] for x in xs])
            combined = [np.broadcast_to(c, x[:half].shape).astype(x.dtype, copy=False)
                        for c, x in zip(combined, xs)]
            xs = [np.concatenate([c, x[2 * half:]]) if count % 2 else c for c, x in zip(combined, xs)]
        values = [x[0] for x in xs]
        if inits is not None:
            values = body([init(state) for init in inits] + values)
        for (tid, dtype, shape), value in zip(outs, values):
            state[tid] = np.array(np.broadcast_to(value, shape), dtype=dtype)
    return run


def _build_window_select(k: codelets.WindowSelect):
    """The scan runs over window positions, each step over all outputs at
    once, so a window's select calls are made in XLA's order. The selected
    value and position are updated by bit masks: np.where branches on
    each element and mispredicts on random data (5x slower)."""
    values, tid, slot_dtype = reader(k.values), k.out.id, k.out.dtype
    padding = reader(k.padding) if k.padding is not None else None
    window, outputs = k.values.shape
    bits = np.dtype(f"u{k.values.dtype.itemsize}")
    dtypes = [k.values.dtype] * 2 + [i.dtype for i in k.select]
    steps = [(_instruction(ins, dtypes)[0], ins.args) for ins in k.select]
    result = k.result

    def keeps(selected: np.ndarray, element: np.ndarray) -> np.ndarray:
        regs = [selected, element]
        for fn, args in steps:
            regs.append(fn(*[regs[a] for a in args]))
        return regs[result]

    def run(state):
        v = values(state)
        selected = v[0].copy()
        held = selected.view(bits)
        slot = np.zeros(outputs, slot_dtype)
        if padding is not None:
            pad = padding(state)
            empty = pad[0].copy()
        for j in range(1, window):
            take = np.broadcast_to(np.logical_not(keeps(selected, v[j])), (outputs,))
            if padding is not None:      # padding is never taken, and anything replaces it
                take = (take & ~pad[j]) | empty
                empty &= pad[j]
            mask = np.negative(take.view(np.uint8).astype(bits, copy=False))   # all ones where taken
            change = np.bitwise_xor(held, v[j].view(bits))
            np.bitwise_and(change, mask, out=change)
            np.bitwise_xor(held, change, out=held)
            np.maximum(slot, np.multiply(take, j, dtype=slot_dtype), out=slot)   # later positions win
        state[tid] = slot
    return run


BUILDERS = {
    codelets.ElementwiseChain: _build_chain,
    codelets.Fill: _build_fill,
    codelets.MatMulPartials: _build_matmul,
    codelets.ReducePartials: _build_reduce_partials,
    codelets.ReduceCombine: _build_reduce_combine,
    codelets.TreeReduce: _build_tree_reduce,
    codelets.WindowSelect: _build_window_select,
}


from jax_ipu.model import kernels_indexing  # noqa: E402  (its executors use the helpers above)

BUILDERS.update(kernels_indexing.BUILDERS)

from jax_ipu.model import kernels_linalg  # noqa: E402

BUILDERS.update(kernels_linalg.BUILDERS)

from jax_ipu.model import kernels_collectives  # noqa: E402

BUILDERS.update(kernels_collectives.BUILDERS)


def build(kernel, scratch: bool = False, whole: bool = False) -> Callable:
    """scratch: the kernel's output is only read, within a run, by kernels
    that make new arrays of it (the engine decides): for matmul partials,
    only by the matmul's reduction, which then finds them combined.
    whole: a product's rows in one block, never halves (it runs in a lane)."""
    if type(kernel) is codelets.MatMulPartials:
        return (_build_matmul_combined if scratch else _build_matmul)(kernel, whole)
    return BUILDERS[type(kernel)](kernel)
