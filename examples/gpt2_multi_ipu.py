"""GPT-2 trained with AdamW on several IPUs, as a model bigger than one IPU
is run: weights split over the IPUs Megatron-style (attention by heads, the
MLP column- then row-parallel, the tied embedding / LM head by vocabulary),
AdamW's moments kept in each IPU's streaming memory (JAX memory kind
"pinned_host") and moved to SRAM only for the update. Plain JAX: the same
step runs on XLA:CPU (one device) for the losses to compare with.

Printed: the losses on both, each IPU's SRAM peak, the streaming memory in
use, the estimated tokens per second and where a step's time goes.

    python examples/gpt2_multi_ipu.py --model tiny          # seconds
    python examples/gpt2_multi_ipu.py --model gpt2-small    # 124M parameters: minutes on the Model
    python examples/gpt2_multi_ipu.py --model gpt2-wide --batch 1   # 8 IPUs; its weights alone exceed one IPU
"""
import argparse
import dataclasses
import os
import time

os.environ.setdefault("JAX_IPU_DEVICE_COUNT", "8")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P

import jax_ipu  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Config:
    vocab: int          # padded to a multiple of 128 (Megatron's padding), so it splits over the IPUs
    context: int
    width: int
    heads: int
    layers: int


CONFIGS = {
    "tiny": Config(vocab=512, context=32, width=64, heads=4, layers=2),
    "gpt2-small": Config(vocab=50304, context=1024, width=768, heads=12, layers=12),
    # 1600 wide (GPT-2 XL's width), 6 layers: 267M parameters, 1.07 GB of
    # float32 weights, more than one IPU's 940 MB of SRAM. On 4 IPUs a
    # quarter of the weights, their gradients and the embedding's moments
    # brought in for its update need more than a tile's 624 KiB: 8 IPUs.
    "gpt2-wide": Config(vocab=50304, context=1024, width=1600, heads=16, layers=6),
}
IPUS = {"gpt2-wide": 8}     # the IPUs a model takes by default; 4 otherwise
MODEL = "model"     # the mesh axis the weights are split over


def init(cfg: Config, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    d, h = cfg.width, cfg.heads

    def normal(*shape, scale=0.02):
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(scale))
    blocks = []
    for _ in range(cfg.layers):
        blocks.append({
            "ln1": {"scale": np.ones(d, np.float32), "bias": np.zeros(d, np.float32)},
            "attn": {"q": normal(d, h, d // h), "k": normal(d, h, d // h), "v": normal(d, h, d // h),
                     "qkv_bias": np.zeros((3, h, d // h), np.float32),
                     "out": normal(h, d // h, d, scale=0.02 / np.sqrt(2 * cfg.layers)),
                     "out_bias": np.zeros(d, np.float32)},
            "ln2": {"scale": np.ones(d, np.float32), "bias": np.zeros(d, np.float32)},
            "mlp": {"fc": normal(d, 4 * d), "fc_bias": np.zeros(4 * d, np.float32),
                    "proj": normal(4 * d, d, scale=0.02 / np.sqrt(2 * cfg.layers)),
                    "proj_bias": np.zeros(d, np.float32)},
        })
    return {"wte": normal(cfg.vocab, d), "wpe": normal(cfg.context, d, scale=0.01), "blocks": blocks,
            "ln_f": {"scale": np.ones(d, np.float32), "bias": np.zeros(d, np.float32)}}


def partition_specs(params: dict) -> dict:
    """Megatron's split: attention by heads, the MLP's first matmul by
    columns and its second by rows, the tied embedding by vocabulary;
    layer norms, position embeddings and output biases whole on each IPU."""
    block = {"ln1": {"scale": P(), "bias": P()},
             "attn": {"q": P(None, MODEL), "k": P(None, MODEL), "v": P(None, MODEL),
                      "qkv_bias": P(None, MODEL), "out": P(MODEL), "out_bias": P()},
             "ln2": {"scale": P(), "bias": P()},
             "mlp": {"fc": P(None, MODEL), "fc_bias": P(MODEL), "proj": P(MODEL), "proj_bias": P()}}
    return {"wte": P(MODEL), "wpe": P(), "blocks": [block] * len(params["blocks"]),
            "ln_f": {"scale": P(), "bias": P()}}


def layer_norm(x, p):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + 1e-5) * p["scale"] + p["bias"]


def attention(x, p):
    seq, head = x.shape[1], p["q"].shape[-1]
    q, k, v = (jnp.einsum("bsd,dhk->bhsk", x, p[n]) + p["qkv_bias"][i][None, :, None, :]
               for i, n in enumerate("qkv"))
    scores = jnp.einsum("bhsk,bhtk->bhst", q, k) / np.float32(np.sqrt(head))
    scores = jnp.where(jnp.tril(jnp.ones((seq, seq), bool)), scores, np.float32(-1e9))
    out = jnp.einsum("bhst,bhtk->bhsk", jax.nn.softmax(scores, axis=-1), v)
    return jnp.einsum("bhsk,hkd->bsd", out, p["out"]) + p["out_bias"]


def mlp(x, p):
    return jax.nn.gelu(x @ p["fc"] + p["fc_bias"]) @ p["proj"] + p["proj_bias"]


def loss_fn(params, ids, labels):
    x = jnp.take(params["wte"], ids, axis=0) + params["wpe"][:ids.shape[1]]
    for block in params["blocks"]:
        x = x + attention(layer_norm(x, block["ln1"]), block["attn"])
        x = x + mlp(layer_norm(x, block["ln2"]), block["mlp"])
    logits = layer_norm(x, params["ln_f"]) @ params["wte"].T
    # Cross-entropy as Megatron's vocabulary-parallel form: the label's logit
    # picked by a mask, so that every IPU works on its part of the
    # vocabulary, forwards and backwards (take_along_axis's gradient is a
    # scatter into a whole batch x sequence x vocabulary array on each IPU).
    picked = jnp.where(jnp.arange(logits.shape[-1]) == labels[..., None], logits, 0.0).sum(-1)
    return jnp.mean(jax.nn.logsumexp(logits, axis=-1) - picked)


def make_step(lr=3e-4, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.1):
    """One AdamW step; the moments arrive in streaming memory, are moved to
    SRAM for the update and back (jax.device_put inside jit)."""
    host, device = jax.memory.Space.Host, jax.memory.Space.Device

    def step(params, m, v, count, ids, labels):
        loss, grads = jax.value_and_grad(loss_fn)(params, ids, labels)
        count = count + 1
        c1, c2 = 1 - b1 ** count, 1 - b2 ** count

        def update(p, g, m, v):
            m, v = jax.device_put(m, device), jax.device_put(v, device)
            m = b1 * m + (1 - b1) * g
            v = b2 * v + (1 - b2) * g * g
            decay = weight_decay * p if p.ndim >= 2 else 0.0
            p = p - lr * ((m / c1) / (jnp.sqrt(v / c2) + eps) + decay)
            return p, jax.device_put(m, host), jax.device_put(v, host)
        out = jax.tree.map(update, params, grads, m, v)
        pick = lambda i: jax.tree.map(lambda t: t[i], out, is_leaf=lambda t: isinstance(t, tuple))  # noqa: E731
        return pick(0), pick(1), pick(2), count, loss
    return step


def place(params, devices, cfg: Config):
    """The training state on a mesh of `devices`: weights split by
    partition_specs in SRAM, AdamW's moments split alike in streaming memory."""
    mesh = Mesh(np.array(devices), (MODEL,))
    specs = partition_specs(params)
    in_sram = jax.tree.map(lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda s: isinstance(s, P))
    streamed = jax.tree.map(lambda s: s.with_memory_kind("pinned_host"), in_sram)
    replicated = NamedSharding(mesh, P())
    zeros = jax.tree.map(np.zeros_like, params)
    state = (jax.device_put(params, in_sram), jax.device_put(zeros, streamed), jax.device_put(zeros, streamed),
             jax.device_put(np.float32(0), replicated))
    step = jax.jit(make_step(), donate_argnums=(0, 1, 2),
                   out_shardings=(in_sram, streamed, streamed, replicated, replicated))
    return state, step, replicated


def batches(cfg: Config, batch: int, seq: int, steps: int, seed: int = 1):
    """A fixed random token stream (the example measures, it does not learn a language)."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, cfg.vocab, (steps, batch, seq + 1)).astype(np.int32)
    return [(t[:, :-1], t[:, 1:]) for t in tokens]


def run(cfg: Config, devices, data, compiler_options=None, after=None) -> tuple[list[float], float, object]:
    """The losses, the fastest step's wall time and what `after(devices)`
    returns, called while the trained state still exists (it is dropped
    before run returns, so that a model the size of the host's memory is
    not held twice)."""
    state, step, replicated = place(init(cfg), devices, cfg)
    losses, times = [], []
    for i, (ids, labels) in enumerate(data):
        ids, labels = jax.device_put((ids, labels), replicated)
        if i == 0 and compiler_options:
            step = step.lower(*state, ids, labels).compile(compiler_options=compiler_options)
        start = time.perf_counter()
        *state, loss = step(*state, ids, labels)
        losses.append(float(loss))
        times.append(time.perf_counter() - start)
    figures = after(devices) if after else None
    del state
    return losses, min(times), figures


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(CONFIGS), default="tiny")
    parser.add_argument("--ipus", type=int, default=None, help="default: 8 for gpt2-wide, else 4 (or as many as there are)")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=None, help="default: the model's context (tiny) or 128")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--no-cpu", action="store_true", help="skip the XLA:CPU reference")
    parser.add_argument("--available-memory-proportion", type=float, default=None,
                        help="of each tile's SRAM for a matmul's temporaries (the planner's default 0.6); lower "
                             "it when several large matmuls' partials meet on one tile")
    args = parser.parse_args(argv)
    cfg = CONFIGS[args.model]
    count = args.ipus or IPUS.get(args.model)
    ipus = jax.devices("ipu")[:count or 4]
    if count and len(ipus) < count:
        parser.error(f"{args.model} takes {count} IPUs; this process has {len(ipus)} "
                     f"(set JAX_IPU_DEVICE_COUNT={count} before jax starts)")
    seq = args.seq or (cfg.context if args.model == "tiny" else 128)
    data = batches(cfg, args.batch, seq, args.steps)
    n_params = sum(np.size(p) for p in jax.tree.leaves(jax.eval_shape(lambda: init(cfg))))
    print(f"GPT-2 {args.model}: {n_params / 1e6:.1f}M parameters ({4 * n_params / 2**20:.0f} MiB float32, "
          f"AdamW state {8 * n_params / 2**20:.0f} MiB) on {len(ipus)} modelled IPUs, batch {args.batch} x {seq}")

    options = ({"available_memory_proportion": args.available_memory_proportion}
               if args.available_memory_proportion else None)
    def figures(devices):
        return ([jax_ipu.last_profile(d) for d in devices], [jax_ipu.streaming_memory_in_use(d) for d in devices])
    # XLA:CPU first: its arrays are gone before the IPUs' are made.
    cpu_losses = [] if args.no_cpu else run(cfg, jax.devices("cpu")[:1], data)[0]
    losses, wall, (reports, streaming) = run(cfg, ipus, data, options, after=figures)
    for i, loss in enumerate(losses):
        ref = f" (XLA:CPU {cpu_losses[i]:.6f})" if cpu_losses else ""
        print(f"step {i}: loss {loss:.6f}{ref}")

    clock = jax_ipu.target(ipus[0]).clock_hz
    time_parts = reports[0]["time_breakdown"]
    cycles = sum(time_parts.values())
    seconds = cycles / clock
    tokens = args.batch * seq
    budget = jax_ipu.target(ipus[0]).num_tiles * jax_ipu.target(ipus[0]).bytes_per_tile
    for d, r, b in zip(ipus, reports, streaming, strict=True):
        print(f"IPU {d.id}: SRAM peak {r['memory']['total_bytes'] / 2**20:8.1f} MiB of {budget / 2**20:.0f} "
              f"(busiest tile {r['memory']['max_bytes'] / 1024:.0f} KiB of {r['memory']['bytes_per_tile'] // 1024}),"
              f" streaming memory in use {b / 2**20:.1f} MiB")
    print(f"estimated {seconds * 1e3:.2f} ms a step, {tokens / seconds:,.0f} tokens/s "
          f"(the Model took {wall:.1f} s to simulate it)")
    parts = dict(time_parts, pipeline_bubble=0)    # weights split, not staged: no bubble
    for kind in ("compute", "exchange", "sync", "ipu_link", "streaming_memory", "pipeline_bubble"):
        print(f"  {kind:16s} {parts[kind] / clock * 1e3:9.3f} ms  {100 * parts[kind] / cycles:5.1f}%")
    return {"losses": losses, "cpu_losses": cpu_losses, "reports": reports, "tokens_per_second": tokens / seconds,
            "streaming_bytes": streaming, "params": n_params, "ipus": len(ipus),
            "time": parts, "seconds": seconds, "wall_seconds": wall}


if __name__ == "__main__":
    main()
