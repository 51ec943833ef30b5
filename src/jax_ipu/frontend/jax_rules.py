"""JAX lowering rules for the ipu platform, where JAX 0.10.2 registers
rules only for named platforms (jax/_src/lax/linalg.py):

- cholesky, triangular_solve: JAX's generic rules emit stablehlo.cholesky
  and stablehlo.triangular_solve, which the compiler implements; nothing
  to register.
- geqrf, householder_product (QR): the generic rules emit custom_calls
  "Qr" and "ProductOfElementaryHouseholderReflectors", implemented too.
- lu: the generic rule is a Python loop of dynamic slices and scatters;
  eigh, svd, tridiagonal and eig have CPU/GPU (LAPACK, cuSOLVER) and TPU
  rules only. These
  get a custom_call "jax_ipu.<op>:<options>" here, which the compiler
  runs as a Factorize kernel (LAPACK's algorithm, as XLA:CPU).

And for threefry keys, iota_2x32_shape (the counters of jax.random): JAX
counts in uint64 and splits the count into 32-bit halves; the IPU has no
64-bit integers, so below 2**32 elements the ipu rule counts in uint32
(the high half is zero), giving the same bits. Likewise lax.mulhi (philox
keys) computes its high word from 16-bit halves instead of a 64-bit product.

Cumulative reductions (cumsum, cumprod, cummax, cummin, cumlogsumexp):
JAX's generic rule is one reduce_window whose window spans the axis, which
gathers n elements for each of the n outputs (XLA rewrites it into a tree,
ReduceWindowRewriter). On long axes the ipu rule is JAX's log-depth
associative_scan instead, as XLA:CPU gets: a 5 x 4096 cumsum no longer
runs out of tile memory, and 1M elements take milliseconds.

top_k of a long row: the IPU sorts each row on one tile, so a row of more
than ~35K elements (a 50K-token vocabulary) did not fit. As XLA's
TopkSplitter, the ipu rule takes the top k of fixed-size chunks (spread
over tiles), then the top k of those candidates: the same values and
indices, ties included (candidates stay in index order).

select_and_scatter_add (the gradient of max and min pooling) gets the rule
JAX gives CPU and GPU: a padded window pads the operand with the select's
identity (-inf for max), which the scan may pick like any element, instead
of leaving the padding to select_and_scatter, which never picks it. So
windows of -inf or NaN over an edge pick what XLA:CPU picks.

device_put inside jit to another memory kind (jax.device_put(x,
jax.memory.Space.Host), a sharding with memory_kind): JAX 0.10.2 emits
the annotate_device_placement custom calls XLA's host offloading reads for
TPU and GPU only; the ipu rule is the same, and the compiler turns the
annotations into transfers to and from streaming memory."""
from __future__ import annotations

PLATFORM = "ipu"


def _custom_call(name: str, **options):
    from jax._src.interpreters import mlir

    target = f"jax_ipu.{name}:" + ",".join(f"{k}={int(bool(v))}" for k, v in options.items())

    def rule(ctx, *operands):
        types = [mlir.aval_to_ir_type(ctx.module_context, aval) for aval in ctx.avals_out]
        return mlir.custom_call(target, result_types=types, operands=list(operands)).results
    return rule


def _lu(ctx, operand):
    return _custom_call("lu")(ctx, operand)


def _eigh(ctx, operand, *, lower, sort_eigenvalues, subset_by_index, algorithm=None):
    n = ctx.avals_in[0].shape[-1]
    if not (subset_by_index is None or tuple(subset_by_index) == (0, n)):
        raise NotImplementedError("eigh with subset_by_index is not supported on the ipu platform")
    return _custom_call("eigh", lower=lower)(ctx, operand)


def _svd(ctx, operand, *, full_matrices, compute_uv, subset_by_index, algorithm=None):
    m, n = ctx.avals_in[0].shape[-2:]
    if not (subset_by_index is None or tuple(subset_by_index) == (0, min(m, n))):
        raise NotImplementedError("svd with subset_by_index is not supported on the ipu platform")
    return _custom_call("svd", full_matrices=full_matrices, compute_uv=compute_uv)(ctx, operand)


def _eig(ctx, operand, *, compute_left_eigenvectors, compute_right_eigenvectors, enable_eigvec_derivs=False,
         implementation=None):
    return _custom_call("eig", compute_left=compute_left_eigenvectors,
                        compute_right=compute_right_eigenvectors)(ctx, operand)


def _tridiagonal(ctx, operand, *, lower):
    return _custom_call("tridiagonal", lower=lower)(ctx, operand)


def _iota_2x32_shape(ctx, *, shape):
    import numpy as np
    from jax._src import core
    from jax._src.interpreters import mlir

    size = int(np.prod(shape, dtype=np.int64))
    if size >= 2 ** 32:
        raise NotImplementedError(f"random bits for {size} elements (2**32 or more) are not supported on "
                                  "the ipu platform")
    aval_out = ctx.avals_out[0]
    flat = mlir.iota(ctx, core.ShapedArray((size,), np.dtype(np.uint32)), dimension=0)
    lo = mlir.hlo.reshape(mlir.aval_to_ir_type(ctx.module_context, aval_out), flat)
    hi = mlir.full_like_aval(ctx, 0, aval_out)
    return hi, lo


def _mulhi(x, y):
    """lax.mulhi (the philox PRNGs' mixing step) without a double-width
    type for 32-bit operands: the high word from 16-bit halves, with the
    signed correction hi - (x < 0 ? y : 0) - (y < 0 ? x : 0)."""
    import numpy as np
    from jax import lax

    dtype = np.dtype(x.dtype)
    bits = 8 * dtype.itemsize
    signed = dtype.kind == "i"
    if bits < 32:   # a 32-bit product holds the whole result
        wide = np.dtype(np.int32 if signed else np.uint32)
        product = lax.mul(x.astype(wide), y.astype(wide))
        shift = lax.shift_right_arithmetic if signed else lax.shift_right_logical
        return shift(product, np.array(bits, wide)).astype(dtype)
    u32 = np.dtype(np.uint32)
    a, b = (lax.bitcast_convert_type(v, u32) if signed else v for v in (x, y))
    low, half = np.uint32(0xFFFF), np.uint32(16)
    a_lo, a_hi, b_lo, b_hi = a & low, a >> half, b & low, b >> half
    lh, hl = a_lo * b_hi, a_hi * b_lo
    mid = ((a_lo * b_lo) >> half) + (lh & low) + (hl & low)
    hi = a_hi * b_hi + (lh >> half) + (hl >> half) + (mid >> half)
    if signed:
        hi = lax.bitcast_convert_type(hi, dtype)
        zero = np.zeros((), dtype)
        hi = hi - lax.select(x < 0, y, lax.full_like(y, 0)) - lax.select(y < 0, x, lax.full_like(x, zero))
    return hi


# Above this many gathered elements (size * axis length) the window form
# costs more than the associative scan's log2(n) steps of slices and adds.
_CUMULATIVE_WINDOW_LIMIT = 1 << 16


def _cumulative(window_reduce, combine):
    def rule(x, *, axis, reverse):
        from jax._src.lax.control_flow.loops import associative_scan, cumred_reduce_window_impl

        if x.size * x.shape[axis] <= _CUMULATIVE_WINDOW_LIMIT:
            return cumred_reduce_window_impl(window_reduce, x, axis=axis, reverse=reverse)
        return associative_scan(combine, x, axis=axis, reverse=reverse)
    return rule


# Rows longer than this are cut into chunks of this many elements for top_k.
_TOP_K_CHUNK = 4096


def _top_k_of_chunks(x, *, k, axis):
    import jax.numpy as jnp
    import numpy as np
    from jax import lax

    x = jnp.moveaxis(x, axis, -1)
    *lead, n = x.shape
    chunks = -(-n // _TOP_K_CHUNK)
    dtype = np.dtype(x.dtype)
    if dtype.kind == "f":   # negative NaN with every payload bit: the least value of the total order
        bits = np.dtype(f"u{dtype.itemsize}")
        lowest = lax.bitcast_convert_type(np.array(np.iinfo(bits).max, bits), dtype)
    else:
        lowest = np.array(np.iinfo(dtype).min, dtype)
    x = lax.pad(x, lowest, [(0, 0, 0)] * len(lead) + [(0, chunks * _TOP_K_CHUNK - n, 0)])
    values, indices = lax.top_k(x.reshape(*lead, chunks, _TOP_K_CHUNK), k)
    indices = indices + (lax.iota(np.int32, chunks) * _TOP_K_CHUNK)[:, None]
    values, best = lax.top_k(values.reshape(*lead, chunks * k), k)
    indices = jnp.take_along_axis(indices.reshape(*lead, chunks * k), best, -1)
    return [jnp.moveaxis(values, -1, axis), jnp.moveaxis(indices, -1, axis)]


def _top_k(ctx, operand, *, k, axis):
    from jax._src.interpreters import mlir
    from jax._src.lax import lax

    n = ctx.avals_in[0].shape[axis]
    if n <= _TOP_K_CHUNK or not isinstance(k, int) or 2 * k > _TOP_K_CHUNK:
        return lax._top_k_lower(ctx, operand, k=k, axis=axis)
    return mlir.lower_fun(_top_k_of_chunks, multiple_results=True)(ctx, operand, k=k, axis=axis)


def _select_and_scatter_add(source, operand, *, select_prim, window_dimensions, window_strides, padding):
    from jax._src.lax import windowed_reductions

    return windowed_reductions._select_and_scatter_add_impl(
        source, operand, select_prim=select_prim, window_dimensions=window_dimensions,
        window_strides=window_strides, padding=padding, expand_padding=any(lo or hi for lo, hi in padding))


# Linear algebra JAX has no generic rule for, and jax-ipu does not run yet:
# (what users call, why not, what to do).
_NOT_YET = {
    "schur": ("jax.scipy.linalg.schur (and sqrtm, solve_sylvester)", "jax-ipu has no Schur decomposition yet"),
    "hessenberg": ("jax.scipy.linalg.hessenberg", "jax-ipu has no Hessenberg reduction yet"),
    "geqp3": ("jax.scipy.linalg.qr(pivoting=True)", "jax-ipu has no column-pivoted QR yet"),
}


def _not_yet(name: str):
    def rule(ctx, *args, **params):
        from jax_ipu.errors import IpuUnimplementedError
        what, why = _NOT_YET[name]
        raise IpuUnimplementedError(      # (raised while JAX traces: the traceback shows the user's line)
            f"lax.linalg.{name} ({what}) does not run on the IPU: {why}. Run it on the CPU "
            f"(jax.device_put(x, jax.devices('cpu')[0]) and jit it there), or use jnp.linalg.eigh / svd "
            f"where the matrix allows")
    return rule


def register() -> None:
    from jax._src import dispatch
    from jax._src.interpreters import mlir
    from jax._src.lax import lax, linalg
    from jax._src.lax import windowed_reductions as wr
    from jax._src.lax.control_flow import loops
    from jax._src.random import prng
    mlir.register_lowering(dispatch.device_put_p, dispatch._tpu_gpu_device_put_lowering, platform=PLATFORM)
    mlir.register_lowering(linalg.lu_p, _lu, platform=PLATFORM)
    for name in _NOT_YET:
        mlir.register_lowering(getattr(linalg, f"{name}_p"), _not_yet(name), platform=PLATFORM)
    mlir.register_lowering(linalg.eigh_p, _eigh, platform=PLATFORM)
    mlir.register_lowering(linalg.svd_p, _svd, platform=PLATFORM)
    mlir.register_lowering(linalg.eig_p, _eig, platform=PLATFORM)
    mlir.register_lowering(linalg.tridiagonal_p, _tridiagonal, platform=PLATFORM)
    mlir.register_lowering(prng.iota_2x32_shape_p, _iota_2x32_shape, platform=PLATFORM)
    mlir.register_lowering(lax.mulhi_p, mlir.lower_fun(_mulhi, multiple_results=False), platform=PLATFORM)
    mlir.register_lowering(lax.top_k_p, _top_k, platform=PLATFORM)
    for prim, window_reduce, combine in [(loops.cumsum_p, wr._reduce_window_sum, lax.add),
                                         (loops.cumprod_p, wr._reduce_window_prod, lax.mul),
                                         (loops.cummax_p, wr._reduce_window_max, lax.max),
                                         (loops.cummin_p, wr._reduce_window_min, lax.min),
                                         (loops.cumlogsumexp_p, wr._reduce_window_logaddexp, loops.logaddexp)]:
        rule = mlir.lower_fun(_cumulative(window_reduce, combine), multiple_results=False)
        mlir.register_lowering(prim, rule, platform=PLATFORM)
    mlir.register_lowering(wr.select_and_scatter_add_p,
                           mlir.lower_fun(_select_and_scatter_add, multiple_results=False), platform=PLATFORM)
