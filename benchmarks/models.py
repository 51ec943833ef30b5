"""Real models on one IPU (issue 24): ResNet-50, BERT-base and GPT-2 small
as textbook Flax programs (benchmarks/models_zoo.py), compiled for the
default ipu2 and for XLA:CPU in the same process, one program per run:

    python benchmarks/models.py --model resnet50 --mode train --dtype f32 --batch 4
    python benchmarks/models.py --model resnet50 --mode train --dtype f16 --batch 3
    python benchmarks/models.py --model resnet50 --mode train --dtype f16 --batch 8 --remat
    python benchmarks/models.py --model bert --mode infer --dtype f16 --batch 4
    python benchmarks/models.py --model gpt2 --mode infer --dtype f16 --batch 4
    python benchmarks/models.py --model gpt2 --mode train --dtype f32 --batch 1
    python benchmarks/models.py --model resnet50 --mode train --dtype f16 --batch 20 --remat \
        --partials half --amp 0.15      (Graphcore's MLPerf settings)
    python benchmarks/models.py --model bert-large-128 --mode train --dtype f16 --partials half
        (the busiest pipeline stage of Graphcore's BERT-Large phase 1: models_zoo.STAGES)
    python benchmarks/models.py --model resnet50 --mode train --dtype f16 --params f16 --batch 20 --remat
        (16.16: float16 parameters and optimiser state, as Graphcore trained)
    (--steps 0 skips running the step; --json prints the figures as JSON;
     --breakdown prints where the memory goes at the busiest tile's peak and,
     summed over tiles, at the step where their sum peaks;
     --tiles T compiles for a T-tile ipu2; --image and --length shrink inputs;
     --remat recomputes each ResNet-50 bottleneck block in the backward
     pass, flax.linen.remat, as a JAX user checkpoints activations)

Prints: whether the program fits (it is always compiled with
allow_out_of_memory, so that a program that does not fit is still
measured), the busiest tile's peak over the mean tile's, the plan's total
peak over a lower bound (XLA:CPU's memory_analysis(): arguments + outputs
- aliased + temporaries, plus the IPU program's code and vertex state),
the bytes by category against the IPU's SRAM, compile time IPU / XLA:CPU
(wall, and process CPU time, steadier on a shared machine) with the IPU's
time by pass, the host memory the IPU compile added (peak
RSS over RSS before it), the estimated samples/s per IPU (static cycles at
the target's clock), and the wall time of a step on the IPU Model against
XLA:CPU's (the two taking turns over --steps rounds after a first call
each: the median of each, and the median of the rounds' ratios).
"""
import argparse
import collections
import functools
import json
import os
import resource
import statistics
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax
import models_zoo
import numpy as np


def resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


# -- per-pass compile timing: wraps the passes of jax_ipu.compiler.PASSES
PASSES = collections.OrderedDict()


def _timed(name, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            PASSES[name] = PASSES.get(name, 0.0) + time.perf_counter() - start
    return wrapper


CAPTURED = {}


def instrument():
    """Times each pass of jax_ipu.compiler.PASSES (the named list
    compile_module runs) and the StableHLO import, and keeps the last
    Program compiled."""
    from jax_ipu import compiler, stablehlo

    compiler.PASSES[:] = [(name, _timed(name, run)) for name, run in compiler.PASSES]
    stablehlo.import_module = _timed("import (StableHLO)", stablehlo.import_module)
    compile_module = compiler.compile_module

    def capture(*args, **kwargs):
        CAPTURED["program"] = program = _timed("compile_module", compile_module)(*args, **kwargs)
        return program
    compiler.compile_module = capture


def cycles_by_kind(program) -> dict:
    """The estimate's cycles by kind of step (steps in loops once each):
    per kind of compute set (its name's first word: matmul, reduce,
    fused...) its vertices' compute, its exchange and its syncs; copies
    (layout changes, im2col patches) their exchange and syncs."""
    from jax_ipu.graph.programs import Copy, Execute, leaves

    out = collections.Counter()
    for step in leaves(program.body):
        if isinstance(step, Execute):
            kind = step.compute_set.name.split(" ")[0]
            out[f"{kind} compute"] += step.cycles - step.exchange_cycles - step.sync_cycles
            out[f"{kind} exchange"] += step.exchange_cycles
            out["sync"] += step.sync_cycles
        elif isinstance(step, Copy):
            out["copy exchange"] += step.exchange_cycles
            out["sync"] += step.sync_cycles
    return dict(out.most_common())


def cpu_lower_bound(compiled) -> tuple[int, dict]:
    m = compiled.memory_analysis()
    parts = {"arguments": m.argument_size_in_bytes, "outputs": m.output_size_in_bytes,
             "aliased": m.alias_size_in_bytes, "temporaries": m.temp_size_in_bytes,
             "cpu code": m.generated_code_size_in_bytes}
    return parts["arguments"] + parts["outputs"] - parts["aliased"] + parts["temporaries"], parts


def step_seconds(runs, args, steps: int) -> tuple[list[float], float]:
    """Median wall seconds a call of each (f, device) in `runs`, over
    `steps` rounds after a first call each, the functions taking turns
    within a round (so that both see the machine as it is then: its speed
    moves by half within minutes on the shared VMs we measure on); and the
    median over rounds of the first's time over the second's. Donated
    arguments are put anew before each call, outside the timing."""
    times = [[] for _ in runs]
    for i in range(steps + 1):
        for (f, device), got in zip(runs, times, strict=True):
            put = jax.device_put(args, device)
            jax.block_until_ready(put)
            start = time.perf_counter()
            jax.block_until_ready(f(*put))
            if i:
                got.append(time.perf_counter() - start)
    ratio = statistics.median(a / b for a, b in zip(times[0], times[1], strict=True))
    return [statistics.median(t) for t in times], ratio


# The training programs' arguments (models_zoo: step(params, stats, opt_state, x, y)).
ARGUMENT_GROUPS = {5: ("parameters", "batch statistics", "optimiser state", "inputs", "labels"),
                   3: ("parameters", "optimiser state", "inputs")}


def breakdown(program, host_args, top: int = 12) -> dict:
    """memory_breakdown at the busiest tile's peak and at the all-tile
    peak, the arguments labelled by the step's argument they belong to."""
    from jax_ipu.profile.report import memory_breakdown

    leaves = jax.tree_util.tree_flatten_with_path(host_args)[0]
    names = ARGUMENT_GROUPS.get(len(host_args), ())
    labels = [names[path[0].idx] if len(names) > path[0].idx else f"argument {path[0].idx}"
              for path, _ in leaves] if len(leaves) == len(program.inputs) else ["arguments"] * len(program.inputs)
    out = {}
    for where, busiest in (("busiest tile", True), ("all tiles", False)):
        b = memory_breakdown(program, busiest)
        groups = collections.Counter()
        for label, nbytes in zip(labels, b["arguments_by_index"], strict=True):
            groups[label] += nbytes
        b["arguments"] = dict(groups)
        b["tensors"] = dict(list(b["tensors"].items())[:top])
        del b["arguments_by_index"]
        out[where] = b
    return out


def print_breakdown(r: dict) -> None:
    for where, b in r.items():
        fmt = (lambda x: f"{x:,} B") if where == "busiest tile" else (lambda x: f"{x / 1e6:,.1f} MB")
        head = f"tile {b['tile']}" if b["tile"] is not None else "summed over tiles"
        print(f"  memory at the peak, {head}: {fmt(b['total'])} at step {b['step']} of {b['steps']} "
              f"({b['step_name'][:110]})")
        print("    " + ", ".join(f"{k} {fmt(v)}" for k, v in b["parts"].items()))
        print("    arguments: " + ", ".join(f"{k} {fmt(v)}" for k, v in b["arguments"].items())
              + f" ({b['held_by_inputs']} outputs held in their donated inputs' memory)")
        print("    tensors by pass: " + ", ".join(f"{k} {fmt(v)}" for k, v in b["kinds"].items()))
        for source, (nbytes, count, _) in b["tensors"].items():
            print(f"      {fmt(nbytes):>14} {count:4} x {source[:100]}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=["resnet50", "bert", "gpt2", *models_zoo.STAGES], required=True,
                        help="a model, or the busiest pipeline stage of a Graphcore configuration "
                             "(models_zoo.STAGES: its micro-batch and sequence length; --batch is ignored)")
    parser.add_argument("--mode", choices=["train", "infer"], default="train")
    parser.add_argument("--dtype", choices=["f32", "f16"], default="f32")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--image", type=int, default=224)
    parser.add_argument("--tiles", type=int, default=None)
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--remat", action="store_true",
                        help="ResNet-50: each bottleneck block under nn.remat (activation checkpointing)")
    parser.add_argument("--params", choices=["f32", "f16"], default="f32",
                        help="ResNet-50 training: the parameters' and optimiser state's type (f16 with "
                             "--dtype f16: Graphcore's 16.16; default f32, master weights)")
    parser.add_argument("--partials", choices=["float", "half"], default="float",
                        help="the partials_type compiler option (Poplar's partialsType)")
    parser.add_argument("--amp", type=float, default=None,
                        help="the available_memory_proportion compiler option (default 0.6)")
    parser.add_argument("--breakdown", action="store_true",
                        help="where the memory goes at the busiest tile's peak and, summed over tiles, at "
                             "the step where their sum peaks (jax_ipu.profile.report.memory_breakdown)")
    parser.add_argument("--momentum-host", action="store_true",
                        help="ResNet-50 training: the optimiser state (momentum) in the memory kind pinned_host "
                             "(streaming memory), moved to the device for the update inside the step (with "
                             "--steps 0; XLA:CPU compiles the step without the moves)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.momentum_host and (args.model != "resnet50" or args.mode != "train" or args.steps):
        raise SystemExit("--momentum-host: only for --model resnet50 --mode train --steps 0")
    if args.model in models_zoo.STAGES:
        # The configuration's micro-batch, and its matmul proportion unless asked otherwise.
        args.batch = models_zoo.STAGES[args.model][5]
        args.amp = models_zoo.STAGES[args.model][9] if args.amp is None else args.amp
    if args.tiles:
        os.environ["JAX_IPU_MODEL_NUM_TILES"] = str(args.tiles)
    instrument()
    f, host_args, samples = models_zoo.program(args.model, args.mode, args.dtype, args.batch, args.length,
                                               args.image, args.remat, args.params, args.momentum_host)
    # On the host, so that each device_put copies (a CPU array put on the
    # CPU is itself, and donating it would delete the benchmark's input).
    host_args = jax.tree.map(np.asarray, host_args)
    ipu, cpu = jax.devices("ipu")[0], jax.devices("cpu")[0]
    label = (f"{args.model} {args.mode} {args.dtype}{' params f16' if args.params == 'f16' else ''} "
             f"batch {args.batch}{' remat' if args.remat else ''}"
             f"{' half partials' if args.partials == 'half' else ''}"
             f"{f' available_memory_proportion {args.amp}' if args.amp is not None else ''}"
             f"{' momentum in pinned_host' if args.momentum_host else ''}")

    # IPU first, so that the peak RSS it adds is its own.
    # Lowered from shapes, so that a program whose arguments do not fit the
    # IPU (GPT-2 training's Adam state) is still compiled and measured.
    def shapes(arg, memory_kind=None):
        sharding = jax.sharding.SingleDeviceSharding(ipu, memory_kind=memory_kind)
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), arg)
    # (--momentum-host: the step's third argument, the optimiser state, in streaming memory.)
    lowered = f.lower(*(shapes(a, "pinned_host" if args.momentum_host and i == 2 else None)
                        for i, a in enumerate(host_args)))
    before = resident_bytes()
    start, cpu_start = time.perf_counter(), time.process_time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        options = {"allow_out_of_memory": True, "partials_type": args.partials}
        if args.amp is not None:
            options["available_memory_proportion"] = args.amp
        compiled_ipu = lowered.compile(compiler_options=options)
    ipu_compile, ipu_compile_cpu = time.perf_counter() - start, time.process_time() - cpu_start
    host_added = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    program = CAPTURED["program"]

    if args.momentum_host:
        f = models_zoo.program(args.model, args.mode, args.dtype, args.batch, args.length, args.image,
                               args.remat, args.params)[0]
    lowered_cpu = f.lower(*jax.device_put(host_args, cpu))
    start, cpu_start = time.perf_counter(), time.process_time()
    compiled_cpu = lowered_cpu.compile()
    cpu_compile, cpu_compile_cpu = time.perf_counter() - start, time.process_time() - cpu_start
    cpu_bytes, cpu_parts = cpu_lower_bound(compiled_cpu)

    from jax_ipu.graph.programs import leaves
    from jax_ipu.targets import get_target
    target = get_target("ipu2", num_tiles=program.num_tiles)
    mem = program.memory
    peak = mem.peak
    code = int(mem.code.sum())
    constants = sum(t.nbytes for t in program.tensors if t.constant is not None)
    r = {
        "program": label, "tiles": program.num_tiles, "fits": bool(mem.fits),
        "max_tile": mem.max_tile, "max_tile_bytes": mem.max_bytes, "mean_tile_bytes": float(peak.mean()),
        "peak_over_mean": mem.max_bytes / max(float(peak.mean()), 1.0),
        "total_peak_bytes": mem.total_bytes, "cpu_bytes": cpu_bytes, "cpu_parts": cpu_parts,
        "code_bytes": code, "total_over_lower_bound": mem.total_bytes / max(cpu_bytes + code, 1),
        "by_category": {"arguments": mem.argument_bytes, "constants": constants, "code and vertex state": code,
                        "temporaries (sum of tile peaks)": int(mem.not_always_live_peak.sum()),
                        "SRAM": target.num_tiles * target.bytes_per_tile},
        "compile_ipu_s": ipu_compile, "compile_cpu_s": cpu_compile, "compile_ratio": ipu_compile / cpu_compile,
        "compile_ipu_process_s": ipu_compile_cpu, "compile_cpu_process_s": cpu_compile_cpu,
        "passes_s": dict(PASSES), "host_added_bytes": host_added,
        "cycles": program.cycles, "flops": program.flops, "cycles_by_kind": cycles_by_kind(program),
        "steps": sum(1 for _ in leaves(program.body)),
    }
    step = program.cycles / target.clock_hz
    r["estimated_step_s"] = step
    r["estimated_samples_per_s"] = samples / step if step else float("inf")
    r["estimated_tflops"] = program.flops / step / 1e12 if step else 0.0
    if args.breakdown:
        r["breakdown"] = breakdown(program, host_args)
    del program, CAPTURED["program"]
    mb = 1e6
    print(f"{label} on {target.describe()}")
    print(f"  fits: {'yes' if r['fits'] else 'NO'} (busiest tile {r['max_tile']}: {r['max_tile_bytes']:,} B "
          f"of {target.bytes_per_tile:,})")
    print(f"  peak tile / mean tile: {r['peak_over_mean']:.2f} ({r['max_tile_bytes']:,} / "
          f"{r['mean_tile_bytes']:,.0f} B)")
    print(f"  total peak / XLA:CPU + code: {r['total_over_lower_bound']:.2f} ({r['total_peak_bytes'] / mb:.1f} MB / "
          f"{cpu_bytes / mb:.1f} + {code / mb:.1f} MB)")
    print("  bytes by category: " + ", ".join(f"{k} {v / mb:.1f} MB" for k, v in r["by_category"].items()))
    print(f"  compile IPU / XLA:CPU: {r['compile_ratio']:.2f} ({ipu_compile:.1f} s / {cpu_compile:.1f} s); "
          f"process CPU time {ipu_compile_cpu / cpu_compile_cpu:.2f} ({ipu_compile_cpu:.1f} s / "
          f"{cpu_compile_cpu:.1f} s); host memory +{host_added / 1e9:.2f} GB")
    inner = {k: v for k, v in PASSES.items() if k != "compile_module"}
    other = PASSES.get("compile_module", 0.0) - sum(v for k, v in inner.items() if k != "import (StableHLO)")
    print("  IPU compile by pass: " + ", ".join(f"{k} {v:.2f}" for k, v in
                                               sorted(inner.items(), key=lambda kv: -kv[1]) if v >= 0.005)
          + f", rest of compile_module {other:.2f}, outside compile_module "
            f"{ipu_compile - PASSES.get('compile_module', 0.0) - PASSES.get('import (StableHLO)', 0.0):.2f} s")
    print(f"  estimate: {r['cycles']:,} cycles = {step * 1e3:.2f} ms a step, "
          f"{r['estimated_samples_per_s']:.1f} samples/s per IPU, {r['estimated_tflops']:.1f} TFLOPS")
    total = max(r["cycles"], 1)
    print(f"  cycles by kind ({r['steps']} steps): " + ", ".join(
        f"{k} {v / total:.0%}" for k, v in r["cycles_by_kind"].items() if v / total >= 0.005))
    if args.model == "resnet50" and args.mode == "train":
        # Per image: over batch 1's (which holds what does not grow with the
        # batch: float16 copies of the weights, for one).
        saved = models_zoo.resnet50_saved_bytes(args.batch, args.dtype, args.remat, args.image, args.params)
        one = models_zoo.resnet50_saved_bytes(1, args.dtype, args.remat, args.image, args.params)
        per_image = (saved - one) / (args.batch - 1) if args.batch > 1 else float(saved)
        r["saved_residual_bytes"], r["saved_residual_bytes_per_image"] = saved, per_image
        temporaries = r["by_category"]["temporaries (sum of tile peaks)"]
        print(f"  JAX's saved residuals (the forward's tensors its backward reads): {saved / mb:.1f} MB, "
              f"{per_image / mb:.1f} MB an image past the first; the plan's temporaries {temporaries / mb:.1f} MB")
    if args.model in models_zoo.STAGES:
        # What any plan of the tick must hold at its peak: its arguments
        # (weights, accumulators, stash, the two activations in) and the
        # tensors JAX's program keeps for the backward pass.
        saved = models_zoo.stage_saved_bytes(args.model)
        arguments = mem.argument_bytes
        r["saved_residual_bytes"], r["bound_bytes"] = saved, saved + arguments
        r["tokens_per_s"] = r["estimated_samples_per_s"] * models_zoo.STAGES[args.model][6]
        print(f"  JAX's saved residuals {saved / mb:.1f} MB + arguments {arguments / mb:.1f} MB = bound "
              f"{(saved + arguments) / mb:.1f} MB of {r['by_category']['SRAM'] / mb:.1f} MB; "
              f"{r['tokens_per_s']:,.0f} tokens/s per stage")
    if args.breakdown:
        print_breakdown(r["breakdown"])
    if args.steps:
        (r["wall_ipu_s"], r["wall_cpu_s"]), r["wall_ratio"] = step_seconds(
            [(compiled_ipu, ipu), (compiled_cpu, cpu)], host_args, args.steps)
        print(f"  wall time a step IPU Model / XLA:CPU: {r['wall_ratio']:.2f} ({r['wall_ipu_s']:.2f} s / "
              f"{r['wall_cpu_s']:.2f} s)")
    if args.json:
        print(json.dumps(r))


if __name__ == "__main__":
    main()
