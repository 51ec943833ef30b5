"""stablehlo.rng_bit_generator on 32-bit words (JAX's 'rbg' and
'unsafe_rbg' keys, lax.rng_bit_generator).

JAX keeps the generator's state as uint32[4] but hands StableHLO a
uint64[2] made by bitcast_convert (and unpacks the new state the same way).
The IPU has no 64-bit integers, so this pass, run before the others, keeps
such a state as its 32-bit halves (a uint32[..., 2] "pair", low word first,
as the bitcast lays them out) and writes the generator as element-wise
uint32 ops, following XLA's own expansion (RngBitGeneratorExpander and
xla/hlo/builder/lib/prng.cc) so that the bits match XLA:CPU's:

- DEFAULT and PHILOX: Philox-4x32 with 10 rounds. The key is state[0];
  the 128-bit counter is state[1] (low) : state[0] (high); output i comes
  from word i % 4 of counter + i // 4. The new state is
  [state[0], state[1] + ceil(n / 4)].
- THREE_FRY: Threefry-2x32 with 20 rounds keyed by state[0], counters
  state[1] + the linear index over half the output (XLA splits the shape
  in two halves, one per output word). New state: state[1] + n / 2.

A 64-bit state used any other way keeps its 64-bit type, which the
legalize pass then refuses, naming the op."""
from __future__ import annotations

import numpy as np

from jax_ipu import ir
from jax_ipu.compiler.passes.fuse import reads_of
from jax_ipu.errors import IpuUnimplementedError

U32 = np.dtype(np.uint32)
_WIDE = (np.dtype(np.uint64), np.dtype(np.int64))
_ALGORITHMS = {"DEFAULT": "philox", "PHILOX": "philox", "THREE_FRY": "threefry"}


def expand_rng(module: ir.Module) -> None:
    for function in module.functions.values():
        _block(function.body)


def _block(block: ir.Block) -> None:
    for op in block.ops:
        for region in op.regions:
            _block(region)
    if not any(op.name == "rng_bit_generator" for op in block.ops):
        return
    readers = _readers(block)
    producer = {r: op for op in block.ops for r in op.results}
    expanded = {op for op in block.ops
                if op.name == "rng_bit_generator" and _packs(producer.get(op.operands[0]))
                and all(_unpacks(r) for r in readers.get(op.results[0], []))}
    pairs: dict[ir.Value, ir.Value] = {}      # a 64-bit value -> its uint32[..., 2] halves
    out: list[ir.Op] = []
    for op in block.ops:
        if op in expanded:
            pairs[op.results[0]] = _generate(op, pairs[op.operands[0]], out)
        elif _unpacks(op) and op.operands[0] in pairs:
            _Emit(out, op.loc).make(op.results[0], "bitcast_convert", [pairs[op.operands[0]]])
        else:
            if _packs(op) and any(r in expanded for r in readers.get(op.results[0], [])):
                pairs[op.results[0]] = _Emit(out, op.loc).as_u32(op.operands[0])
                if all(r in expanded for r in readers[op.results[0]]):
                    continue
            out.append(op)
    block.ops[:] = out


def _readers(block: ir.Block) -> dict[ir.Value, list]:
    """value -> the ops of this block reading it (a nested region's read
    counts as its op's); a block result counts as a reader None."""
    found: dict[ir.Value, list] = {}
    for op in block.ops:
        for v in reads_of(op):
            found.setdefault(v, []).append(op)
    for v in block.results:
        found.setdefault(v, []).append(None)
    return found


def _packs(op) -> bool:
    """bitcast_convert of 32-bit [..., 2] to 64-bit integers [...]."""
    if op is None or op.name != "bitcast_convert":
        return False
    src, dst = op.operands[0].type, op.results[0].type
    return (dst.dtype in _WIDE and src.dtype.itemsize == 4 and src.dtype.kind in "iu"
            and src.shape == dst.shape + (2,))


def _unpacks(op) -> bool:
    if op is None or op.name != "bitcast_convert":
        return False
    src, dst = op.operands[0].type, op.results[0].type
    return src.dtype in _WIDE and dst.dtype.itemsize == 4 and dst.shape == src.shape + (2,)


class _Emit:
    """Appends uint32 ops to `out`; values are ir.Values."""

    def __init__(self, out: list, loc: str):
        self.out, self.loc = out, loc

    def op(self, name, operands, shape, dtype=U32, **attrs) -> ir.Value:
        value = ir.Value(ir.TensorType(tuple(shape), np.dtype(dtype)))
        self.out.append(ir.Op(name, list(operands), [value], attrs, [], self.loc))
        return value

    def make(self, result: ir.Value, name, operands, **attrs) -> None:
        """An op producing an existing value."""
        self.out.append(ir.Op(name, list(operands), [result], attrs, [], self.loc))

    def as_u32(self, v: ir.Value) -> ir.Value:
        return v if v.type.dtype == U32 else self.op("bitcast_convert", [v], v.type.shape)

    def const(self, value: int, shape) -> ir.Value:
        c = self.op("constant", [], (), value=np.array(value, U32))
        return self.op("broadcast_in_dim", [c], shape, broadcast_dimensions=())

    def word(self, pair: ir.Value, i: int, j: int, shape) -> ir.Value:
        """pair[i, j] broadcast to `shape`."""
        s = self.op("slice", [pair], (1, 1), start_indices=(i, j), limit_indices=(i + 1, j + 1),
                    strides=(1, 1))
        return self.op("broadcast_in_dim", [self.op("reshape", [s], ())], shape, broadcast_dimensions=())

    def iota(self, shape, dim: int = 0) -> ir.Value:
        return self.op("iota", [], shape, iota_dimension=dim)

    def binary(self, name, a, b) -> ir.Value:
        if isinstance(b, int):
            b = self.const(b, a.type.shape)
        return self.op(name, [a, b], a.type.shape)

    def less(self, a, b) -> ir.Value:
        return self.op("compare", [a, b], a.type.shape, np.bool_, comparison_direction="LT",
                       compare_type="UNSIGNED")

    def add_carry(self, lo, hi, amount):
        """(hi:lo) + amount, a 64-bit addition of a 32-bit amount."""
        new_lo = self.binary("add", lo, amount)
        carry = self.op("convert", [self.less(new_lo, lo)], lo.type.shape)
        return new_lo, self.binary("add", hi, carry)

    def rotate_left(self, v, bits: int) -> ir.Value:
        return self.binary("or", self.binary("shift_left", v, bits), self.binary("shift_right_logical", v, 32 - bits))

    def mul_hi_lo(self, a, k: int):
        """The high and low words of the 64-bit product a * k, from 16-bit halves."""
        a_lo, a_hi = self.binary("and", a, 0xFFFF), self.binary("shift_right_logical", a, 16)
        k_lo, k_hi = k & 0xFFFF, k >> 16
        ll = self.binary("multiply", a_lo, k_lo)
        lh = self.binary("multiply", a_lo, k_hi)
        hl = self.binary("multiply", a_hi, k_lo)
        hh = self.binary("multiply", a_hi, k_hi)
        mid = self.binary("add", self.binary("add", self.binary("shift_right_logical", ll, 16),
                                             self.binary("and", lh, 0xFFFF)), self.binary("and", hl, 0xFFFF))
        hi = self.binary("add", self.binary("add", hh, self.binary("shift_right_logical", lh, 16)),
                         self.binary("add", self.binary("shift_right_logical", hl, 16),
                                     self.binary("shift_right_logical", mid, 16)))
        return hi, self.binary("multiply", a, k)

    def pair_of(self, words: list, shape) -> ir.Value:
        """uint32[len(words), 2] from (low, high) scalar-shaped words."""
        parts = [self.op("reshape", [w], (1, 1)) for w in words]
        return self.op("reshape", [self.op("concatenate", parts, (len(words) * 2, 1), dimension=0)], shape)


def _generate(op: ir.Op, state: ir.Value, out: list) -> ir.Value:
    """The expansion of one rng_bit_generator: makes op.results[1] (the bits)
    and returns the new state's uint32 pair."""
    algorithm = _ALGORITHMS.get(str(op.attrs.get("rng_algorithm", "DEFAULT")))
    bits = op.results[1]
    if algorithm is None:
        raise IpuUnimplementedError.for_op(op, f"rng algorithm {op.attrs.get('rng_algorithm')} is not supported",
                                           "Use DEFAULT, PHILOX or THREE_FRY")
    if state.type.shape != (2, 2):
        raise IpuUnimplementedError.for_op(op, f"a generator state of {state.type.shape[0]} 64-bit words is not "
                                               "supported", "Use a uint32[4] key (two 64-bit words)")
    if bits.type.dtype.itemsize > 4:
        raise IpuUnimplementedError.for_op(op, f"the IPU has no {ir.TYPE_NAMES.get(bits.type.dtype)} type "
                                               f"(in {bits.type})", "Ask for 32-bit (or narrower) random bits")
    e = _Emit(out, op.loc)
    n = bits.type.size
    if algorithm == "philox" and -(-n // 4) >= 2 ** 32:
        raise IpuUnimplementedError.for_op(op, f"{n} random words at once are too many",
                                           "Ask for fewer than 2**34 at a time")
    return (_philox if algorithm == "philox" else _threefry)(e, state, bits, n)


def _finish(e: _Emit, words: ir.Value, bits: ir.Value) -> None:
    """words (uint32, bits' shape) -> bits, narrowed to its type."""
    e.make(bits, "convert" if bits.type.dtype != U32 else "reshape", [words])


def _philox(e: _Emit, state: ir.Value, bits: ir.Value, n: int) -> ir.Value:
    n4 = -(-n // 4)
    one = ()
    key = [e.word(state, 0, 0, one), e.word(state, 0, 1, one)]
    counter = [e.word(state, 1, 0, one), e.word(state, 1, 1, one)]
    if n4:
        shape = (n4,)
        k = [e.word(state, 0, 0, shape), e.word(state, 0, 1, shape)]
        c0, c1 = e.add_carry(e.word(state, 1, 0, shape), e.word(state, 1, 1, shape), e.iota(shape))
        # The carry out of the counter's low 64 bits goes into its high half (the key words).
        carry = e.op("convert", [e.op("and", [e.less(c0, e.word(state, 1, 0, shape)),
                                              e.op("compare", [c1, e.const(0, shape)], shape, np.bool_,
                                                   comparison_direction="EQ", compare_type="UNSIGNED")],
                                      shape, np.bool_)], shape)
        c2, c3 = e.add_carry(k[0], k[1], carry)
        x = [c0, c1, c2, c3]
        for _ in range(10):
            hi0, lo0 = e.mul_hi_lo(x[0], 0xD2511F53)
            hi1, lo1 = e.mul_hi_lo(x[2], 0xCD9E8D57)
            x = [e.binary("xor", e.binary("xor", hi1, x[1]), k[0]), lo1,
                 e.binary("xor", e.binary("xor", hi0, x[3]), k[1]), lo0]
            k = [e.binary("add", k[0], 0x9E3779B9), e.binary("add", k[1], 0xBB67AE85)]
        columns = [e.op("reshape", [w], (n4, 1)) for w in x]
        flat = e.op("reshape", [e.op("concatenate", columns, (n4, 4), dimension=1)], (4 * n4,))
        if 4 * n4 != n:
            flat = e.op("slice", [flat], (n,), start_indices=(0,), limit_indices=(n,), strides=(1,))
        _finish(e, e.op("reshape", [flat], bits.type.shape), bits)
    else:
        _finish(e, e.op("constant", [], bits.type.shape, value=np.zeros(bits.type.shape, U32)), bits)
    new_lo, new_hi = e.add_carry(counter[0], counter[1], e.const(n4, one))
    return e.pair_of([key[0], key[1], new_lo, new_hi], (2, 2))


def _halves(shape: tuple) -> tuple[tuple, int]:
    """XLA's SplitShapeIntoHalves: (half shape, split dimension)."""
    if not shape:
        return (1,), 0
    split = next((i for i, d in enumerate(shape) if d % 2 == 0), None)
    if split is None:
        split = max(range(len(shape)), key=lambda i: (shape[i], -i))
    half = shape[:split] + (-(-shape[split] // 2), 1) + shape[split + 1:]
    return half, split


def _threefry(e: _Emit, state: ir.Value, bits: ir.Value, n: int) -> ir.Value:
    shape = bits.type.shape
    half, split = _halves(shape)
    count = int(np.prod(half))
    one = ()
    key = [e.word(state, 0, 0, one), e.word(state, 0, 1, one)]
    counter = [e.word(state, 1, 0, one), e.word(state, 1, 1, one)]
    if n:
        index = e.op("reshape", [e.iota((count,))], half)
        x = list(e.add_carry(e.word(state, 1, 0, half), e.word(state, 1, 1, half), index))
        ks = [e.word(state, 0, 0, half), e.word(state, 0, 1, half)]
        ks.append(e.binary("xor", e.binary("xor", ks[0], ks[1]), 0x1BD11BDA))
        x = [e.binary("add", x[0], ks[0]), e.binary("add", x[1], ks[1])]
        rotations = ((13, 15, 26, 6), (17, 29, 16, 24))
        for block in range(5):
            for r in rotations[block % 2]:
                x[0] = e.binary("add", x[0], x[1])
                x[1] = e.binary("xor", x[0], e.rotate_left(x[1], r))
            x = [e.binary("add", x[0], ks[(block + 1) % 3]),
                 e.binary("add", e.binary("add", x[1], ks[(block + 2) % 3]), block + 1)]
        if shape:
            concat_shape = half[:split + 1] + (2,) + half[split + 2:]
            joined = e.op("concatenate", x, concat_shape, dimension=split + 1)
            even = shape[:split] + (2 * half[split],) + shape[split + 1:]
            words = e.op("reshape", [joined], even)
            if even != shape:
                words = e.op("slice", [words], shape, start_indices=(0,) * len(shape), limit_indices=shape,
                             strides=(1,) * len(shape))
        else:
            words = e.op("reshape", [x[0]], ())
        _finish(e, words, bits)
    else:
        _finish(e, e.op("constant", [], shape, value=np.zeros(shape, U32)), bits)
    new_lo, new_hi = e.add_carry(counter[0], counter[1], e.const(count, one))
    return e.pair_of([key[0], key[1], new_lo, new_hi], (2, 2))
