"""bfloat16 and complex64 as the compiler charges and reports them: stored
in 2 and 8 bytes an element, their emulation counted in the cycle
estimate and listed once per program (Program.emulated, the compile log,
the profile), and refused at compile time, naming the op, when a program
asks for hardware-native types only (compiler option emulate_types=False,
JAX_IPU_EMULATE_TYPES=0)."""
from __future__ import annotations

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import BF16, C64, SMALL, compile_fn, lower, run_python
from jax_ipu.compiler import CompileOptions, compile_module
from jax_ipu.errors import IpuError
from jax_ipu.graph import serialize

N = 1000


def _chain(v):
    return jnp.tanh(v * 2 + 1)


@pytest.mark.parametrize("dtype, itemsize", [(BF16, 2), (C64, 8), (np.float32, 4)], ids=["bf16", "c64", "f32"])
def test_memory_is_charged_at_the_types_size(dtype, itemsize):
    """Arguments, results and every tensor of the type: itemsize bytes an
    element, on the tiles and in JAX's memory analysis."""
    x = np.ones((4, N // 4), dtype)
    program = compile_fn(_chain, x)
    assert program.memory.argument_bytes == program.memory.output_bytes == itemsize * N
    typed = [t for t in program.tensors if t.dtype == np.dtype(dtype)]
    assert typed and all(t.nbytes == itemsize * t.size for t in typed)
    compiled = jax.jit(_chain).lower(jax.device_put(x, jax.devices("ipu")[0])).compile()
    assert compiled.memory_analysis().argument_size_in_bytes == itemsize * N
    assert compiled.memory_analysis().output_size_in_bytes == itemsize * N


def test_bfloat16_matmul_holds_its_operands_in_two_bytes():
    a = np.ones((64, 128), BF16)
    program = compile_fn(lambda p, q: p @ q, a, a.T.copy())
    assert program.memory.argument_bytes == 2 * 2 * a.size
    assert program.memory.output_bytes == 2 * 64 * 64


def test_emulated_ops_are_listed_and_charged():
    """Each emulated op by kind with its count and cycles; the same program
    in float32 lists none and costs fewer cycles (the widening and rounding
    are extra work, not a different path)."""
    bf = compile_fn(_chain, np.ones(N, BF16))
    f32 = compile_fn(_chain, np.ones(N, np.float32))
    ops = {e["op"]: e for e in bf.emulated}
    assert {"bfloat16 multiply", "bfloat16 add", "bfloat16 tanh"} <= set(ops)
    assert all(e["count"] >= 1 and e["cycles"] > 0 for e in bf.emulated)
    assert sum(e["cycles"] for e in bf.emulated) <= bf.cycles
    assert [e["cycles"] for e in bf.emulated] == sorted((e["cycles"] for e in bf.emulated), reverse=True)
    assert f32.emulated == [] and f32.cycles < bf.cycles
    c = compile_fn(lambda a, b: (a * b, a @ b.T), np.ones((16, 8), C64), np.ones((16, 8), C64))
    assert {"complex64 multiply", "complex64 dot_general"} <= {e["op"] for e in c.emulated}
    fft = compile_fn(jnp.fft.fft, np.ones((4, 96), C64))
    assert "complex64 fft" in {e["op"] for e in fft.emulated}


def test_the_list_is_saved_with_the_program():
    program = compile_fn(_chain, np.ones(N, BF16))
    again, _ = serialize.loads(serialize.dumps(program))
    assert again.emulated == program.emulated


def test_the_compile_log_says_it_once_per_program(caplog):
    with caplog.at_level(logging.INFO, logger="jax_ipu.compiler"):
        compile_fn(_chain, np.ones(N, BF16))
        compile_fn(_chain, np.ones(N, np.float32))
    lines = [r.getMessage() for r in caplog.records if "emulates types the IPU lacks" in r.getMessage()]
    assert len(lines) == 1
    assert "bfloat16 multiply" in lines[0] and "JAX_IPU_EMULATE_TYPES=0" in lines[0]


@pytest.mark.parametrize("fn, dtype, op", [
    (lambda v: v * v, BF16, "stablehlo.multiply"), (lambda v: v * v, C64, "stablehlo.multiply"),
    (lambda v: jnp.abs(jnp.fft.rfft(v)), np.float32, "stablehlo.fft"),
    (lambda v: v.astype(jnp.bfloat16), np.float32, "stablehlo.convert")], ids=["bf16", "c64", "fft", "convert"])
def test_native_types_only_refuses_them_naming_the_op(fn, dtype, op):
    x = np.ones(8, dtype)
    with pytest.raises(IpuError, match=rf"{op}.*the IPU has no .*native types only.*emulate_types"):
        compile_module(lower(fn, x), SMALL, CompileOptions(emulate_types=False))
    with pytest.raises(Exception, match=rf"{op}.*native types only"):
        jax.jit(fn).lower(jax.device_put(x, jax.devices("ipu")[0])).compile(compiler_options={"emulate_types": False})


def test_the_environment_variable_refuses_them():
    code = """
import jax, numpy as np, jax.numpy as jnp
ipu = jax.devices("ipu")[0]
try:
    jax.jit(lambda v: v * 2)(jax.device_put(np.ones(4, np.float32), ipu).astype(jnp.bfloat16))
except Exception as e:
    print("refused:", "native types only" in str(e) or "JAX_IPU_EMULATE_TYPES" in str(e))
"""
    out = run_python(code, JAX_IPU_EMULATE_TYPES="0", JAX_PLATFORMS="ipu,cpu")
    assert out.returncode == 0, out.stderr
    assert "refused: True" in out.stdout, out.stdout + out.stderr
