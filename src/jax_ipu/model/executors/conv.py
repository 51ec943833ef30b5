"""The reference executor of planned convolutions' partial sums
(graph/codelets_conv.py says what they are): per chunk, kernel position
after kernel position, each position's products over the chunk's input
channels added to the partials in their type (model/fast/conv.py runs a
chunk as one product of host-side patches)."""
from __future__ import annotations

import itertools

import numpy as np

from jax_ipu.graph import codelets_conv
from jax_ipu.graph.views import apply_ops
from jax_ipu.model.registry import reference


def products_dtype(partials: np.dtype) -> np.dtype:
    """The type a kernel position's products are summed in: float32 for
    float partials (float16 products are exact in it), the partials' own
    type for integers."""
    return np.dtype(np.float32) if partials.kind == "f" else partials


@reference(codelets_conv.ConvPartials)
def conv_partials(k: codelets_conv.ConvPartials, read):
    x, w, tid, acc = read(k.input), read(k.weights), k.out.id, k.out.dtype
    spatial = len(k.window)
    dot = products_dtype(acc)
    blocks = list(k.chunk_blocks())
    fill = np.zeros((), k.input.dtype)

    def run(state):
        # [G, N, Ci, *outs, *window]: each output position's window.
        windows = apply_ops(np.asarray(x(state)), (("windows", k.window, fill),))
        weights = np.asarray(w(state))
        groups, batch = windows.shape[:2]
        outs = windows.shape[3:3 + spatial]
        out = np.empty(k.out.shape, acc)
        for c, (channels, kernel) in enumerate(blocks):
            partial = np.zeros((groups, batch, *outs, weights.shape[-1]), acc)
            for position in itertools.product(*(range(s.start, s.stop) for s in kernel)):
                taps = windows[(slice(None), slice(None), channels, *(slice(None),) * spatial, *position)]
                taps = np.moveaxis(taps, 2, -1).astype(dot)            # [G, N, *outs, Ci chunk]
                products = np.matmul(taps.reshape(groups, -1, taps.shape[-1]),
                                     weights[(slice(None), *position, channels)].astype(dot))
                partial = (partial + products.reshape(partial.shape)).astype(acc)
            out[c] = np.moveaxis(partial, 1, 1 + spatial) if k.batch_inner else partial
        state[tid] = out
    return run
