"""`python build/build.py --enable_ipu` makes the wheel Graphcore's users
expect. Slow (an isolated build environment): run with `pytest -m slow`."""
import pathlib
import subprocess
import sys
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]


@pytest.mark.slow
def test_build_script_makes_an_installable_plugin_wheel(tmp_path):
    result = subprocess.run([sys.executable, str(ROOT / "build" / "build.py"), "--enable_ipu",
                             "--output_path", str(tmp_path)], capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    wheels = list(tmp_path.glob("jax_ipu-*.whl"))
    assert len(wheels) == 1
    names = zipfile.ZipFile(wheels[0]).namelist()
    assert any(n.startswith("jax_ipu/pjrt/_capi") and n.endswith(".so") for n in names)
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(wheels[0]).read(entry_points).decode()
    assert "[jax_plugins]" in text and "ipu = jax_ipu._plugin" in text


def test_build_script_requires_enable_ipu():
    result = subprocess.run([sys.executable, str(ROOT / "build" / "build.py")], capture_output=True, text=True)
    assert result.returncode != 0 and "--enable_ipu" in result.stderr
