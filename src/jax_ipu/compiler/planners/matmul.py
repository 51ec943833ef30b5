"""The matmul planner (after PopLibs poplin): splits batch, rows (M),
columns (N) and the reduced dimension (K) over tiles to minimise estimated
cycles (AMP compute + operand exchange + reduction of partials) while each
tile's operands and partials fit in available_memory_proportion of its
SRAM. K is split in equal chunks so the partials sum in a fixed order."""
from __future__ import annotations

import dataclasses

import numpy as np

from jax_ipu.compiler.cost import matmul_cycles
from jax_ipu.targets import Target


@dataclasses.dataclass(frozen=True)
class MatMulPlan:
    splits: tuple[int, int, int, int]       # tiles along (batch, M, N, K)
    blocks: tuple[int, int, int, int]       # elements per tile along (batch, M, N, K)
    cycles: float                           # estimate of the chosen split
    temporary_bytes: int                    # per tile: operands + partials

    @property
    def tiles(self) -> int:
        return int(np.prod(self.splits))


def _splits(extent: int, limit: int) -> np.ndarray:
    """Powers of two up to the extent (and the extent itself)."""
    values = {1}
    p = 2
    while p <= min(extent, limit):
        values.add(p)
        p *= 2
    if extent <= limit:
        values.add(max(extent, 1))
    return np.array(sorted(values))


def _divisors(extent: int, limit: int) -> np.ndarray:
    if extent <= 1:
        return np.array([1])
    small = [d for d in range(1, int(extent ** 0.5) + 1) if extent % d == 0]
    every = sorted(set(small) | {extent // d for d in small})
    return np.array([d for d in every if d <= limit])


def fits(plan: MatMulPlan, target: Target, proportion: float) -> bool:
    """Whether a plan's operands and partials fit the share of a tile's
    memory that available_memory_proportion gives them."""
    return plan.temporary_bytes <= proportion * target.bytes_per_tile


def plan_matmul(target: Target, batch: int, m: int, n: int, k: int, in_dtype: np.dtype,
                acc_dtype: np.dtype, proportion: float) -> MatMulPlan:
    """K is split in chunks of equal length that divide it; when no such
    split fits the tiles (a long K with no divisor that spreads it, a
    prime), in chunks of ceil(K / chunks) over K padded with zeros (the
    lowering's Copy; zeros add nothing to a product)."""
    plan = _best(target, batch, m, n, k, in_dtype, acc_dtype, proportion, pad_k=False)
    if not fits(plan, target, proportion):
        padded = _best(target, batch, m, n, k, in_dtype, acc_dtype, proportion, pad_k=True)
        if padded.temporary_bytes < plan.temporary_bytes:
            return padded
    return plan


def _best(target: Target, batch: int, m: int, n: int, k: int, in_dtype: np.dtype,
          acc_dtype: np.dtype, proportion: float, pad_k: bool) -> MatMulPlan:
    tiles = target.num_tiles
    grids = np.meshgrid(_splits(batch, tiles), _splits(m, tiles), _splits(n, tiles),
                        _splits(k, tiles) if pad_k else _divisors(k, tiles), indexing="ij")
    pb, pm, pn, pk = (g.ravel().astype(np.float64) for g in grids)
    fits_tiles = pb * pm * pn * pk <= tiles
    pb, pm, pn, pk = pb[fits_tiles], pm[fits_tiles], pn[fits_tiles], pk[fits_tiles]
    bb, mb, nb = np.ceil(batch / pb), np.ceil(m / pm), np.ceil(n / pn)
    kc = np.ceil(k / pk) if pad_k else k / pk
    if pad_k:       # no empty chunks: as many as ceil(K / chunk) needs
        pk = np.ceil(k / kc)
    item, acc = np.dtype(in_dtype).itemsize, np.dtype(acc_dtype).itemsize
    compute = matmul_cycles(target, bb * mb * nb * kc, np.dtype(in_dtype), np.dtype(acc_dtype))
    operand_bytes = (bb * mb * kc + bb * kc * nb) * item
    exchange = target.exchange_fixed_cycles + operand_bytes / target.exchange_bytes_per_cycle
    per_tile_out = np.ceil(batch * m * n / tiles)
    reduction = np.where(pk > 1, target.exchange_fixed_cycles + target.sync_cycles
                         + per_tile_out * pk * acc / target.exchange_bytes_per_cycle
                         + per_tile_out * pk / target.workers_per_tile, 0.0)
    total = compute + exchange + reduction
    temporary = operand_bytes + bb * mb * nb * acc
    in_budget = temporary <= proportion * target.bytes_per_tile
    best = int(np.argmin(np.where(in_budget, total, np.inf))) if in_budget.any() else int(np.argmin(temporary))
    splits = (int(pb[best]), int(pm[best]), int(pn[best]), int(pk[best]))
    blocks = (int(bb[best]), int(mb[best]), int(nb[best]), int(kc[best]))
    return MatMulPlan(splits, blocks, float(total[best]), int(temporary[best]))
