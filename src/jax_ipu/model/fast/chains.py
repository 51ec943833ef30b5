"""The fast executor of fused element-wise chains: as one BLAS axpy (an SGD
update, blas.axpy), as one XLA:CPU kernel (xla_chains), or on numpy in
cache-sized chunks shared with the helper thread, small ones as one
generated function. Each gives the values of the reference executor
(model/executors/elementwise.py) but where it hands the chain to XLA:CPU
or BLAS, whose rounding inside one op is theirs (see
tests/ipu/model/test_fast_matches_reference.py)."""
from __future__ import annotations

import numpy as np

from jax_ipu import ops
from jax_ipu.graph import codelets
from jax_ipu.graph.views import View
from jax_ipu.model.executors.elementwise import instruction
from jax_ipu.model.fast import blas, helper, xla_chains
from jax_ipu.model.registry import fast

# Elements of a large fused chain evaluated at a time (a multiple of any
# SIMD width): 256 KiB of f32 per temporary, so that they stay in a core's
# L2; smaller chunks cost more in numpy calls than they save.
CHAIN_CHUNK = 65536
# Chains of ops numpy runs at memory speed (ops.FAST_IN_NUMPY) take
# bigger chunks: each numpy call costs several microseconds, and two threads
# making many calls contend for the GIL.
FAST_CHAIN_CHUNK = 262144
# ... and are shared with the helper thread from this many elements (a
# hand-off to the spinning helper is cheap against such halves; smaller
# chains cut in row halves ran slower, the two threads' many short numpy
# calls contending for the GIL: see model-speed.md).
FAST_SHARED_CHAIN = 1 << 17
# A chunked chain of at least this many elements shares its chunks with a
# helper thread (model/fast/helper.py) when there is a second core.
SHARED_CHAIN = 2 * CHAIN_CHUNK


@fast(codelets.ElementwiseChain)
def chain(k: codelets.ElementwiseChain, read, whole: bool = False):
    run = _axpy_chain(k, read)
    if run is not None:
        return run
    if xla_chains.wanted(k):
        run = xla_chains.build(k, read)
        if run is not None:
            return run
    shape = k.shape
    n_inputs = len(k.inputs)
    fetch = []            # (register, fn(state))
    full = []             # register holds a chain-shaped array
    constants = {}
    for reg, source in enumerate(k.inputs):
        if isinstance(source, View):
            fetch.append((reg, read(source)))
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
        fn, is_ufunc = instruction(ins, dtypes)
        if is_ufunc and fn in _SLOW_WITH_A_SCALAR and full[-1]:
            scalar = [i for i, a in enumerate(ins.args) if a in constants and np.ndim(constants[a]) == 0]
            if len(scalar) == 1:
                fn = filled_operand(fn, scalar[0])
        # 0-d results are numpy scalars, which cannot be `out` buffers.
        reuse = next((a for a in ins.args if a >= n_inputs and full[a] and a not in output_regs
                      and last_use[a] == i and dtypes[a] == ins.dtype), None) \
            if is_ufunc and full[-1] and shape else None
        plan.append((fn, ins.args, dest, reuse))
    outputs = [(reg, t.id, t.dtype, full[reg] and reg >= n_inputs) for reg, t in k.outputs]
    template = [constants.get(r) for r in range(n_inputs + len(k.instructions))]
    size = int(np.prod(shape, dtype=np.int64))
    fast = all(ins.op in ops.FAST_IN_NUMPY for ins in k.instructions)
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
                # cost several times as much.
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


def _axpy_chain(k: codelets.ElementwiseChain, read):
    """fn(state) for a chain y +- c * x (an SGD update) as one BLAS axpy:
    one pass, each element rounded once as XLA:CPU rounds it (blas.axpy).
    Written in place into the output's buffer when it is y's own memory
    (a donated parameter), else into a new array holding a copy of y.
    None when the chain is not of that form."""
    parts = _axpy_parts(k)
    if parts is None:
        return None
    sign, c, xv, yv = parts
    get_x, get_y, tid, shape = read(xv), read(yv), k.outputs[0][1].id, k.shape
    get_c = read(c)

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


def filled_operand(ufunc: np.ufunc, index: int):
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
