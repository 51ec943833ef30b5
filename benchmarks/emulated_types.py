"""What emulating bfloat16 and complex64 costs, in the compiler's own
estimates (cycles of the modelled IPU, not host time): each program
compiled for a whole ipu2 in float32 and in the emulated type, the cycles
of both and their ratio, and the share the program reports as emulated.

    python benchmarks/emulated_types.py [--json]

The figures come from the component costs docs/ipu.md lists (widening
and rounding on the integer pipe, complex ops as their float32 ops and
lane permutes); no measured IPU time enters them.
"""
import argparse
import json

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jaxlib.mlir.dialects import stablehlo

from jax_ipu.compiler import compile_module
from jax_ipu.stablehlo import import_module
from jax_ipu.targets import get_target

BF16 = np.dtype(ml_dtypes.bfloat16)
C64 = np.dtype(np.complex64)
N = 1 << 20


def _cycles(fn, *args) -> tuple[int, int]:
    """(cycles, emulated cycles) of fn compiled for a whole ipu2."""
    from jax._src.lib import _jax
    text = jax.jit(fn).lower(*args).as_text()
    module = import_module(_jax.mlir.serialize_portable_artifact(text, stablehlo.get_current_version()))
    program = compile_module(module, get_target("ipu2"))
    return program.cycles, sum(e["cycles"] for e in program.emulated)


def cases():
    """(name, fn, float32 arguments, emulated arguments)."""
    vec = np.ones(N, np.float32)
    mat = np.ones((1024, 1024), np.float32)
    return [
        ("bfloat16 add, 2^20 elements", lambda a, b: a + b, (vec, vec), (vec.astype(BF16),) * 2),
        ("bfloat16 x * y + z (fused chain), 2^20", lambda a, b, c: a * b + c, (vec,) * 3, (vec.astype(BF16),) * 3),
        ("bfloat16 tanh, 2^20", jnp.tanh, (vec,), (vec.astype(BF16),)),
        ("bfloat16 matmul 1024^3", lambda a, b: a @ b, (mat, mat), (mat.astype(BF16),) * 2),
        ("bfloat16 sum of 2^20", jnp.sum, (vec,), (vec.astype(BF16),)),
        ("complex64 add, 2^20", lambda a, b: a + b, (vec, vec), (vec.astype(C64),) * 2),
        ("complex64 multiply, 2^20", lambda a, b: a * b, (vec, vec), (vec.astype(C64),) * 2),
        ("complex64 exp, 2^20", jnp.exp, (vec,), (vec.astype(C64),)),
        ("complex64 abs, 2^20", jnp.abs, (vec,), (vec.astype(C64),)),
        ("complex64 matmul 1024^3", lambda a, b: a @ b, (mat, mat), (mat.astype(C64),) * 2),
    ]


def fft_cases():
    """FFTs have no float32 twin: their cycles against a float32 matmul of
    the same batch by a square matrix of the transform's length."""
    out = []
    for n in (64, 4096, 4099):
        x = np.ones((256, n), C64)
        cycles, emulated = _cycles(jnp.fft.fft, x)
        out.append({"case": f"complex64 fft, 256 x {n}", "cycles": cycles, "emulated_cycles": emulated})
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = []
    for name, fn, native, emulated in cases():
        f32, _ = _cycles(fn, *native)
        cycles, share = _cycles(fn, *emulated)
        rows.append({"case": name, "float32_cycles": f32, "cycles": cycles, "ratio": cycles / f32,
                     "emulated_cycles": share})
    rows += fft_cases()
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"{'case':42} {'float32':>12} {'emulated':>12} {'ratio':>6} {'reported':>12}")
    for r in rows:
        f32 = f"{r['float32_cycles']:12,}" if "float32_cycles" in r else f"{'':12}"
        ratio = f"{r['ratio']:6.2f}" if "ratio" in r else f"{'':6}"
        print(f"{r['case']:42} {f32} {r['cycles']:12,} {ratio} {r['emulated_cycles']:12,}")


if __name__ == "__main__":
    main()
