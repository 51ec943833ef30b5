"""The IPUs the Model simulates, every figure a named field (see docs/ipu.md
for sources; figures marked unverified there are parameters, not truths)."""
from __future__ import annotations

import dataclasses
import functools

import ml_dtypes
import numpy as np

from jax_ipu.errors import IpuInvalidArgument

# The element types IPU tiles hold and compute in; no 64-bit, bfloat16 or
# complex types.
IPU_DTYPES: frozenset[np.dtype] = frozenset(np.dtype(t) for t in (
    np.float32, np.float16, np.int32, np.uint32, np.int16, np.uint16, np.int8, np.uint8, np.bool_))
BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
COMPLEX64 = np.dtype(np.complex64)
# Types the IPU holds but has no arithmetic for, emulated unless a program
# asks for native types only (JAX_IPU_EMULATE_TYPES=0, the compiler option
# emulate_types): bfloat16 stored in 16 bits and computed in float32,
# rounded after every op; complex64 as pairs of float32 (docs/semantics.md).
EMULATED_DTYPES: frozenset[np.dtype] = frozenset({BFLOAT16, COMPLEX64})
# The JAX memory kind of an IPU's streaming memory. JAX's host-offloading
# idioms (memory_kind="pinned_host", jax.memory.Space.Host) name the memory
# beside a device's own that values are parked in and moved back from; on
# the IPU that role is streaming memory's, so offloading code runs unchanged.
STREAMING_MEMORY_KIND = "pinned_host"
# What a compile error for a type outside IPU_DTYPES advises.
USE_IPU_TYPES = "Use float32 or float16 (the IPU holds f32, f16, i32, u32, i16, u16, i8, u8, bool)"
# The 64-bit types the IPU runs as 32-bit ones when asked to (JAX_IPU_F64_AS_F32);
# complex128 becomes complex64, itself emulated.
AS_32: dict[np.dtype, np.dtype] = {np.dtype(np.float64): np.dtype(np.float32),
                                   np.dtype(np.int64): np.dtype(np.int32),
                                   np.dtype(np.uint64): np.dtype(np.uint32),
                                   np.dtype(np.complex128): COMPLEX64}


@dataclasses.dataclass(frozen=True)
class Target:
    name: str
    num_tiles: int
    bytes_per_tile: int
    clock_hz: float
    workers_per_tile: int = 6
    fp32_flops_per_cycle: int = 32          # per tile, AMP, fp32 inputs
    fp16_flops_per_cycle: int = 128         # per tile, AMP, fp16 inputs
    vector_bytes: int = 8                   # 64-bit SIMD: float2 or half4 a cycle
    int_elements_per_cycle: int = 1         # the integer unit is scalar
    sram_read_bytes_per_cycle: int = 16
    sram_write_bytes_per_cycle: int = 8
    # Per tile, each way: Graphcore's 8 TB/s GC200 exchange over 1472 tiles at
    # 1.33 GHz is 4.1 B/cycle (docs/ipu.md). Pairs of tiles sharing a bus can
    # receive the same data at twice this; the Model does not count that.
    exchange_bytes_per_cycle: int = 4
    # An on-chip sync and the fixed cost of one exchange, as PopLibs' CTC loss
    # planner charges them (popnn/CTCLossPlan.cpp: 90 and 100 cycles, checked
    # against an execution trace); not published hardware measurements.
    exchange_fixed_cycles: int = 100
    sync_cycles: int = 90
    host_link_bytes_per_second: float = 64e9
    supervisor_cycles: int = 11             # element-wise vertex overhead
    # A control program's decision on every tile's supervisor (a loop's
    # counter tested and decremented, or a predicate tested, and the branch
    # taken): one taken branch, which stalls the supervisor 6 cycles, as
    # PopLibs' supervisor estimates charge a taken brnzdec or bri
    # (poplin/PerformanceEstimation.hpp, docs/ipu.md [17]).
    branch_cycles: int = 6
    # AMP [N,16]x[16,16] in fp16 takes 4N + 330 cycles: 256N multiply-adds
    # at fp16_flops_per_cycle / 2 a cycle, plus this fixed cost.
    amp_fixed_cycles: int = 330
    # The AMP as PopLibs' convolution vertices use it (docs/ipu.md): conv
    # units per tile by (input, partials) type (16 for float16 with float16
    # partials, 8 with float32 partials or float32 inputs: PopLibs' vertex
    # tests, "16 only on IPU2 / IPU21"), input bytes loaded a cycle (the
    # 64-bit data path: 4 float16 or 2 float32), the conv unit's chain
    # (4 input loads: 16 float16 or 8 float32 weights per unit), and the
    # weight loads (ld128, which PopLibs halves unless asked otherwise).
    conv_units_f16_f16: int = 16
    conv_units_f16_f32: int = 8
    conv_units_f32_f32: int = 8
    conv_input_load_bytes: int = 8
    conv_unit_chain_length: int = 4
    conv_coeff_load_bytes_per_cycle: int = 16
    # Emulated types (docs/ipu.md, "Emulated types"), per element on the
    # integer pipe (int_elements_per_cycle a cycle): a bfloat16 widened to
    # float32 is its 16 bits moved into the high half of a register (one
    # permute instruction); a float32 rounded to bfloat16 (to nearest, ties
    # to even, NaN kept quiet) takes an integer sequence: the rounding bit,
    # the bias added, the shift, and a NaN select.
    bf16_widen_cycles: int = 1
    bf16_round_cycles: int = 6
    # A complex64 op on float2 registers moves the real and imaginary parts
    # between lanes (swaps, broadcasts of one part) besides its real ops:
    # this many permute cycles per element, per complex operand.
    complex_permute_cycles: int = 1
    # IPU-Links between chips (Mk2: 10 links at 32 GB/s each, 320 GB/s a chip;
    # Graphcore's IPU-M2000 / GC200 product pages). A ring collective is
    # assumed to use this many links per hop and direction (unverified).
    ipu_link_bytes_per_second: float = 32e9
    ipu_links_per_hop: int = 1
    ipu_link_latency_cycles: int = 1000     # per hop (unverified)
    ipu_sync_cycles: int = 2000             # sync across IPUs per collective (unverified)
    # GW-Links between IPU-Link domains (IPU-PODs): each IPU-Machine's
    # gateway has 2 x 100 Gbps (Bow-2000 datasheet, IPU-M2000 datasheet);
    # a ring collective crossing PODs goes through one machine's two links
    # per crossing (docs/ipu.md). The latency is unverified: a parameter.
    gw_link_bytes_per_second: float = 12.5e9
    gw_links_per_hop: int = 2
    gw_link_latency_cycles: int = 10000     # per crossing, ~7.5 us at 1.33 GHz (unverified)
    # Streaming memory: the DRAM beside the IPUs (an IPU-M2000 ships with 128
    # GB in two 64 GB DIMMs behind its IPU-Gateway, up to 256 GB), reached only
    # by transfers to and from tile memory (Poplar's remote buffers). 3.2 GB/s
    # an IPU is derived from Graphcore's measured off-chip-optimizer steps
    # with four IPUs streaming at once (popxl-addons tutorial; docs/ipu.md);
    # the PCIe Gen4 x8 link from each IPU to the gateway bounds it at 15.75.
    streaming_bytes_per_second: float = 3.2e9
    streaming_latency_cycles: int = 2000    # per transfer (unverified; a parameter)
    streaming_bytes: int = 64 * 10**9       # per IPU: up to 256 GB for an IPU-Machine's 4 IPUs

    def describe(self) -> str:
        return (f"IPU Model {self.name} ({self.num_tiles} tiles, {self.bytes_per_tile // 1024} KiB/tile, "
                f"{self.clock_hz / 1e9:.3g} GHz)")

    def conv_units(self, in_dtype: np.dtype, partials_dtype: np.dtype) -> int:
        """AMP conv units a tile's convolution vertices use (PopLibs'
        getNumConvUnits): each accumulates one output channel."""
        if np.dtype(in_dtype).itemsize == 4:
            return self.conv_units_f32_f32
        return self.conv_units_f16_f16 if np.dtype(partials_dtype).itemsize == 2 else self.conv_units_f16_f32

    def vector_width(self, dtype: np.dtype) -> int:
        """Elements one vector instruction handles: bfloat16 is computed in
        float32 (widened first), a complex64 is one float2."""
        dtype = np.dtype(dtype)
        if dtype == BFLOAT16:
            return self.vector_bytes // 4
        if dtype.kind in "fc":
            return max(1, self.vector_bytes // dtype.itemsize)
        return self.int_elements_per_cycle


# Always-live code and vertex state of the codelets a program runs, from
# PopLibs' sources at 7eac0f26 (docs/ipu.md, "Code and vertex state"):
# codelet family -> (code bytes on each tile that runs it, fixed vertex
# state bytes), or by (family, its template arguments) where they differ.
# Code is the IPU instructions (4 bytes each, a bundle 8) of the assembly
# codelet's sections for one instantiation; vertex state the layout of its
# fields, as the assembly's vertex-state offsets read them.
_CODELET_MEMORY = {
    # conv_partial_nx1_supervisor.S (one of the 8 instantiations in
    # conv_partial_nx1_half_float_8_and_half_half_16.S: 926 B), its worker
    # convPartialNx1Flattened (532 B) and convNx1ZeroOutField (68 B);
    # state: the SUP_* offsets with DeltaNElements worklists (50 B, to 52).
    ("ConvPartialnx1", "float16"): (926 + 532 + 68, 52),
    ("ConvPartialnx1", "float32"): (862 + 640 + 68, 52),   # conv_partial_nx1_float_float.S
    # conv_partial_1x1_supervisor.S (370 B an instantiation) and its worker
    # convPartialFlattenedField (628 B; 496 B for float); state: its SUP_*
    # offsets (28 B). A matmul's partials are a 1x1 convolution in poplin.
    ("ConvPartial1x1Out", "float16"): (370 + 628, 28),
    ("ConvPartial1x1Out", "float32"): (370 + 496, 28),
    ("MatMulPartial", "float16"): (370 + 628, 28),
    ("MatMulPartial", "float32"): (370 + 496, 28),
    # poplin ReduceAdd.S, a section per (partials, out) type; state: its
    # VOFF_* offsets with ONE_PTR pointers (12 B).
    ("ReduceAdd", "float16,float16"): (400, 12),
    ("ReduceAdd", "float16,float32"): (424, 12),
    ("ReduceAdd", "float32,float16"): (320, 12),
    ("ReduceAdd", "float32,float32"): (224, 12),
    # popops' reduction vertices (ReductionSpecial01Acc.S: the Reduce entry
    # 96 B, its largest _Reduce_load_state 452 B, process_common 108,
    # outer_loop_setup 60, zero_and_load 24); state: ReductionsCommon.h.S's
    # offsets with ONE_PTR and DeltaNElements fields (20 B unscaled).
    ("ReducePartial", ""): (96 + 452 + 108 + 60 + 24, 20),
    ("ReduceCombine", ""): (96 + 452 + 108 + 60 + 24, 20),
    ("Reduce", ""): (96 + 452 + 108 + 60 + 24, 20),
}
# popops' fused element-wise expressions are a codelet each (ExpressionGenerator.cpp):
# out a Vector<SPAN> (8 B), each input a Vector<ONE_PTR> or a scalar's
# pointer (4 B); immediates are in the generated code. The code is C++, not
# in the sources: charged as binaryOps2D.S's vertex, its entry (60 B) and
# loop (178.5 B on average over its ops' loops), and per further fused op
# the instructions that op adds to such a loop (4: it appears in the fast
# and the slow loop and in the two remainders of the 4x16-bit loop).
ELEMENTWISE_ENTRY_CODE_BYTES = 60 + 179
ELEMENTWISE_OP_CODE_BYTES = 4 * 4
ELEMENTWISE_READ_STATE_BYTES = 4
ELEMENTWISE_WRITE_STATE_BYTES = 8
# Any other codelet: the reductions' code (740 B, the median of the table),
# its fields as an element-wise vertex's (4 B a read, 8 B a write).
DEFAULT_CODE_BYTES = 740


def codelet_code_key(codelet: str) -> str:
    """The codelet whose code a vertex runs: each fused element-wise
    expression its own (popops generates one per expression), any other
    codelet by its name and template arguments."""
    return codelet if codelet.startswith("ElementwiseChain") else codelet.split("[")[0]


@functools.cache
def codelet_memory(codelet: str, reads: int, writes: int) -> tuple[int, int]:
    """(code bytes on a tile that runs `codelet`, vertex state bytes of one
    of its vertices reading `reads` and writing `writes` tensors)."""
    name, _, rest = codelet.partition("<")
    args, _, ops = rest.partition(">")
    if name == "ElementwiseChain":
        count = len(ops.strip("[]").split(",")) if ops.strip("[]") else 1
        return (ELEMENTWISE_ENTRY_CODE_BYTES + ELEMENTWISE_OP_CODE_BYTES * (count - 1),
                ELEMENTWISE_READ_STATE_BYTES * reads + ELEMENTWISE_WRITE_STATE_BYTES * writes)
    for key in ((name, args), (name, args.split(",")[0]), (name, "")):
        if key in _CODELET_MEMORY:
            return _CODELET_MEMORY[key]
    return DEFAULT_CODE_BYTES, ELEMENTWISE_READ_STATE_BYTES * reads + ELEMENTWISE_WRITE_STATE_BYTES * writes


_TARGETS = {
    "ipu1": Target("ipu1", num_tiles=1216, bytes_per_tile=256 * 1024, clock_hz=1.6e9,
                   fp32_flops_per_cycle=16, fp16_flops_per_cycle=64, conv_units_f16_f16=8,
                   conv_coeff_load_bytes_per_cycle=8),
    "ipu2": Target("ipu2", num_tiles=1472, bytes_per_tile=624 * 1024, clock_hz=1.33e9),
    "ipu21": Target("ipu21", num_tiles=1472, bytes_per_tile=624 * 1024, clock_hz=1.85e9,
                    host_link_bytes_per_second=100e9 / 8),   # 100 GbE RoCE (Bow-2000; unverified)
}


def is_float(dtype) -> bool:
    """Whether `dtype` is a real floating-point type (bfloat16 included,
    whose numpy kind is 'V')."""
    dtype = np.dtype(dtype)
    return dtype.kind == "f" or dtype == BFLOAT16


def get_target(name: str = "ipu2", num_tiles: int | None = None) -> Target:
    """`num_tiles` shrinks the IPU, as the IPU Model's tile option does."""
    try:
        target = _TARGETS[name]
    except KeyError:
        raise IpuInvalidArgument(f"unknown IPU target {name!r}: expected one of {', '.join(_TARGETS)}") from None
    if num_tiles is not None:
        if not 1 <= num_tiles <= target.num_tiles:
            raise IpuInvalidArgument(f"{name} has 1 to {target.num_tiles} tiles, not {num_tiles}")
        target = dataclasses.replace(target, num_tiles=num_tiles)
    return target
