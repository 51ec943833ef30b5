"""The examples run as a user would run them, for a few steps."""
import pathlib
import runpy

import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"


def test_quickstart_runs_and_agrees_with_cpu(capsys):
    runpy.run_path(str(EXAMPLES / "quickstart.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "IPU Model ipu2" in out and "max |ipu - cpu|" in out and "cycles" in out


def test_mnist_classifier_learns(capsys):
    pytest.importorskip("sklearn", reason="the example's data set ships with scikit-learn")
    module = runpy.run_path(str(EXAMPLES / "mnist_classifier.py"))
    accuracy = module["main"](["--epochs", "6", "--hidden", "64"])
    out = capsys.readouterr().out
    assert accuracy > 0.5, out  # chance is 0.1
    assert "steps/s" in out and "estimated IPU time per step" in out
