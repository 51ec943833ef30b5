"""Loops on the IPU Model against XLA:CPU in the same process (issue 40):
programs that loop over small steps, jitted on each backend, the second
call timed, the two backends alternated.

    python benchmarks/loops.py [--rounds 5] [--tokens 16] [--only NAME ...] [--json FILE]

Rows (the loops a new user writes):
- fori_loop 20,000 x `c + 1.0` on a float32 scalar: the Model's overhead
  per iteration (goal: at most 1 us above XLA:CPU's time per iteration);
- fori_loop 20,000 x `c * 0.999 + 0.001` on float32[1024] (goal: 3x);
- the same two loops checked as Equinox's error_if checks (a host callback
  in a branch taken only if a value is NaN, never here): the check costs
  what the branch costs, the callback nothing (goals as without it; the
  f32[1024] loop also with the same branch holding no callback);
- fori_loop over n: `xs.at[i].set(2 * tanh(xs[i // 2]))`, n = 2,000 and
  20,000: an update in place costs the update, not the buffer (the time
  per iteration does not grow with n);
- lax.scan RNN, 1,000 steps of `tanh(h @ W + x_t)`, h float32[32, 256]
  (goal: 1.5x);
- GPT-2 small (124M parameters, float32) generating tokens greedily with
  a KV cache, every token inside one fori_loop (goal: 1.5x).

Each round times XLA:CPU then the IPU Model (the best of three calls
each); the machine is shared, so each row prints the range of the
rounds' times and ratios. The Model's cycle estimate of one call is
printed beside it (its modelled IPU's time).
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jax_ipu

ITERATIONS = 20_000


def scalar_loop():
    def f(c):
        return lax.fori_loop(0, ITERATIONS, lambda i, c: c + 1.0, c)
    return f, (np.float32(0),), ITERATIONS


def vector_loop():
    def f(c):
        return lax.fori_loop(0, ITERATIONS, lambda i, c: c * 0.999 + 0.001, c)
    return f, (np.ones(1024, np.float32),), ITERATIONS


def _fails(c):
    raise FloatingPointError("a NaN in the loop")


def _checked(c, callback: bool = True):
    """c, checked as Equinox's error_if checks: a host callback in a branch
    taken if c holds a NaN (callback=False: the same branch without the
    callback, zeros instead)."""
    def failed():
        return jax.pure_callback(_fails, jax.ShapeDtypeStruct(c.shape, c.dtype), c) if callback else c * 0
    return lax.cond(jnp.any(jnp.isnan(c)), failed, lambda: c)


def checked_scalar_loop():
    def f(c):
        return lax.fori_loop(0, ITERATIONS, lambda i, c: _checked(c + 1.0), c)
    return f, (np.float32(0),), ITERATIONS


def checked_vector_loop(callback: bool = True):
    def make():
        def f(c):
            return lax.fori_loop(0, ITERATIONS, lambda i, c: _checked(c * 0.999 + 0.001, callback), c)
        return f, (np.ones(1024, np.float32),), ITERATIONS
    return make


def update_loop(n: int):
    def make():
        def f(xs):
            return lax.fori_loop(0, xs.shape[0], lambda i, xs: xs.at[i].set(2 * jnp.tanh(xs[i // 2])), xs)
        return f, (np.linspace(-1, 1, n, dtype=np.float32),), n
    return make


def rnn():
    rng = np.random.default_rng(0)
    h = rng.standard_normal((32, 256)).astype(np.float32)
    w = (rng.standard_normal((256, 256)) / 16).astype(np.float32)
    xs = rng.standard_normal((1000, 32, 256)).astype(np.float32)

    def f(h, w, xs):
        return lax.scan(lambda h, x: (jnp.tanh(h @ w + x),) * 2, h, xs)
    return f, (h, w, xs), None


# GPT-2 small: 12 pre-LayerNorm blocks, 768 wide, 12 heads, MLP 3072,
# 1024 positions, 50,257 words (head tied to the embedding).
GPT2 = {"layers": 12, "width": 768, "heads": 12, "vocab": 50257, "positions": 1024}


def gpt2_params(cfg: dict, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    d, layers = cfg["width"], cfg["layers"]

    def normal(*shape, scale=0.02):
        return (rng.standard_normal(shape, dtype=np.float32) * scale).astype(np.float32)
    return {"wte": normal(cfg["vocab"], d), "wpe": normal(cfg["positions"], d, scale=0.01),
            "ln1": np.ones((layers, 2, d), np.float32), "ln2": np.ones((layers, 2, d), np.float32),
            "qkv": normal(layers, d, 3 * d), "proj": normal(layers, d, d),
            "fc": normal(layers, d, 4 * d), "out": normal(layers, 4 * d, d), "lnf": np.ones((2, d), np.float32)}


def _layer_norm(x, gb):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) * lax.rsqrt(var + 1e-5) * gb[0] + gb[1]


def gpt2_decode(cfg: dict, prompt: np.ndarray, tokens: int):
    """generate(params, prompt) -> the prompt and `tokens` more, each
    position run through the model once (the prompt's too), keys and
    values kept in a cache; greedy choice of each next token."""
    d, heads, layers = cfg["width"], cfg["heads"], cfg["layers"]
    hd = d // heads
    length = len(prompt) + tokens

    def step(t, carry, params):
        out, cache = carry
        x = params["wte"][out[t]] + params["wpe"][t]
        for i in range(layers):
            h = _layer_norm(x, params["ln1"][i])
            q, k, v = jnp.split(h @ params["qkv"][i], 3)
            cache = cache.at[i, 0, t].set(k).at[i, 1, t].set(v)
            keys, values = cache[i, 0].reshape(length, heads, hd), cache[i, 1].reshape(length, heads, hd)
            scores = jnp.einsum("hd,thd->ht", q.reshape(heads, hd), keys) / math.sqrt(hd)
            scores = jnp.where(jnp.arange(length) <= t, scores, -1e9)
            attention = jnp.einsum("ht,thd->hd", jax.nn.softmax(scores, axis=-1), values).reshape(d)
            x = x + attention @ params["proj"][i]
            h = _layer_norm(x, params["ln2"][i])
            x = x + jax.nn.gelu(h @ params["fc"][i]) @ params["out"][i]
        logits = params["wte"] @ _layer_norm(x, params["lnf"])
        chosen = jnp.argmax(logits).astype(jnp.int32)
        out = out.at[t + 1].set(jnp.where(t + 1 < len(prompt), out[t + 1], chosen))
        return out, cache

    def generate(params, prompt):
        out = jnp.zeros(length + 1, jnp.int32).at[:len(prompt)].set(prompt)
        cache = jnp.zeros((layers, 2, length, d), jnp.float32)
        out, _ = lax.fori_loop(0, length, lambda t, c: step(t, c, params), (out, cache))
        return out[:length]
    return generate


def decode(tokens: int):
    def make():
        params = gpt2_params(GPT2)
        prompt = np.array([464, 3290, 318, 257], np.int32)
        return gpt2_decode(GPT2, prompt, tokens), (params, prompt), None
    return make


ROWS = {
    "scalar": ("fori_loop 20,000 x c + 1.0, f32 scalar", scalar_loop, "overhead", 1.0),
    "vector": ("fori_loop 20,000 x c * 0.999 + 0.001, f32[1024]", vector_loop, "ratio", 3.0),
    "scalar_checked": ("the scalar loop, checked: a callback in a branch never taken", checked_scalar_loop,
                       "overhead", 1.0),
    "vector_branch": ("the f32[1024] loop, the same check without a callback", checked_vector_loop(False),
                      "ratio", 3.0),
    "vector_checked": ("the f32[1024] loop, checked: a callback in a branch never taken", checked_vector_loop(),
                       "ratio", 3.0),
    "update2k": ("fori_loop: xs.at[i].set(2 * tanh(xs[i // 2])), n = 2,000", update_loop(2000), "per_iteration",
                 None),
    "update20k": ("fori_loop: xs.at[i].set(2 * tanh(xs[i // 2])), n = 20,000", update_loop(20000),
                  "per_iteration", None),
    "rnn": ("lax.scan RNN, 1,000 x tanh(h @ W + x_t), h f32[32, 256]", rnn, "ratio", 1.5),
    "gpt2": ("GPT-2 small decoding with a KV cache, tokens in a fori_loop", None, "ratio", 1.5),
}


def best_of(f, args, calls: int = 3) -> float:
    jax.block_until_ready(f(*args))
    best = float("inf")
    for _ in range(calls):
        start = time.perf_counter()
        jax.block_until_ready(f(*args))
        best = min(best, time.perf_counter() - start)
    return best


def measure(make, rounds: int) -> dict:
    f, args, per = make()
    cpu, ipu = jax.devices("cpu")[0], jax.devices("ipu")[0]
    jitted = {name: jax.jit(f) for name in ("cpu", "ipu")}
    placed = {name: jax.device_put(args, device) for name, device in (("cpu", cpu), ("ipu", ipu))}
    compile_started = time.perf_counter()
    jax.block_until_ready(jitted["ipu"](*placed["ipu"]))
    first_call = time.perf_counter() - compile_started
    want, got = jitted["cpu"](*placed["cpu"]), jitted["ipu"](*placed["ipu"])
    agree = all(np.allclose(np.asarray(a), np.asarray(b), rtol=1e-3, atol=1e-3)
                for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got), strict=True))
    estimate = jax_ipu.last_profile(ipu)["estimated_seconds"]["device"]     # the run's cycles, modelled
    times = {"cpu": [], "ipu": []}
    for _ in range(rounds):
        for name in ("cpu", "ipu"):
            times[name].append(best_of(jitted[name], placed[name]))
    return {"cpu_s": times["cpu"], "ipu_s": times["ipu"], "iterations": per, "first_ipu_call_s": first_call,
            "agree_with_cpu": agree, "estimated_ipu_s": estimate}


def _range(values, scale=1.0, digits=2) -> str:
    low, high = min(values) * scale, max(values) * scale
    return f"{low:.{digits}f}-{high:.{digits}f}"


def report(name: str, found: dict) -> str:
    title, _, kind, goal = ROWS[name]
    cpu, ipu, per = found["cpu_s"], found["ipu_s"], found["iterations"]
    ratios = [i / c for c, i in zip(cpu, ipu, strict=True)]
    found["ratios"] = ratios
    if per:
        cpu_us, ipu_us = _range(cpu, 1e6 / per, 3), _range(ipu, 1e6 / per, 3)
        overhead = [(i - c) * 1e6 / per for c, i in zip(cpu, ipu, strict=True)]
        found["overhead_us_per_iteration"] = overhead
        line = f"| {title} | {cpu_us} us/it | {ipu_us} us/it | {_range(ratios)}x | +{_range(overhead, 1, 3)} us/it |"
    else:
        line = f"| {title} | {_range(cpu, 1e3, 1)} ms | {_range(ipu, 1e3, 1)} ms | {_range(ratios)}x | |"
    if kind == "ratio":
        verdict = "ok" if statistics.median(ratios) <= goal else "MISSED"
        line += f" {verdict}: goal {goal}x |"
    elif kind == "overhead":
        verdict = "ok" if statistics.median(found["overhead_us_per_iteration"]) <= goal else "MISSED"
        line += f" {verdict}: goal +{goal} us/it |"
    else:
        line += " per iteration independent of n |"
    line += f" {found['estimated_ipu_s'] * 1e3:.2f} ms |"
    line += "" if found["agree_with_cpu"] else " VALUES DIFFER"
    return line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=16, help="tokens GPT-2 generates after a 4-token prompt")
    parser.add_argument("--only", nargs="*", choices=sorted(ROWS), help="rows to run (default: all)")
    parser.add_argument("--json", help="write the measurements here")
    args = parser.parse_args()
    makers = {name: row[1] for name, row in ROWS.items()}
    makers["gpt2"] = decode(args.tokens)
    print(f"loops on the IPU Model against XLA:CPU, {args.rounds} rounds alternated, best of 3 calls each")
    print("| program | XLA:CPU | IPU Model | ratio | Model overhead | goal | estimate on the IPU |")
    print("|---|---|---|---|---|---|---|")
    results = {}
    for name in args.only or ROWS:
        results[name] = measure(makers[name], args.rounds)
        print(report(name, results[name]), flush=True)
    for name, found in results.items():
        print(f"{name}: first IPU call (compile and run) {found['first_ipu_call_s']:.1f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
