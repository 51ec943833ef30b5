"""The examples run as a user would run them, for a few steps."""
import pathlib
import runpy

import numpy as np
import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parents[3] / "examples"


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


def test_flax_optax_step_on_ipu_matches_cpu_and_donates(ipu, cpu):
    pytest.importorskip("flax")
    pytest.importorskip("optax")
    import jax
    import numpy as np
    import optax

    module = runpy.run_path(str(EXAMPLES / "flax_optax_training.py"))
    model, optimizer = module["MLP"](hidden=32), optax.adam(1e-2)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 64)).astype(np.float32)
    labels = rng.integers(0, 10, 16).astype(np.int32)
    params = model.init(jax.random.key(0), x[:1])
    opt_state = optimizer.init(params)
    host_state = jax.tree.map(np.asarray, (params, opt_state))  # donation deletes device copies

    results = {}
    for device in (cpu, ipu):
        state = jax.device_put(host_state, device)
        step = module["make_train_step"](model, optimizer)
        for _ in range(3):
            new_params, new_opt, loss = step(*state, x, labels)
            assert all(leaf.is_deleted() for leaf in jax.tree.leaves(state)), "state must be donated"
            state = (new_params, new_opt)
        results[device.platform] = (state[0], float(loss))
    for got, want in zip(jax.tree.leaves(results["ipu"][0]), jax.tree.leaves(results["cpu"][0]), strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-5)
    assert abs(results["ipu"][1] - results["cpu"][1]) < 1e-4


def test_flax_optax_example_trains(capsys):
    pytest.importorskip("flax")
    module = runpy.run_path(str(EXAMPLES / "flax_optax_training.py"))
    losses, accuracy = module["main"](["--steps", "40"])
    assert losses[-1] < losses[0] / 2 and accuracy > 0.7, capsys.readouterr().out


def test_mnist_classifier_with_infeed_matches_the_python_loop(capsys):
    pytest.importorskip("sklearn")
    loop = runpy.run_path(str(EXAMPLES / "mnist_classifier_with_infeed.py"))
    accuracy = loop["main"](["--epochs", "2", "--hidden", "64"])
    out = capsys.readouterr().out
    plain = runpy.run_path(str(EXAMPLES / "mnist_classifier.py"))
    assert abs(plain["main"](["--epochs", "2", "--hidden", "64"]) - accuracy) < 1e-6, out
    assert "estimated IPU time per step" in out


@pytest.mark.slow
def test_profile_report_example_writes_the_page(tmp_path, capsys):
    pytest.importorskip("flax")
    pytest.importorskip("plotly", reason="the report page needs plotly (pip install 'jax-ipu[report]')")
    import json
    module = runpy.run_path(str(EXAMPLES / "profile_report.py"))
    module["main"](["--out", str(tmp_path), "--batch", "4", "--steps", "2"])
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "jit_train_step-0.html", "jit_train_step-0.json", "jit_train_step-0.trace.json"]
    report = json.loads((tmp_path / "jit_train_step-0.json").read_text())
    assert report["runs"]["count"] == 2 and report["memory"]["fits"]
    assert any("BatchNorm" in cs["name"] for cs in report["compute_sets"])
    losses = [float(line.split()[1]) for line in capsys.readouterr().out.splitlines() if line.startswith("loss")]
    assert len(losses) == 2 and all(np.isfinite(losses))


def test_pipeline_training_matches_cpu_and_shows_the_bubble(capsys):
    module = runpy.run_path(str(EXAMPLES / "pipeline_training.py"))
    losses, cpu_losses, report = module["main"](["--stages", "2", "--width", "64", "--steps", "3",
                                                 "--micro-batches", "4"])
    out = capsys.readouterr().out
    assert losses[-1] < losses[0]
    assert max(abs(a - b) for a, b in zip(losses, cpu_losses, strict=True)) < 1e-4 * losses[0], out
    assert report["time_breakdown"]["ipu_link"] > 0 and "pipeline bubble" in out and "ipu_link" in out


def _gpt2_checks(result, ipus):
    losses, cpu = result["losses"], result["cpu_losses"]
    assert max(abs(a - b) for a, b in zip(losses, cpu, strict=True)) < 1e-4 * cpu[0], (losses, cpu)
    assert all(b > 0 for b in result["streaming_bytes"])      # AdamW's moments
    assert result["tokens_per_second"] > 0
    assert result["time"]["ipu_link"] > 0 and result["time"]["streaming_memory"] > 0
    for report in result["reports"]:
        assert report["memory"]["fits"]


def test_gpt2_multi_ipu_matches_cpu_with_adamw_state_in_streaming_memory(ipus, capsys):
    module = runpy.run_path(str(EXAMPLES / "gpt2_multi_ipu.py"))
    result = module["main"](["--model", "tiny", "--steps", "2", "--batch", "2"])
    _gpt2_checks(result, ipus)
    out = capsys.readouterr().out
    assert "streaming memory in use" in out and "tokens/s" in out and "ipu_link" in out
    # No IPU holds the whole tied embedding (split by vocabulary) in SRAM,
    # nor its gradient; AdamW's moments arrive and leave in streaming memory.
    from jax_ipu.pjrt import client
    program = client.CURRENT.device(ipus[0].id).last_program
    cfg = module["CONFIGS"]["tiny"]
    whole = {(cfg.vocab, cfg.width), (cfg.width, cfg.vocab)}
    assert not [t.name for t in program.tensors if not t.streaming and t.shape[-2:] in whole]
    # Nor the logits over the whole vocabulary, or their gradient.
    assert not [t.name for t in program.tensors if t.shape[-1:] == (cfg.vocab,)]
    assert len(program.streaming_inputs) == len(program.streaming_outputs) > 0


def test_gpt2_multi_ipu_on_four_ipus():
    from helpers import run_python
    code = f"""
import runpy
module = runpy.run_path({str(EXAMPLES / "gpt2_multi_ipu.py")!r})
r = module["main"](["--model", "tiny", "--steps", "2", "--batch", "2", "--ipus", "4"])
print("MAXDIFF", max(abs(a - b) for a, b in zip(r["losses"], r["cpu_losses"])) / r["cpu_losses"][0])
print("STREAMING", min(r["streaming_bytes"]))
"""
    proc = run_python(code, JAX_IPU_DEVICE_COUNT="4")
    lines = dict(line.split() for line in proc.stdout.splitlines() if line.startswith(("MAXDIFF", "STREAMING")))
    assert float(lines["MAXDIFF"]) < 1e-4 and int(lines["STREAMING"]) > 0, proc.stdout + proc.stderr[-3000:]
