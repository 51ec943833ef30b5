"""Reference executors of element-wise kernels: a fused chain evaluated op
after op over whole arrays with the op table's numpy semantics (ops.py),
and fills. model/fast/chains.py runs chains faster, with the same values."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from jax_ipu import ops
from jax_ipu.graph import codelets
from jax_ipu.model.registry import reference


def instruction(ins: codelets.Instruction, dtypes: list) -> tuple[Callable, bool]:
    """(fn(*operands), whether fn is a ufunc taking `out`)."""
    if ins.op == "constant":
        value = dict(ins.attrs)["value"]
        return (lambda: value), False
    return ops.implementation(ins.op, [dtypes[a] for a in ins.args], ins.dtype, dict(ins.attrs))


@reference(codelets.ElementwiseChain)
def chain(k: codelets.ElementwiseChain, read):
    """Each instruction's result from its operand registers (the inputs,
    then the results before it), each output its register broadcast to
    the chain's shape in its tensor's dtype."""
    inputs = [read(source) for source in k.inputs]
    dtypes = [s.dtype for s in k.inputs] + [i.dtype for i in k.instructions]
    steps = [(instruction(ins, dtypes)[0], ins.args) for ins in k.instructions]
    outputs = [(reg, t.id, t.dtype) for reg, t in k.outputs]
    shape = k.shape

    def run(state):
        regs = [get(state) for get in inputs]
        for fn, args in steps:
            regs.append(fn(*[regs[a] for a in args]))
        for reg, tid, dtype in outputs:
            state[tid] = np.array(np.broadcast_to(regs[reg], shape), dtype=dtype)
    return run


@reference(codelets.Fill)
def fill(k: codelets.Fill, read):
    tid, shape, value = k.out.id, k.out.shape, k.value

    def run(state):
        state[tid] = np.full(shape, value, dtype=value.dtype)
    return run
