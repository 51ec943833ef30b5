"""stablehlo.fft (FFT, IFFT, RFFT, IRFFT over the last 1-3 axes) as ops the
compiler plans on tiles: the transform of each axis as float32 matrix
products and element-wise ops on the real and imaginary parts, never on
the host.

Along an axis of length n (docs/semantics.md, "FFT"):
- n <= DIRECT: one product with the DFT matrix (its real and imaginary
  parts, constants computed in float64 and rounded once): four real
  products, two of a real input;
- n = n1 n2 with 1 < n1 <= DIRECT (n1 the largest such divisor): Cooley
  and Tukey's four steps, the input as [n1, n2]: DFTs of length n1 (a
  product), the twiddle factors w^(j2 k1) multiplied in, the transform of
  length n2 (recursively), and a transpose, so that output k1 + n1 k2
  lands in place. The products run on the matmul planner, spread over
  tiles with the rest of the batch, and the transposes are exchanges;
- otherwise (a prime factor above DIRECT) Bluestein's algorithm: a
  convolution with a chirp, by transforms of the next power of two at
  least 2n - 1.

IFFT and IRFFT scale by 1 / (the product of the lengths), as XLA:CPU's
DUCC FFT does. RFFT transforms the last axis of the real input (its first
products with the real part only) and keeps n // 2 + 1 outputs, then the
other axes; IRFFT transforms the other axes, extends the last one by
Hermitian symmetry (X[n - k] = conj X[k]) and keeps the real part, so
that the imaginary parts of the zero (and the Nyquist) frequency are
ignored, as C2R transforms ignore them."""
from __future__ import annotations

import numpy as np

from jax_ipu import ir
from jax_ipu.compiler.passes.emulate import Emitter
from jax_ipu.errors import IpuUnimplementedError

# Transforms of at most this length are one product with the DFT matrix;
# longer ones are split into factors of at most this length.
DIRECT = 64
_F32 = np.dtype(np.float32)


def expand_ffts(ops: list[ir.Op]) -> list[ir.Op]:
    """The ops with every fft expanded (in nested regions too)."""
    return ir.rewrite(ops, lambda op: expand_fft(op) if op.name == "fft" else None)


def expand_fft(op: ir.Op) -> list[ir.Op]:
    fft_type = str(op.attrs.get("fft_type"))
    lengths = tuple(int(n) for n in op.attrs.get("fft_length") or ())
    x, result = op.operands[0], op.results[0]
    if fft_type not in ("FFT", "IFFT", "RFFT", "IRFFT") or not 1 <= len(lengths) <= 3:
        raise IpuUnimplementedError.for_op(op, f"fft of type {fft_type} over {len(lengths)} axes is not supported",
                                           "Use jnp.fft over 1 to 3 axes")
    e = Emitter(op, "complex64 fft")
    t = _Transform(e)
    rank = len(result.type.shape)
    axes = list(range(rank - len(lengths), rank))
    sign = 1.0 if fft_type in ("IFFT", "IRFFT") else -1.0
    if result.type.size == 0 or x.type.size == 0:
        zero = e.constant(np.zeros((), result.type.dtype))
        e("broadcast_in_dim", [zero], result, broadcast_dimensions=())
        return e.ops
    if fft_type == "RFFT":
        re, im = e.convert(x, _F32), None
        re, im = t.along(re, im, axes[-1], sign)
        keep = lengths[-1] // 2 + 1
        re, im = t.slice_last(re, keep, axes[-1]), t.slice_last(im, keep, axes[-1])
        for axis in axes[:-1]:
            re, im = t.along(re, im, axis, sign)
    else:
        re, im = e.parts(x)
        for axis in axes[:-1] if fft_type == "IRFFT" else axes:
            re, im = t.along(re, im, axis, sign)
        if fft_type == "IRFFT":
            re, im = t.hermitian(re, im, axes[-1], lengths[-1])
            re, im = t.along(re, im, axes[-1], sign)
    if im is None:       # (a real input whose transforms were all of length 1)
        im = e("broadcast_in_dim", [e.constant(np.zeros((), _F32))], re.type, broadcast_dimensions=())
    if sign > 0:
        scale = e.constant(np.array(1.0 / np.prod(lengths, dtype=np.float64), _F32))
        factor = e("broadcast_in_dim", [scale], re.type, broadcast_dimensions=())
        if fft_type == "IRFFT":
            e("multiply", [re, factor], result)
            return e.ops
        re, im = t.binary("multiply", re, factor), t.binary("multiply", im, factor)
    e("complex", [re, im], result)
    return e.ops


class _Transform:
    """Transforms of (real part, imaginary part or None) pairs of float32
    values, emitted through an Emitter."""

    def __init__(self, e: Emitter):
        self.e = e

    # -- ops on float32 values --
    def _type(self, shape) -> ir.TensorType:
        return ir.TensorType(tuple(int(d) for d in shape), _F32)

    def binary(self, name: str, a: ir.Value, b: ir.Value) -> ir.Value:
        return self.e(name, [a, b], a.type)

    def reshape(self, v: ir.Value | None, shape) -> ir.Value | None:
        if v is None or tuple(v.type.shape) == tuple(shape):
            return v
        return self.e("reshape", [v], self._type(shape))

    def transpose(self, v: ir.Value | None, perm) -> ir.Value | None:
        if v is None or list(perm) == sorted(perm):
            return v
        return self.e("transpose", [v], self._type([v.type.shape[p] for p in perm]), permutation=tuple(perm))

    def slice_last(self, v: ir.Value | None, size: int, axis: int) -> ir.Value | None:
        if v is None:
            return None
        shape = list(v.type.shape)
        if shape[axis] == size:
            return v
        limits = list(shape)
        limits[axis] = size
        return self.e("slice", [v], self._type(limits), start_indices=(0,) * len(shape),
                      limit_indices=tuple(limits), strides=(1,) * len(shape))

    def constant(self, value: np.ndarray) -> ir.Value:
        return self.e.constant(np.asarray(value, _F32))

    def broadcast(self, c: ir.Value, shape, dims) -> ir.Value:
        return self.e("broadcast_in_dim", [c], self._type(shape), broadcast_dimensions=tuple(dims))

    def dot(self, x: ir.Value, axis: int, matrix: ir.Value) -> ir.Value:
        shape = [d for i, d in enumerate(x.type.shape) if i != axis] + [matrix.type.shape[1]]
        dims = ir.DotDimensionNumbers((), (), (axis,), (0,))
        return self.e("dot_general", [x, matrix], self._type(shape), dot_dimension_numbers=dims)

    # -- complex pairs --
    def multiply(self, a: tuple, b: tuple) -> tuple:
        """(ar + i ai)(br + i bi) element-wise; None parts are zero."""
        (ar, ai), (br, bi) = a, b
        re = self.binary("multiply", ar, br)
        if ai is not None and bi is not None:
            re = self.binary("subtract", re, self.binary("multiply", ai, bi))
        terms = ([self.binary("multiply", ar, bi)] if bi is not None else []) + \
                ([self.binary("multiply", ai, br)] if ai is not None else [])
        im = None if not terms else terms[0] if len(terms) == 1 else self.binary("add", terms[0], terms[1])
        return re, im

    def matrix_product(self, re, im, axis: int, matrix: np.ndarray) -> tuple:
        """(re + i im) contracted over `axis` with a complex constant matrix
        [m, k]: the axis replaced by k, moved last."""
        wr, wi = self.constant(matrix.real), self.constant(matrix.imag)
        rr = self.dot(re, axis, wr)
        ri = self.dot(re, axis, wi)
        if im is None:
            return rr, ri
        out_re = self.binary("subtract", rr, self.dot(im, axis, wi))
        out_im = self.binary("add", ri, self.dot(im, axis, wr))
        return out_re, out_im

    # -- transforms --
    def along(self, re, im, axis: int, sign: float) -> tuple:
        """The unnormalized transform (sign -1 forward, +1 inverse) along
        `axis`, the axis staying where it was."""
        rank = len(re.type.shape)
        if axis != rank - 1:
            perm = [i for i in range(rank) if i != axis] + [axis]
            back = [int(i) for i in np.argsort(perm)]
            re, im = self.transpose(re, perm), self.transpose(im, perm)
            re, im = self.last(re, im, sign)
            return self.transpose(re, back), self.transpose(im, back)
        return self.last(re, im, sign)

    def last(self, re, im, sign: float) -> tuple:
        """The transform along the last axis."""
        shape = list(re.type.shape)
        n = shape[-1]
        if n == 1:
            return re, im
        if n <= DIRECT:
            return self.matrix_product(re, im, len(shape) - 1, dft_matrix(n, sign))
        n1 = max((d for d in range(2, DIRECT + 1) if n % d == 0), default=None)
        if n1 is None:
            return self.bluestein(re, im, sign)
        n2 = n // n1
        lead = shape[:-1]
        # [..., n1, n2] -> DFTs of length n1 over axis -2: [..., n2, k1]
        re, im = self.reshape(re, lead + [n1, n2]), self.reshape(im, lead + [n1, n2])
        re, im = self.matrix_product(re, im, len(lead), dft_matrix(n1, sign))
        j2, k1 = np.meshgrid(np.arange(n2), np.arange(n1), indexing="ij")
        twiddles = unit_roots(j2 * k1, n, sign)                        # [n2, n1]
        dims = (len(lead), len(lead) + 1)
        full = lead + [n2, n1]
        tr = self.broadcast(self.constant(twiddles.real), full, dims)
        ti = self.broadcast(self.constant(twiddles.imag), full, dims)
        re, im = self.multiply((re, im), (tr, ti))
        # [..., k1, n2] -> length-n2 transforms -> [..., k1, k2] -> [..., k2, k1] -> [..., n]
        swap = list(range(len(lead))) + [len(lead) + 1, len(lead)]
        re, im = self.transpose(re, swap), self.transpose(im, swap)
        re, im = self.last(re, im, sign)
        re, im = self.transpose(re, swap), self.transpose(im, swap)
        return self.reshape(re, lead + [n]), self.reshape(im, lead + [n])

    def bluestein(self, re, im, sign: float) -> tuple:
        """X_k = w_k sum_j (x_j w_j) conj(w_(k-j)), w_m = exp(sign pi i m^2 / n):
        a circular convolution of length M (a power of two >= 2n - 1) by
        two transforms and a product with the chirp's transform."""
        shape = list(re.type.shape)
        n = shape[-1]
        m = 1 << int(np.ceil(np.log2(2 * n - 1)))
        lead = shape[:-1]
        index = np.arange(n)
        chirp = unit_roots(index * index, 2 * n, sign)                  # w_j
        kernel = np.zeros(m, np.complex128)
        kernel[:n] = np.conj(chirp)
        kernel[m - n + 1:] = np.conj(chirp[1:][::-1])
        spectrum = np.fft.fft(kernel)
        dims = (len(lead),)
        wr, wi = (self.broadcast(self.constant(p), shape, dims) for p in (chirp.real, chirp.imag))
        re, im = self.multiply((re, im), (wr, wi))
        zero = self.constant(np.zeros((), _F32))
        pad = {"edge_padding_low": (0,) * len(shape), "edge_padding_high": (0,) * len(lead) + (m - n,),
               "interior_padding": (0,) * len(shape)}
        re, im = (self.e("pad", [v, zero], self._type(lead + [m]), **pad) for v in (re, im))
        re, im = self.last(re, im, -1.0)
        sr, si = (self.broadcast(self.constant(p / m), lead + [m], dims) for p in (spectrum.real, spectrum.imag))
        re, im = self.multiply((re, im), (sr, si))
        re, im = self.last(re, im, 1.0)
        re, im = self.slice_last(re, n, -1), self.slice_last(im, n, -1)
        return self.multiply((re, im), (wr, wi))

    def hermitian(self, re, im, axis: int, n: int) -> tuple:
        """The n values of a real signal's spectrum from its first n // 2 + 1
        along `axis` (last): X[n - k] = conj X[k]."""
        rank = len(re.type.shape)
        count = n - n // 2 - 1
        if count <= 0:
            return self.slice_last(re, n, axis), self.slice_last(im, n, axis)
        shape = list(re.type.shape)
        starts, limits = [0] * rank, list(shape)
        starts[axis], limits[axis] = 1, 1 + count
        tail_shape = list(shape)
        tail_shape[axis] = count

        def mirrored(v, negate):
            tail = self.e("slice", [v], self._type(tail_shape), start_indices=tuple(starts),
                          limit_indices=tuple(limits), strides=(1,) * rank)
            tail = self.e("reverse", [tail], tail.type, dimensions=(axis,))
            if negate:
                tail = self.e("negate", [tail], tail.type)
            head = self.slice_last(v, n // 2 + 1, axis)
            full = list(shape)
            full[axis] = n
            return self.e("concatenate", [head, tail], self._type(full), dimension=axis)
        return mirrored(re, False), mirrored(im, True)


def unit_roots(exponents: np.ndarray, n: int, sign: float) -> np.ndarray:
    """exp(sign 2 pi i e / n), from e mod n (exact integers) in float64."""
    angle = sign * 2.0 * np.pi * (np.asarray(exponents, np.int64) % n) / n
    return np.exp(1j * angle)


def dft_matrix(n: int, sign: float) -> np.ndarray:
    """[n, n]: exp(sign 2 pi i j k / n)."""
    j = np.arange(n)
    return unit_roots(np.outer(j, j), n, sign)
