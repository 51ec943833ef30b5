"""Ctrl-C cancels a long loop running on an IPU at its next iteration, and
runs started after a cancel run to the end."""
from __future__ import annotations

import jax
import numpy as np
from jax import lax

from helpers import run_python


def test_ctrl_c_cancels_a_long_loop_on_the_ipu_at_its_next_iteration():
    result = run_python("""
import os, signal, time
# Python's own handler, as at a terminal: a job started in the background
# by a shell without job control inherits SIGINT ignored, and keeps it so.
signal.signal(signal.SIGINT, signal.default_int_handler)
import jax, numpy as np
from jax import lax
ipu = jax.devices('ipu')[0]
f = jax.jit(lambda x: lax.fori_loop(0, 2_000_000_000, lambda i, c: c * 1.0001 + 1, x)[:4])
g = jax.jit(lambda x: x + 1)
x = jax.device_put(np.zeros(4, np.float32), ipu)
g(x).block_until_ready()
# minutes on the IPU's worker, even as one XLA:CPU executable (stopped at a chunk's end)
y = f(jax.device_put(np.zeros(1024, np.float32), ipu))
try:
    time.sleep(3)             # the loop's executable compiled and running, even on a loaded machine
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(30)
except KeyboardInterrupt:
    print('INTERRUPTED')
t = time.perf_counter()
print('NEXT', np.asarray(g(x)).tolist(), time.perf_counter() - t)
try:
    np.asarray(y)
    print('LOOP FINISHED')
except Exception as e:
    print('LOOP', e)
""")
    assert result.returncode == 0, result.stderr
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines() if " " in line)
    assert "INTERRUPTED" in result.stdout, result.stdout
    assert lines["NEXT"].startswith("[1.0, 1.0, 1.0, 1.0]"), result.stdout
    assert float(lines["NEXT"].split()[-1]) < 5.0, result.stdout      # not the loop's remaining time
    assert lines["LOOP"].startswith("CANCELLED:") and "KeyboardInterrupt" in lines["LOOP"], result.stdout


def test_runs_started_after_a_cancel_run_to_the_end(ipu):
    from jax_ipu.model.engine import cancel_runs
    f = jax.jit(lambda x: lax.fori_loop(0, 50, lambda i, c: c + 1, x))
    x = jax.device_put(np.zeros(3, np.float32), ipu)
    cancel_runs()
    np.testing.assert_array_equal(np.asarray(f(x)), np.full(3, 50.0))
