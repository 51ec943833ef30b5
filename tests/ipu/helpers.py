"""The tests' shared helpers, the one module tests import helpers from
(`from helpers import ...`). Two ways to run a program on the IPU:
`run_on(device, fn, ...)` goes through the plugin (jax.jit on an ipu
device); `run_ipu(fn, ..., target=...)` compiles fn's StableHLO for a
Target (by default the 16-tile SMALL) and runs the Program on the IPU
Model's Engine directly. `assert_matches_cpu` compares either with
XLA:CPU, with the tolerances in TOLERANCE unless a test states its own.
Inputs: random_array, values (with each dtype's edge cases), with_specials
(NaN, infinities, signed zeros), matrix and spd. `run_python` runs code in
a fresh interpreter (tests of the defaults, several processes)."""
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zlib

import jax
import ml_dtypes
import numpy as np
from jax._src.lib import _jax
from jaxlib.mlir.dialects import stablehlo

from jax_ipu.compiler import CompileOptions, compile_module
from jax_ipu.graph import serialize
from jax_ipu.graph.validate import validate
from jax_ipu.model.engine import Engine
from jax_ipu.stablehlo import import_module
from jax_ipu.targets import get_target

# Every dtype the IPU holds.
IPU_DTYPES = [np.float32, np.float16, np.int32, np.uint32, np.int16, np.uint16,
              np.int8, np.uint8, np.bool_]
# The types it emulates (docs/semantics.md).
BF16 = np.dtype(ml_dtypes.bfloat16)
C64 = np.dtype(np.complex64)
EMULATED_DTYPES = [BF16, C64]


def run_on(device, fn, *args):
    """fn jitted and run on `device` (a program without arguments too): its
    results as a pytree of numpy arrays."""
    with jax.default_device(device):
        return jax.tree.map(np.asarray, jax.jit(fn)(*jax.device_put(args, device)))


def on_cpu(fn, *args):
    """The reference: fn on XLA:CPU (run_on the CPU device)."""
    return run_on(jax.devices("cpu")[0], fn, *args)


# A small IPU: tensors of a few hundred elements already spread over tiles.
SMALL = get_target("ipu2", num_tiles=16)
CPU = jax.devices("cpu")[0]


def lower(f, *args, keep_unused: bool = False):
    """f as the IPU plugin receives it: JAX's portable artifact, in which
    chlo ops are already rewritten (erf, for one, into a composite).
    keep_unused: every argument an input, used or not."""
    text = jax.jit(f, keep_unused=keep_unused).lower(*args).as_text(debug_info=True)
    return import_module(_jax.mlir.serialize_portable_artifact(text, stablehlo.get_current_version()))


def compile_fn(f, *args, target=SMALL, keep_unused: bool = False, **options):
    """f compiled for `target` (CompileOptions from `options`), validated."""
    program = compile_module(lower(f, *args, keep_unused=keep_unused), target, CompileOptions(**options))
    validate(program, target.num_tiles)
    return program


def run_ipu(f, *args, target=SMALL, **options) -> list[np.ndarray]:
    """f compiled for `target` and run on the Model's Engine: its results, flat."""
    program = compile_fn(f, *args, target=target, **options)
    return Engine(target).run(program, [np.asarray(a) for a in args])


def run_cpu(f, *args) -> list[np.ndarray]:
    """f on XLA:CPU, its results as a list (a tuple or list result unpacked)."""
    out = jax.jit(f)(*[jax.device_put(a, CPU) for a in args])
    return [np.asarray(o) for o in (out if isinstance(out, (tuple, list)) else [out])]


# assert_matches_cpu's default tolerances, (rtol, atol) by dtype: float32 for
# programs whose every op rounds once on both sides (element-wise ops, data
# movement); tests whose sums run in another order than XLA:CPU's (planned
# matmuls, reductions over tiles) state their own. Integers and booleans are
# always compared exactly.
TOLERANCE = {np.dtype(np.float32): (2e-6, 1e-6), np.dtype(np.float16): (2e-3, 2e-3),
             BF16: (1.6e-2, 1.6e-2), C64: (2e-6, 1e-6)}


def is_inexact(dtype) -> bool:
    """Floats (bfloat16, whose numpy kind is 'V', included) and complex."""
    dtype = np.dtype(dtype)
    return dtype.kind in "fc" or dtype == BF16


def assert_matches_cpu(fn, *args, rtol=None, atol=None, scaled=False, exact=None, device=None,
                       target=None, got=None):
    """Runs fn jitted on the IPU and on XLA:CPU and asserts that the results
    match, leaf by leaf: same shapes and dtypes; integers and booleans equal;
    floats within |got - want| <= atol + rtol * |want|, with NaN and the
    infinities in the same places. Returns the IPU's results (numpy arrays).

    rtol, atol: a number for every float leaf, or a {dtype: number} dict
        (the dtypes it leaves out keep TOLERANCE's defaults).
    scaled: atol is relative to each leaf's scale, max(1, max |want|) over
        its finite elements (factorisations, float16 convolutions).
    exact: True compares float leaves by value too (-0.0 == 0.0, NaN ==
        NaN); "bits" compares every leaf's bytes (NaN payloads, signed zeros).
    device: the ipu device to run on (default the first), through the
        plugin; the result trees must match too.
    target: instead, compile fn for this Target and run the Program on the
        Model's Engine (run_ipu); its results are a flat list of leaves.
    got: the IPU's results the test already has (say, of a program it
        compiled and inspected), compared leaf by leaf instead of running fn."""
    want = on_cpu(fn, *args)
    want_leaves, want_tree = jax.tree_util.tree_flatten_with_path(want)
    if got is None and target is None:
        got = run_on(device if device is not None else jax.devices("ipu")[0], fn, *args)
        assert jax.tree.structure(got) == want_tree, \
            f"the IPU's results have the tree {jax.tree.structure(got)}, XLA:CPU's {want_tree}"
    elif got is None:
        got = run_ipu(fn, *args, target=target)
    got_leaves = jax.tree.leaves(got)
    assert len(got_leaves) == len(want_leaves), \
        f"the IPU gives {len(got_leaves)} results, XLA:CPU {len(want_leaves)}"
    for (path, w), g in zip(want_leaves, got_leaves, strict=True):
        _assert_leaf_matches(jax.tree_util.keystr(path) or "the result", np.asarray(g), np.asarray(w),
                             rtol, atol, scaled, exact)
    return jax.tree.map(np.asarray, got)


def _tolerance(value, dtype, which: int) -> float:
    """rtol (which=0) or atol (1) for a float leaf of `dtype`."""
    if isinstance(value, dict):
        value = {np.dtype(k): v for k, v in value.items()}.get(dtype)
    if value is None:
        if dtype not in TOLERANCE:
            raise ValueError(f"assert_matches_cpu has no default tolerance for {dtype}: pass rtol and atol")
        value = TOLERANCE[dtype][which]
    return value


def _assert_leaf_matches(where, g, w, rtol, atol, scaled, exact):
    assert g.dtype == w.dtype and g.shape == w.shape, \
        f"{where}: the IPU gives {g.dtype}{list(g.shape)}, XLA:CPU {w.dtype}{list(w.shape)}"
    is_float = is_inexact(w.dtype)
    # Compared in float64 (complex128): bfloat16 has no arithmetic of its own.
    wide = np.complex128 if w.dtype.kind == "c" else np.float64
    with np.errstate(invalid="ignore", over="ignore"):
        if exact == "bits":
            bits = f"u{w.dtype.itemsize}"
            bad = g.view(bits) != w.view(bits)
            rule = "bit for bit equal to"
        elif exact or not is_float:
            bad = g != w
            if is_float:
                bad &= ~(_nan(g) & _nan(w))
            rule = "equal to"
        else:
            rtol, atol = _tolerance(rtol, w.dtype, 0), _tolerance(atol, w.dtype, 1)
            g64, w64 = g.astype(wide), w.astype(wide)
            finite = np.isfinite(w64)
            if scaled:
                atol *= max(1.0, float(np.abs(w64[finite]).max(initial=0)))
            within = np.abs(g64 - w64) <= atol + rtol * np.abs(w64)
            # Where XLA:CPU gives an infinity or NaN, the IPU must give the same.
            same = (g64 == w64) | (_nan(g64) & _nan(w64))
            bad = ~np.where(finite, within, same)
            rule = f"within rtol={rtol:g}, atol={atol:g} of"
        if not bad.any():
            return
        # The worst element: the largest difference (a NaN or an infinity the
        # other side lacks counts as the largest).
        if w.dtype == np.bool_:
            diff = bad.astype(np.float64)
        else:
            diff = np.abs(g.astype(wide) - w.astype(wide))
            diff = np.where(np.isnan(diff), np.inf, diff)
    worst = np.unravel_index(np.argmax(np.where(bad, diff, -1.0)), w.shape)
    raise AssertionError(
        f"{where} ({w.dtype}{list(w.shape)}): {int(bad.sum())} of {w.size} elements are not {rule} XLA:CPU's; "
        f"the worst at index {tuple(int(i) for i in worst)}: IPU {g[worst]!s}, XLA:CPU {w[worst]!s}")


def _nan(x):
    """NaN, or a complex number with a NaN part."""
    x = np.asarray(x)
    if x.dtype.kind == "c":
        return np.isnan(x.real) | np.isnan(x.imag)
    return np.isnan(x.astype(np.float64) if x.dtype == BF16 else x)


def random_array(rng: np.random.Generator, shape, dtype) -> np.ndarray:
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if dtype.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    if is_inexact(dtype):
        return rng.standard_normal(shape).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(max(info.min, -100), min(info.max, 100), size=shape, endpoint=True).astype(dtype)


def values(dtype, shape=(1001,), seed=0, positive=False) -> np.ndarray:
    """Random values with the dtype's edge cases mixed in."""
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    size = int(np.prod(shape))
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if dtype.kind == "c":
        # Each edge case as the real part, the imaginary part, and both.
        re, im = values(np.float32, shape, seed, positive), values(np.float32, shape, seed + 7, positive)
        n = min(12, size)
        im.flat[n:2 * n] = re.flat[:n]
        re.flat[n:2 * n] = 0.0
        return _complex(re, im, dtype)
    if is_inexact(dtype):
        x = rng.standard_normal(size) * 4
        edges = [0.0, -0.0, 0.5, -0.5, 1.5, -2.5, 1e-3, 60000.0, -60000.0]
        if not positive:
            edges += [np.inf, -np.inf, np.nan]
    else:
        info = np.iinfo(dtype)
        x = rng.integers(max(info.min, -100), min(info.max, 100), size, endpoint=True)
        edges = [0, 1, info.max, info.min, info.max - 1] + ([-1, info.min + 1] if info.min else [])
    x = x.astype(dtype)
    n = min(len(edges), size)
    x[:n] = np.array(edges[:n]).astype(dtype)
    if positive:
        x = np.abs(x) if is_inexact(dtype) else x
    return x.reshape(shape)


def _complex(re, im, dtype):
    """The complex array of these parts (re + 1j * im would turn an
    infinite part into NaN)."""
    out = np.empty(np.shape(re), dtype)
    out.real, out.imag = re, im
    return out


def with_specials(x):
    """Floats with NaN, infinities and signed zeros."""
    if is_inexact(x.dtype) and x.dtype.kind != "c" and x.size >= 6:
        x = x.copy()
        x.flat[:6] = [np.nan, -np.inf, np.inf, -0.0, 0.0, -np.nan]
    return x


def matrix(shape, seed=0):
    """A random float32 matrix (or batch of them)."""
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def spd(shape, seed=0):
    """A random symmetric positive definite float32 matrix (or batch)."""
    a = matrix(shape, seed)
    return a @ np.swapaxes(a, -1, -2) + shape[-1] * np.eye(shape[-1], dtype=np.float32)


def run_python(code: str, path=(), timeout: float = 240, **env) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter with extra environment variables;
    `path`: folders (say, of a test's case modules) put first on its
    PYTHONPATH."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_IPU", "TF_POPLAR"))}
    full_env.pop("JAX_PLATFORMS", None)
    if path:
        full_env["PYTHONPATH"] = os.pathsep.join([str(p) for p in path] + [full_env.get("PYTHONPATH", "")])
    full_env.update(env)
    # Run outside the source tree, so that the installed jax_ipu is imported.
    return subprocess.run([sys.executable, "-c", code], env=full_env, capture_output=True,
                          text=True, timeout=timeout, cwd=tempfile.gettempdir())


def rewrite_saved_program(data: bytes, edit, deferred=None) -> bytes:
    """A saved program's bytes (graph/serialize.py) with its JSON header
    edited by edit(header) and its deferred section's compressed bytes
    replaced by deferred(header, packed) if given, the checksum made good again:
    how tests forge entries that pass the checksum."""
    magic, version, header_size, body_size, packed_size, deferred_size, _ = serialize.PREFIX.unpack_from(data)
    packed = data[serialize.PREFIX.size:]
    body = zlib.decompress(packed[:packed_size])
    header = json.loads(body[:header_size])
    edit(header)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 64)
    body = text + body[header_size:]
    packed_body = zlib.compress(body)
    packed_deferred = packed[packed_size:] if deferred is None else deferred(header, packed[packed_size:])
    packed = packed_body + packed_deferred
    return serialize.PREFIX.pack(magic, version, len(text), len(body), len(packed_body), deferred_size,
                                  hashlib.sha256(packed).digest()) + packed