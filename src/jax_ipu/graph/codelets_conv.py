"""The kernel of planned convolutions: the AMP convolution vertices
(PopLibs' ConvPartialnx1 and ConvPartial1x1Out) of one compute set, each
walking its tile's kernel positions over the input region it received.
Partial sums over a chunk of input channels and kernel positions are its
output; a ReduceCombine adds the chunks up (compiler/lowering/conv.py)."""
from __future__ import annotations

import itertools

from jax_ipu.graph.records import attribute, codelet, reads, writes
from jax_ipu.graph.tensors import Tensor
from jax_ipu.graph.views import View


@codelet
class ConvPartials:
    """out[c, g, n, *o, co] = sum over the kernel positions k and input
    channels i of chunk c of input[g, n, i, at(o, k)] * weights[g, *k, i, co],
    accumulated in out.dtype kernel position after kernel position (as the
    AMP adds each position's products to its partials), the products of
    one position and the chunk's channels summed first. at(o, k) is the
    input element output position o reads at kernel position k, per
    spatial dimension (window, stride, pad_low, pad_high, lhs_dilation,
    rhs_dilation, reversal) as the "windows" view op reads it (graph/views);
    padding and the holes of a dilated input read zero. Chunk c is
    (input-channel block, kernel block of each spatial dimension) in C
    order, the channels in `in_chunks` equal blocks and each kernel
    dimension in `window_chunks` equal blocks. With `batch_inner` the
    output is [c, g, *o, n, co] (the AMP ran along the batch)."""
    input: View = reads(through_views=True)          # [G, N, Ci, *in]
    weights: View = reads(through_views=True)        # [G, *window, Ci, Co]
    # [chunks, G, N, *outs, Co] ([chunks, G, *outs, N, Co] batch inner);
    # when only the convolution's own reduction reads it, a fast executor
    # may leave the partials already summed (model/fast/conv.py).
    out: Tensor = writes(stand_in="the partials summed over the chunks in order, for the sum's reader")
    window: tuple = attribute("any")
    in_chunks: int = attribute("int")
    window_chunks: tuple[int, ...] = attribute("*int")
    batch_inner: bool = attribute("bool")

    def chunk_blocks(self):
        """Per chunk, in order: (input-channel slice, per kernel dimension
        the slice of kernel positions)."""
        channels = self.input.shape[2]
        size = channels // self.in_chunks
        per_dim = [[slice(j * (w // c), (j + 1) * (w // c)) for j in range(c)]
                   for (w, *_), c in zip(self.window, self.window_chunks, strict=True)]
        for i, kernel in itertools.product(range(self.in_chunks), itertools.product(*per_dim)):
            yield slice(i * size, (i + 1) * size), kernel
