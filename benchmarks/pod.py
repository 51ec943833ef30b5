"""POD-scale estimate: ResNet-50 trained data-parallel over the IPUs of an
IPU-POD16 (one replica per IPU), with gradient accumulation and the
gradient all-reduce over the IPU-Links, as Graphcore ran it for MLPerf
Training v1.0 (micro-batch 20 per IPU, gradient accumulation count 6),
printed beside the one-IPU estimate of the same micro-batch.

    python benchmarks/pod.py                # ResNet-50, f16 compute / f32 master, nn.remat, micro-batch 9
                                            # (the largest that fits with the accumulators), 6
                                            # micro-batches accumulated, 16 IPUs (compiles for minutes)
    python benchmarks/pod.py --small        # cheap: the stem and one bottleneck block, 32x32 images,
                                            # 10 classes, 32 tiles, 4 IPUs (seconds; what the test runs)
    (--batch, --accumulate, --replicas, --dtype, --no-remat, --image, --tiles,
     --stages change the program; --json prints the figures as JSON)

Method: nothing is run (16 modelled ResNet-50 replicas would take hours
on a small host). Three programs are compiled, each with
allow_out_of_memory so that one that does not fit is still measured:

- the one-IPU training step of benchmarks/models.py at the micro-batch
  (forward, backward, SGD-momentum update), whose estimate is models.py's;
- a replica's micro-batch: forward and backward, the gradients added into
  float32 accumulators (donated), the optimiser state held beside them,
  compiled for one IPU: what each of the R IPUs runs A times per update;
- the update over the R IPUs: jit of a shard_map in which each replica
  averages its accumulated gradients over the replicas (lax.pmean: an
  all-reduce per gradient tensor as JAX emits them, which the compiler
  combines into one, as Graphcore's GCL and XLA's all-reduce combiner
  do), applies one SGD-momentum step and zeroes the accumulators.

The POD's step is A micro-batches plus the update, per replica; replicas
run in step, so the POD's throughput is R times a replica's. Every figure
is the compiler's estimate from component figures: compute, exchange and
syncs of each program, and each all-reduce charged by
compiler/lowering/collectives.py (ring_cycles: 2(n-1)/n of the bytes
through each IPU's links at the IPU-Link rate, 2(n-1) hop latencies and a
sync across the IPUs) plus its on-tile reduction. The whole step in one jit (a lax.scan over the micro-batches)
is what Graphcore ran on the device, with the same cycles; it is not
compiled here because the memory plan counts every tensor of a loop's
body as live for the whole loop (docs/multi-ipu.md).
"""
import argparse
import json
import os
import sys
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# Graphcore's published figures this estimate is compared with (docs/models.md).
MLPERF_V1_0_IMAGES_PER_SECOND_PER_IPU = 1720     # IPU-POD16, mlcommons training_results_v1.0 result logs
MLPERF_V1_1_IMAGES_PER_SECOND_POD16 = 30000      # Graphcore's MLPerf v1.1 blog


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true",
                        help="cheap: the stem and one bottleneck block of width 16, 32x32 images, 10 classes, 32 "
                             "tiles, 4 IPUs, micro-batch 2, 2 micro-batches")
    parser.add_argument("--batch", type=int, default=None, help="micro-batch per IPU (9; --small: 2)")
    parser.add_argument("--accumulate", type=int, default=None, help="micro-batches accumulated per update (6)")
    parser.add_argument("--replicas", type=int, default=None, help="IPUs, one replica each (16; --small: 4)")
    parser.add_argument("--dtype", choices=["f16", "f32"], default="f16")
    parser.add_argument("--params", choices=["f32", "f16"], default="f32",
                        help="parameters and optimiser state: f32 (master weights) or f16 (Graphcore's 16.16)")
    parser.add_argument("--no-remat", dest="remat", action="store_false",
                        help="keep every activation (no nn.remat per bottleneck block)")
    parser.add_argument("--image", type=int, default=None)
    parser.add_argument("--classes", type=int, default=None)
    parser.add_argument("--tiles", type=int, default=None)
    parser.add_argument("--stages", default=None, help="bottleneck blocks per stage (3,4,6,3)")
    parser.add_argument("--width", type=int, default=None, help="the first stage's filters (64)")
    parser.add_argument("--partials", choices=["float", "half"], default="float",
                        help="the partials_type compiler option (Poplar's partialsType; Graphcore trained with half)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    small = {"batch": 2, "accumulate": 2, "replicas": 4, "image": 32, "classes": 10, "tiles": 32,
             "stages": "1", "width": 16}
    full = {"batch": 9, "accumulate": 6, "replicas": 16, "image": 224, "classes": 1000, "tiles": None,
            "stages": "3,4,6,3", "width": 64}
    for key, value in (small if args.small else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.stages = tuple(int(s) for s in args.stages.split(","))
    return args


def dtype_of(args):
    import jax.numpy as jnp
    return {"f16": jnp.float16, "f32": jnp.float32}[args.dtype]


def params_dtype_of(args):
    import jax.numpy as jnp
    return {"f16": jnp.float16, "f32": jnp.float32}[args.params]


def parts_of(args):
    import models_zoo
    return models_zoo.resnet50_parts(args.batch, dtype_of(args), args.image, args.classes, args.remat,
                                     args.stages, args.width, params_dtype_of(args))


def one_ipu_step(args):
    """(jitted step, host arguments): models.py's training step."""
    import models_zoo
    return models_zoo.resnet50_train(args.batch, dtype_of(args), args.image, args.classes, args.remat,
                                     args.stages, args.width, params_dtype_of(args))


def accumulate_step(args):
    """(jitted step, host arguments): one micro-batch on one replica, its
    gradients (of the scaled loss) added into float32 accumulators; the
    batch statistics and accumulators donated, the optimiser state passed
    (kept: it is on the IPU all along)."""
    import jax
    loss_fn, tx, _, variables, x, y = parts_of(args)
    params, stats = variables["params"], variables["batch_stats"]

    def step(params, stats, opt_state, total, x, y):
        (_, (loss, stats)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, stats, x, y)
        return stats, jax.tree.map(lambda a, g: a + g, total, grads), loss

    total = jax.tree.map(lambda p: np.zeros(p.shape, p.dtype), params)
    return (jax.jit(step, donate_argnums=(1, 3), keep_unused=True),
            (params, stats, tx.init(params), total, x, y))


def update_step(args, mesh):
    """(jitted step, argument shapes): over the replicas' IPUs, the
    accumulated gradients averaged (lax.pmean: an all-reduce per gradient
    tensor over the IPU-Links), unscaled, and one SGD-momentum update; the
    accumulators come back zeroed. Parameters, optimiser state and
    accumulators donated."""
    import jax
    import optax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    _, tx, scale, variables, _, _ = parts_of(args)
    params = variables["params"]

    def replica(params, opt_state, total):
        grads = jax.tree.map(lambda g: g / (scale * args.accumulate), jax.lax.pmean(total, "replicas"))
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, jax.tree.map(jax.numpy.zeros_like, total)

    step = jax.jit(jax.shard_map(replica, mesh=mesh, in_specs=P(), out_specs=P(), check_vma=False),
                   donate_argnums=(0, 1, 2))
    whole = NamedSharding(mesh, P())
    shapes = jax.tree.map(lambda s: jax.ShapeDtypeStruct(np.shape(s), np.asarray(s).dtype, sharding=whole),
                          (params, tx.init(params), params))
    return step, shapes, params


# Compile options of every program (main sets partials_type).
OPTIONS = {"allow_out_of_memory": True}


def compile_program(f, shapes):
    """The compiled graph Program (compiled with allow_out_of_memory)."""
    import models
    models.CAPTURED.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        f.lower(*shapes).compile(compiler_options=OPTIONS)
    return models.CAPTURED.pop("program")


def all_reduces(program, replicas: int) -> list[dict]:
    """Each collective step outside loops: its bytes, group size and cycles,
    and the IPU-Link part of them (ring_cycles, as the compiler charged)."""
    from jax_ipu.compiler.lowering.collectives import link_cycles
    from jax_ipu.graph import codelets_collectives as cc
    from jax_ipu.graph.programs import Execute, leaves
    from jax_ipu.targets import get_target

    target = get_target(program.target_name, num_tiles=program.num_tiles)
    found = []
    for step in leaves(program.body):
        if isinstance(step, Execute) and isinstance(step.compute_set.kernel, cc.COLLECTIVES):
            kernel = step.compute_set.kernel
            found.append({"name": step.compute_set.name, "bytes": int(kernel.out.nbytes),
                          "group": max((len(g) for g in kernel.groups), default=0),
                          "cycles": int(step.cycles), "link_cycles": link_cycles(target, kernel, replicas)})
    return found


def on_one_ipu(f, host_args, ipu):
    """The Program of f compiled for one IPU from its arguments' shapes."""
    import jax
    return compile_program(f, jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype,
                                       sharding=jax.sharding.SingleDeviceSharding(ipu)), host_args))


def fit(program) -> dict:
    m = program.memory
    return {"fits": bool(m.fits), "max_tile": m.max_tile, "max_tile_bytes": m.max_bytes,
            "total_bytes": m.total_bytes}


def main(argv=None) -> dict:
    args = parse(argv)
    OPTIONS["partials_type"] = args.partials
    os.environ["JAX_IPU_DEVICE_COUNT"] = str(args.replicas)
    if args.tiles:
        os.environ["JAX_IPU_MODEL_NUM_TILES"] = str(args.tiles)
    import jax
    import models

    from jax_ipu.targets import get_target

    models.instrument()
    ipus = jax.devices("ipu")
    if len(ipus) < args.replicas:
        raise SystemExit(f"{len(ipus)} IPUs: set JAX_IPU_DEVICE_COUNT to at least {args.replicas}")
    label = (f"ResNet-50 (stages {','.join(map(str, args.stages))} from width {args.width}, "
             f"{args.image}x{args.image}, {args.classes} classes) training, {args.dtype}"
             f"{(' / f32 master' if args.params == 'f32' else ' / f16 parameters (16.16)') if args.dtype == 'f16' else ''}{', nn.remat' if args.remat else ''}, "
             f"micro-batch {args.batch}{', float16 partials' if args.partials == 'half' else ''}")

    # One IPU: models.py's step (forward, backward, update) on a micro-batch.
    single = on_one_ipu(*one_ipu_step(args), ipus[0])
    target = get_target(single.target_name, num_tiles=single.num_tiles)
    clock = target.clock_hz
    one = {"cycles": single.cycles, **fit(single), "step_s": single.cycles / clock}
    one["images_per_s"] = args.batch / one["step_s"]
    del single

    # A replica's micro-batch (forward, backward, gradients accumulated).
    micro = on_one_ipu(*accumulate_step(args), ipus[0])
    accumulate = {"cycles": micro.cycles, **fit(micro)}
    del micro

    # The update over the replicas' IPUs: all-reduce, optimiser.
    mesh = jax.sharding.Mesh(np.array(ipus[:args.replicas]), ("replicas",))
    step, shapes, params = update_step(args, mesh)
    program = compile_program(step, shapes)
    reduces = all_reduces(program, args.replicas)
    update = {"cycles": program.cycles, **fit(program), "all_reduces": len(reduces),
              "all_reduce_cycles": sum(r["cycles"] for r in reduces),
              "all_reduce_link_cycles": sum(r["link_cycles"] for r in reduces),
              "all_reduce_bytes": [r["bytes"] for r in reduces], "all_reduce_groups": [r["group"] for r in reduces]}
    del program

    grad_bytes = sum(int(np.prod(p.shape)) * np.asarray(p).dtype.itemsize for p in jax.tree.leaves(params))
    images = args.batch * args.accumulate
    cycles = args.accumulate * accumulate["cycles"] + update["cycles"]
    pod = {"replicas": args.replicas, "accumulate": args.accumulate, "cycles": cycles, "step_s": cycles / clock,
           "fits": accumulate["fits"] and update["fits"], "gradient_bytes": grad_bytes,
           "gradient_tensors": len(jax.tree.leaves(params))}
    pod["images_per_s_per_ipu"] = images / pod["step_s"]
    pod["images_per_s"] = pod["images_per_s_per_ipu"] * args.replicas

    r = {"program": label, "target": target.describe(), "one_ipu": one, "accumulate": accumulate,
         "update": update, "pod": pod,
         "graphcore_mlperf_v1_0_per_ipu": MLPERF_V1_0_IMAGES_PER_SECOND_PER_IPU,
         "graphcore_mlperf_v1_1_pod16": MLPERF_V1_1_IMAGES_PER_SECOND_POD16}

    def fits(part):
        return (f"fits: {'yes' if part['fits'] else 'NO'} (busiest tile {part['max_tile_bytes']:,} B of "
                f"{target.bytes_per_tile:,}; {part['total_bytes'] / 1e6:.1f} MB in all)")

    def ms(c):
        return f"{c / clock * 1e3:.2f} ms"
    print(f"{label} on {target.describe()}")
    print(f"  one IPU, a step a micro-batch: {one['cycles']:,} cycles = {ms(one['cycles'])}, "
          f"{one['images_per_s']:,.0f} images/s; {fits(one)}")
    print(f"  {args.replicas} IPUs data-parallel, {args.accumulate} micro-batches accumulated per update "
          f"({images} images per IPU, {images * args.replicas} per update):")
    print(f"    a micro-batch: {accumulate['cycles']:,} cycles = {ms(accumulate['cycles'])}; {fits(accumulate)}")
    print(f"    the update: {update['cycles']:,} cycles = {ms(update['cycles'])}, of which {update['all_reduces']} "
          f"all-reduces of {grad_bytes / 1e6:.1f} MB of gradients {ms(update['all_reduce_cycles'])} (IPU-Links "
          f"{ms(update['all_reduce_link_cycles'])}); {fits(update)}")
    print(f"    step {args.accumulate} x {ms(accumulate['cycles'])} + {ms(update['cycles'])} = "
          f"{pod['step_s'] * 1e3:.2f} ms: {pod['images_per_s_per_ipu']:,.0f} images/s per IPU, "
          f"{pod['images_per_s']:,.0f} images/s on {args.replicas} IPUs")
    print(f"  Graphcore, IPU-POD16, MLPerf Training v1.0 (micro-batch 20, 6 accumulated): about "
          f"{MLPERF_V1_0_IMAGES_PER_SECOND_PER_IPU:,} images/s per IPU; v1.1: about "
          f"{MLPERF_V1_1_IMAGES_PER_SECOND_POD16:,} images/s on a POD16")
    if args.json:
        print(json.dumps(r))
    return r


if __name__ == "__main__":
    main()
