"""Models bigger than one IPU: GPT-2 training steps (AdamW) on 4 modelled
IPUs (8 for gpt2-wide, whose weights alone exceed one IPU) with the weights split Megatron-style and AdamW's moments in
streaming memory (examples/gpt2_multi_ipu.py), and a 4-stage pipelined MLP
(examples/pipeline_training.py).

Per model: losses against XLA:CPU running the same step, each IPU's SRAM
peak, streaming memory in use, the estimated step time and tokens (or
samples) per second, where that time goes (compute, on-chip exchange and
sync, IPU-Link, streaming memory, pipeline bubble), the Model's wall time
to simulate a step and the ratio of the estimated IPU step to XLA:CPU's
measured step on this machine.

    python benchmarks/multi_ipu_models.py                    # tiny GPT-2 and the pipeline: about a minute
    python benchmarks/multi_ipu_models.py --gpt2 gpt2-small  # GPT-2 small (124M): compiles for minutes
    python benchmarks/multi_ipu_models.py --gpt2 gpt2-wide --batch 1 --no-pipeline [--json FILE]
"""
import argparse
import json
import os
import pathlib
import runpy
import time

os.environ.setdefault("JAX_IPU_DEVICE_COUNT", "8")

import jax  # noqa: E402

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"


def cpu_step_seconds(gpt2, cfg, batch: int, seq: int, repeats: int = 3) -> float:
    """XLA:CPU's measured time for the same training step (one device)."""
    data = gpt2["batches"](cfg, batch, seq, repeats + 1)
    params = gpt2["init"](cfg)
    state, step, replicated = gpt2["place"](params, jax.devices("cpu")[:1], cfg)
    times = []
    for ids, labels in data:
        start = time.perf_counter()
        *state, loss = step(*state, ids, labels)
        jax.block_until_ready(loss)
        times.append(time.perf_counter() - start)
    del state
    return min(times[1:])


def gpt2_row(model: str, batch: int, seq: int | None, steps: int, amp: float | None) -> dict:
    gpt2 = runpy.run_path(str(EXAMPLES / "gpt2_multi_ipu.py"))
    argv = ["--model", model, "--batch", str(batch), "--steps", str(steps)]
    if seq:
        argv += ["--seq", str(seq)]
    if amp:
        argv += ["--available-memory-proportion", str(amp)]
    cfg = gpt2["CONFIGS"][model]
    # XLA:CPU's timing first: its arrays are gone before the IPUs' are made.
    cpu = cpu_step_seconds(gpt2, cfg, batch, seq or (cfg.context if model == "tiny" else 128))
    result = gpt2["main"](argv)
    seq = seq or (cfg.context if model == "tiny" else 128)
    diff = max(abs(a - b) for a, b in zip(result["losses"], result["cpu_losses"], strict=True))
    row = {"model": f"GPT-2 {model}", "ipus": result["ipus"], "params_millions": result["params"] / 1e6, "tokens": batch * seq,
           "loss_max_abs_diff_vs_cpu": diff,
           "sram_peak_mib": [r["memory"]["total_bytes"] / 2**20 for r in result["reports"]],
           "streaming_mib": [b / 2**20 for b in result["streaming_bytes"]],
           "ipu_step_ms": result["seconds"] * 1e3, "tokens_per_second": result["tokens_per_second"],
           "time_ms": {k: v / jax_ipu_clock() * 1e3 for k, v in result["time"].items()},
           "model_wall_s": result["wall_seconds"], "cpu_step_ms": cpu * 1e3,
           "ipu_vs_cpu": result["seconds"] / cpu}
    return row


def jax_ipu_clock() -> float:
    import jax_ipu
    return jax_ipu.target().clock_hz


def pipeline_row() -> dict:
    pipe = runpy.run_path(str(EXAMPLES / "pipeline_training.py"))
    stages, count, batch = 4, 8, 64
    start = time.perf_counter()
    losses, cpu_losses, report = pipe["main"](["--stages", str(stages), "--micro-batches", str(count),
                                               "--batch", str(batch), "--steps", "3"])
    wall = (time.perf_counter() - start) / 3
    from jax_ipu import pipeline
    parts = report["time_breakdown"]
    total = sum(parts.values())
    staged = parts["compute"] + parts["exchange"] + parts["sync"]
    clock = jax_ipu_clock()
    time_ms = {k: v / clock * 1e3 for k, v in parts.items()}
    time_ms["pipeline_bubble"] = pipeline.bubble_fraction(stages, count) * staged / clock * 1e3
    return {"model": f"pipelined MLP, {stages} stages x {count} micro-batches",
            "loss_max_abs_diff_vs_cpu": max(abs(a - b) for a, b in zip(losses, cpu_losses, strict=True)),
            "ipus": stages, "sram_peak_mib": [report["memory"]["total_bytes"] / 2**20], "streaming_mib": [0.0],
            "ipu_step_ms": total / clock * 1e3, "samples_per_second": batch / (total / clock),
            "time_ms": time_ms, "model_wall_s": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpt2", default="tiny", help="tiny, gpt2-small or gpt2-wide")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=None)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--available-memory-proportion", type=float, default=None)
    parser.add_argument("--no-pipeline", action="store_true")
    parser.add_argument("--json")
    args = parser.parse_args()
    rows = [gpt2_row(args.gpt2, args.batch, args.seq, args.steps, args.available_memory_proportion)]
    if not args.no_pipeline:
        rows.append(pipeline_row())
    print()
    for r in rows:
        print(f"{r['model']}: estimated {r['ipu_step_ms']:.2f} ms a step on {r['ipus']} IPUs, "
              f"|loss - XLA:CPU| <= {r['loss_max_abs_diff_vs_cpu']:.2g}, Model wall {r['model_wall_s']:.1f} s a step")
        if "ipu_vs_cpu" in r:
            print(f"  {r['tokens_per_second']:,.0f} tokens/s; XLA:CPU (this machine) {r['cpu_step_ms']:.1f} ms a "
                  f"step: IPU estimate / CPU = {r['ipu_vs_cpu']:.3f}")
        print(f"  SRAM peak per IPU (MiB): {', '.join(f'{m:.1f}' for m in r['sram_peak_mib'])}; streaming memory "
              f"in use (MiB): {', '.join(f'{m:.1f}' for m in r['streaming_mib'])}")
        print("  " + ", ".join(f"{k} {v:.3f} ms" for k, v in r["time_ms"].items() if k != "host"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1, default=float)


if __name__ == "__main__":
    main()
