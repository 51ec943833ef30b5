"""Programs as researchers write them, run on the ipu device and compared
with JAX's CPU backend: models with their training steps (transformer
block, LSTM, conv net with batch norm, Flax + Optax, a small language
model), control-flow driven loops, linear algebra, sorting and scans,
indexing and scatters, integer and float16 arithmetic, jax.nn and
jax.random, autodiff tools (remat, custom rules, vmap of grad), pytrees,
static and donated arguments, and arrays from empty to 1M elements. Inputs
are committed with jax.device_put, as a user places them.

Tolerances: 1e-5 for element-wise programs (both backends round each op
once in f32); matmul-heavy programs and gradients sum in a different order
on the IPU's planned partials, so they get 1e-4 to 1e-3, stated at each
check; bit-exact where the result is a selection (sort, top_k, indices,
integer ops, random bits)."""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import assert_matches_cpu, on_cpu, run_on

EXACT = dict(rtol=0, atol=0)


def normal(*shape, seed=0, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def integers(low, high, shape, dtype=np.int32, seed=0):
    return np.random.default_rng(seed).integers(low, high, shape).astype(dtype)


# --- models and their training steps ---------------------------------------------------------

def layernorm(x, gain, bias, eps=1e-5):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + eps) * gain + bias


def transformer_block(p, x, key, heads=4, keep=0.9):
    b, t, d = x.shape
    q, k, v = jnp.split(layernorm(x, p["g1"], p["b1"]) @ p["wqkv"], 3, -1)
    q, k, v = (a.reshape(b, t, heads, d // heads) for a in (q, k, v))
    scores = jnp.einsum("bthd,bshd->bhts", q, k) / np.sqrt(d // heads)
    scores = jnp.where(jnp.tril(jnp.ones((t, t), bool)), scores, -jnp.inf)
    attention = jax.nn.softmax(scores, -1)
    attention = jnp.where(jax.random.bernoulli(key, keep, attention.shape), attention / keep, 0)
    x = x + jnp.einsum("bhts,bshd->bthd", attention, v).reshape(b, t, d) @ p["wo"]
    return x + jax.nn.gelu(layernorm(x, p["g2"], p["b2"]) @ p["w1"]) @ p["w2"]


def test_transformer_block_with_causal_mask_and_dropout():
    d = 32
    p = dict(g1=np.ones(d, np.float32), b1=np.zeros(d, np.float32), wqkv=normal(d, 3 * d, scale=0.1),
             wo=normal(d, d, seed=1, scale=0.1), g2=np.ones(d, np.float32), b2=np.zeros(d, np.float32),
             w1=normal(d, 4 * d, seed=2, scale=0.1), w2=normal(4 * d, d, seed=3, scale=0.1))
    x, key = normal(2, 7, d, seed=4), jax.random.key(0)
    assert_matches_cpu(transformer_block, p, x, key, rtol=1e-4, atol=1e-4)        # matmuls: planned partial order
    loss = lambda p, x, key: jnp.sum(transformer_block(p, x, key) ** 2)
    # gradients of a 2x7x32 sum of squares
    assert_matches_cpu(jax.value_and_grad(loss), p, x, key, rtol=1e-3, atol=1e-3)


def lstm(params, xs):
    wx, wh, b = params

    def step(carry, x):
        h, c = carry
        i, f, g, o = jnp.split(x @ wx + h @ wh + b, 4, -1)
        c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        h = jax.nn.sigmoid(o) * jnp.tanh(c)
        return (h, c), h
    zeros = jnp.zeros((xs.shape[1], wh.shape[0]))
    return jax.lax.scan(step, (zeros, zeros), xs)[1]


def test_lstm_with_scan_forward_and_gradient():
    params = (normal(5, 64, scale=0.3), normal(16, 64, seed=1, scale=0.3), np.zeros(64, np.float32))
    xs = normal(11, 3, 5, seed=2)
    assert_matches_cpu(lstm, params, xs, rtol=1e-4, atol=1e-5)
    assert_matches_cpu(jax.grad(lambda p, xs: jnp.mean(lstm(p, xs) ** 2)), params, xs, rtol=1e-3, atol=1e-5)
    assert_matches_cpu(lambda xs: jax.lax.scan(lambda c, x: (c * 0.9 + x, c), 0.0, xs, reverse=True, unroll=2),
                       xs[:, 0, 0], rtol=1e-5, atol=1e-5)


def conv_net(p, x):
    dn = ("NHWC", "HWIO", "NHWC")
    y = jax.lax.conv_general_dilated(x, p["k1"], (1, 1), "SAME", dimension_numbers=dn)
    y = (y - y.mean((0, 1, 2))) / jnp.sqrt(y.var((0, 1, 2)) + 1e-5) * p["gamma"] + p["beta"]   # batch norm
    y = jax.lax.reduce_window(jax.nn.relu(y), -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
    y = jax.lax.conv_general_dilated(y, p["k2"], (2, 2), "SAME", dimension_numbers=dn)
    y = jax.lax.reduce_window(y, 0.0, jax.lax.add, (1, 2, 2, 1), (1, 1, 1, 1), "SAME") / 4     # avg pool
    return y.mean((1, 2)) @ p["fc"]


def test_conv_net_with_batch_norm_training_step():
    p = dict(k1=normal(3, 3, 3, 8, scale=0.3), gamma=np.ones(8, np.float32), beta=np.zeros(8, np.float32),
             k2=normal(3, 3, 8, 16, seed=1, scale=0.2), fc=normal(16, 10, seed=2, scale=0.3))
    x, y = normal(4, 15, 15, 3, seed=3), integers(0, 10, 4)

    def step(p, x, y):
        loss = lambda p: -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(conv_net(p, x)), y[:, None], 1))
        value, grads = jax.value_and_grad(loss)(p)
        return value, jax.tree.map(lambda a, g: a - 0.1 * g, p, grads)
    assert_matches_cpu(step, p, x, y, rtol=1e-3, atol=1e-4)   # two convolutions and their gradients


def test_flax_cnn_with_optax_adamw_step():
    import flax.linen as nn
    import optax

    class CNN(nn.Module):
        @nn.compact
        def __call__(self, x, train):
            x = nn.Conv(8, (3, 3), use_bias=False)(x)     # a bias before batch norm has no gradient
            x = nn.relu(nn.BatchNorm(use_running_average=not train)(x))
            x = nn.Dropout(0.2, deterministic=not train)(nn.max_pool(x, (2, 2), (2, 2)))
            x = nn.LayerNorm()(nn.Dense(32)(x.reshape(x.shape[0], -1)))
            return nn.Dense(10)(nn.gelu(x))

    model, x, y = CNN(), normal(8, 12, 12, 1), integers(0, 10, 8)
    variables = model.init({"params": jax.random.key(0), "dropout": jax.random.key(1)}, x, False)
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3, weight_decay=1e-4))

    def step(params, batch_stats, opt_state, x, y, key):
        def loss(p):
            logits, updates = model.apply({"params": p, "batch_stats": batch_stats}, x, True,
                                          rngs={"dropout": key}, mutable=["batch_stats"])
            return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean(), updates
        (value, updates), grads = jax.value_and_grad(loss, has_aux=True)(params)
        changes, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, changes), updates["batch_stats"], opt_state, value
    # Adam divides by sqrt(v): a gradient's last bits move the update by ~1e-4 of lr
    assert_matches_cpu(step, variables["params"], variables["batch_stats"], tx.init(variables["params"]), x, y,
                       jax.random.key(3), rtol=1e-3, atol=1e-4)


def test_language_model_step_with_embedding_and_large_vocabulary_sampling():
    vocab, d, t, b = 1000, 64, 128, 8

    def loss(p, tokens):
        x = p["emb"][tokens]
        scores = jnp.einsum("btd,bsd->bts", x @ p["w"], x) / 8.0
        x = x + jax.nn.softmax(jnp.where(jnp.tril(jnp.ones((t, t), bool)), scores, -1e9)) @ x
        logits = jax.nn.log_softmax((x @ p["emb"].T)[:, :-1])
        return -jnp.mean(jnp.take_along_axis(logits, tokens[:, 1:, None], -1))
    p = {"emb": normal(vocab, d, scale=0.1), "w": normal(d, d, seed=1, scale=0.1)}
    # scatter-add grads
    assert_matches_cpu(jax.value_and_grad(loss), p, integers(0, vocab, (b, t)), rtol=1e-3, atol=1e-5)
    # Top-k sampling over a GPT-2-sized vocabulary: rows longer than one tile holds.
    logits = normal(3, 50257, seed=2)
    assert_matches_cpu(lambda l: jax.lax.top_k(l, 40), logits, **EXACT)
    assert_matches_cpu(lambda l, k: jax.random.categorical(k,
                                                           jnp.where(l >= jax.lax.top_k(l, 40)[0][:, -1:], l,
                                                                     -jnp.inf)), logits, jax.random.key(5), **EXACT)


# --- autodiff tools, vmap, control flow ---------------------------------------------------------

def test_per_example_gradients_jacobians_and_hessians():
    loss = lambda w, x, y: (jnp.tanh(x @ w).sum() - y) ** 2
    assert_matches_cpu(jax.vmap(jax.grad(loss), in_axes=(None, 0, 0)), normal(6, 3), normal(13, 6, seed=1),
                       normal(13, seed=2), rtol=1e-4, atol=1e-5)
    assert_matches_cpu(jax.vmap(jax.jacfwd(lambda x: jnp.sin(x) * x.sum())), normal(5, 4), rtol=1e-5, atol=1e-5)
    assert_matches_cpu(jax.hessian(lambda x: jnp.sum(jnp.exp(x) * x[::-1])), normal(5), rtol=1e-4, atol=1e-5)


def test_while_loop_training_with_cond_switch_and_fori():
    def train(w, x, y):
        def body(state):
            i, w, _ = state
            value, g = jax.value_and_grad(lambda w: jnp.mean((x @ w - y) ** 2))(w)
            w = jax.lax.cond(value > 1.0, lambda w: w - 0.05 * g, lambda w: w - 0.01 * g, w)
            return i + 1, w, value
        return jax.lax.while_loop(lambda s: (s[0] < 50) & (s[2] > 1e-3), body, (0, w, jnp.float32(1e9)))
    steps, _, _ = assert_matches_cpu(train, normal(4, 1), normal(20, 4, seed=1), normal(20, 1, seed=2), rtol=1e-4,
                                     atol=1e-5)
    assert int(steps) == 50
    branches = [jnp.sin, jnp.cos, lambda x: -x, jnp.exp]
    for index in (2, 7, -1):    # out-of-range indices clamp
        assert_matches_cpu(lambda i, x: jax.lax.switch(i, branches, x), np.int32(index), normal(7),
                           rtol=1e-5, atol=1e-5)
    assert_matches_cpu(lambda n, x: jax.lax.fori_loop(0, n, lambda i, x: x * 1.1 + i, x), np.int32(5), normal(3),
                       rtol=1e-5, atol=1e-5)
    assert_matches_cpu(jax.vmap(lambda p, x: jax.lax.cond(p, jnp.sin, jnp.cos, x)), np.array([True, False, True]),
                       normal(3), rtol=1e-5, atol=1e-5)
    assert_matches_cpu(jax.grad(lambda x: jax.lax.fori_loop(0, 5, lambda i, c: jnp.sin(c) * (i + 1), x).sum()),
                       normal(6), rtol=1e-5, atol=1e-5)
    state = {"n": 0, "v": (normal(4), jnp.int32(0))}
    assert_matches_cpu(lambda s: jax.lax.while_loop(lambda s: s["n"] < 10, lambda s: {
                     "n": s["n"] + 1, "v": (s["v"][0] * 1.1, s["v"][1] + s["n"])}, s), state, rtol=1e-5, atol=1e-5)


def test_adam_by_hand_in_a_scanned_training_loop():
    def mlp(p, x):
        for layer in p["layers"]:
            x = jnp.tanh(x @ layer["w"] + layer["b"])
        return x @ p["out"]

    def train(p, x, y, b1=0.9, b2=0.999, lr=1e-2):
        state = dict(m=jax.tree.map(jnp.zeros_like, p), v=jax.tree.map(jnp.zeros_like, p), t=jnp.int32(0))

        def step(carry, _):
            p, s = carry
            value, g = jax.value_and_grad(lambda p: jnp.mean((mlp(p, x) - y) ** 2))(p)
            t = s["t"] + 1
            m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, s["m"], g)
            v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, s["v"], g)
            p = jax.tree.map(lambda p, m, v: p - lr * (m / (1 - b1 ** t)) / (jnp.sqrt(v / (1 - b2 ** t)) + 1e-8),
                             p, m, v)
            return (p, dict(m=m, v=v, t=t)), value
        (p, _), losses = jax.lax.scan(step, (p, state), None, length=20)
        return p, losses
    p = dict(layers=[dict(w=normal(8, 16, scale=0.3), b=np.zeros(16, np.float32)),
                     dict(w=normal(16, 16, seed=1, scale=0.3), b=np.zeros(16, np.float32))],
             out=normal(16, 1, seed=2, scale=0.3))
    # 20 Adam steps
    _, losses = assert_matches_cpu(train, p, normal(32, 8, seed=3), normal(32, 1, seed=4), rtol=1e-3, atol=1e-4)
    assert losses[-1] < losses[0]


def test_remat_custom_vjp_and_custom_jvp():
    def deep(ws, x):
        layer = jax.checkpoint(lambda x, w: jnp.sin(x @ w))
        for w in ws:
            x = layer(x, w)
        return x.sum()
    assert_matches_cpu(jax.grad(deep), [normal(8, 8, seed=s, scale=0.5) for s in range(4)], normal(3, 8, seed=9),
                       rtol=1e-4, atol=1e-5)
    saved = jax.checkpoint(lambda w, x: jnp.sum(jnp.tanh(x @ w) @ w), policy=jax.checkpoint_policies.dots_saveable)
    assert_matches_cpu(jax.grad(saved), normal(8, 8), normal(3, 8, seed=1), rtol=1e-4, atol=1e-5)
    scanned = lambda w, xs: jax.lax.scan(jax.checkpoint(lambda c, x: (jnp.tanh(c @ w + x), None)),
                                         jnp.zeros(4), xs)[0].sum()
    assert_matches_cpu(jax.grad(scanned), normal(4, 4), normal(10, 4, seed=1), rtol=1e-4, atol=1e-5)

    @jax.custom_vjp
    def clip_gradient(x):
        return x
    clip_gradient.defvjp(lambda x: (x, None), lambda _, g: (jnp.clip(g, -0.1, 0.1),))

    @jax.custom_vjp
    def safe_norm(x):
        return jnp.sqrt(jnp.sum(x ** 2))
    safe_norm.defvjp(lambda x: (safe_norm(x), x), lambda x, g: (g * x / jnp.maximum(jnp.sqrt(jnp.sum(x ** 2)), 1e-6),))

    @jax.custom_jvp
    def softplus(x):
        return jnp.log1p(jnp.exp(x))
    softplus.defjvp(lambda p, t: (softplus(p[0]), t[0] * jax.nn.sigmoid(p[0])))
    assert_matches_cpu(jax.grad(lambda x: jnp.sum(clip_gradient(x) ** 2) + safe_norm(x) + softplus(x).sum()), normal(9),
                       rtol=1e-5, atol=1e-5)
    assert_matches_cpu(jax.grad(safe_norm), np.zeros(3, np.float32), rtol=1e-5, atol=1e-5)


def test_pytrees_static_argnums_and_donation():
    assert_matches_cpu(lambda d: {"a": d["x"] + d["y"]["z"], "b": [d["x"].sum(), (d["y"]["z"] * 2,)]},
                       {"x": normal(3), "y": {"z": normal(3, seed=1)}}, rtol=1e-5, atol=1e-5)
    ipu = jax.devices("ipu")[0]
    power = jax.jit(lambda x, n, mode: x ** n if mode == "pow" else x * n, static_argnums=(1, 2))
    x = jax.device_put(normal(4), ipu)
    np.testing.assert_allclose(power(x, 3, "pow"), np.asarray(x) ** 3, rtol=1e-6)
    np.testing.assert_allclose(power(x, 3, "mul"), np.asarray(x) * 3, rtol=1e-6)
    update = jax.jit(lambda s, d: jax.tree.map(lambda a: a + d, s), donate_argnums=0)
    state = jax.device_put({"a": normal(100), "b": normal(3, 3)}, ipu)
    before = jax.tree.map(np.asarray, state)
    after = update(state, 1.0)
    assert state["a"].is_deleted() and after["a"].devices() == {ipu}
    np.testing.assert_allclose(after["b"], before["b"] + 1)


# --- linear algebra ----------------------------------------------------------------------------

@pytest.mark.parametrize("n", [1, 7, 64])
def test_linalg_small_and_medium(ipu, n):
    a = normal(n, n) + n * np.eye(n, dtype=np.float32)
    spd = a @ a.T
    # LAPACK's algorithms in f32 on both sides; results scale with n
    tol = dict(rtol=1e-3, atol=1e-3)
    assert_matches_cpu(lambda a, b: (jnp.linalg.solve(a, b), jnp.linalg.inv(a), jnp.linalg.slogdet(a)), a,
                       normal(n, 2, seed=1), **tol)
    assert_matches_cpu(lambda s: (jnp.linalg.cholesky(s), jnp.linalg.eigh(s)[0]), spd, rtol=1e-3, atol=1e-3 * n)
    q, r = assert_matches_cpu(jnp.linalg.qr, a, **tol) if n == 1 else run_on(ipu, jnp.linalg.qr, a)
    np.testing.assert_allclose(np.asarray(q) @ np.asarray(r), a, rtol=1e-4, atol=1e-4 * n)
    u, s, vt = run_on(ipu, lambda a: jnp.linalg.svd(a, full_matrices=False), a)
    np.testing.assert_allclose(s, np.linalg.svd(a, compute_uv=False), **tol)
    np.testing.assert_allclose((np.asarray(u) * s) @ np.asarray(vt), a, rtol=1e-4, atol=1e-4 * n)


def test_linalg_least_squares_gradients_and_batches():
    a = normal(20, 5)
    tol = dict(rtol=1e-3, atol=1e-4)
    assert_matches_cpu(lambda a, b: (jnp.linalg.lstsq(a, b)[0], jnp.linalg.pinv(a), jnp.linalg.norm(a, 2),
                                     jnp.linalg.norm(a, "nuc")), a, normal(20, seed=1), **tol)
    s = (lambda m: m @ m.T / 200 + np.eye(200, dtype=np.float32))(normal(200, 200, seed=2))
    assert_matches_cpu(lambda s, b: (jnp.linalg.eigh(s)[0], jnp.linalg.solve(s, b)), s, normal(200, 3, seed=3), **tol)
    assert_matches_cpu(jax.grad(lambda s: jnp.linalg.slogdet(s)[1] + jnp.trace(jnp.linalg.inv(s))
                                + jnp.linalg.eigh(s)[0].sum()), s[:10, :10], **tol)
    assert_matches_cpu(jnp.linalg.solve, normal(3, 5, 5) + 5 * np.eye(5, dtype=np.float32), normal(3, 5, 1, seed=1),
                       **tol)
    assert_matches_cpu(jax.scipy.linalg.expm, normal(4, 4, scale=0.3), rtol=1e-4, atol=1e-4)


# --- sorting, scans, indexing --------------------------------------------------------------------

def test_sort_argsort_top_k_with_nans_and_ties():
    x = normal(7, 1023)
    assert_matches_cpu(lambda x: (jnp.sort(x), jnp.argsort(x), jnp.sort(x, axis=0), jnp.argsort(-x, stable=True),
                                  jax.lax.top_k(x, 5), jnp.median(x, 1), jnp.quantile(x, 0.3)), x, **EXACT)
    ints = integers(-5, 5, (3, 33))
    assert_matches_cpu(lambda x: (jnp.argsort(x, stable=True), jnp.argsort(x, descending=True, stable=True),
                                  jax.lax.top_k(x, 3), jnp.lexsort((x[0], x[1])),
                                  jnp.unique(x[0], size=10, fill_value=-1)), ints, **EXACT)
    nans = np.array([[3, np.nan, -1, np.inf, -np.inf, 0, -0.0, np.nan], [1, 1, 1, -2, -2, 5, 5, 0]], np.float32)
    assert_matches_cpu(lambda x: (jnp.sort(x), jnp.argsort(x, descending=True), jax.lax.top_k(x, 4), jnp.max(x, 1),
                                  jnp.argmax(x, 1), jnp.argmin(x, 1)), nans, **EXACT)
    keys, values = integers(0, 3, 17), normal(17)
    assert_matches_cpu(lambda k, v: (jax.lax.sort((k, v), num_keys=1), jnp.searchsorted(jnp.sort(v), v[:5])), keys,
                       values, **EXACT)


def test_top_k_of_rows_longer_than_a_tile_holds():
    x = normal(1 << 20)
    x[::97] = np.nan
    assert_matches_cpu(lambda x: jax.lax.top_k(x, 10), x, **EXACT)
    # ties, k near the chunk size
    assert_matches_cpu(lambda x: jax.lax.top_k(x, 2000), integers(-3, 3, 9000), **EXACT)
    assert_matches_cpu(lambda x: jax.lax.top_k(x, 3, axis=0), normal(9000, 2), **EXACT)


def test_cumulative_ops_short_long_and_1m():
    x = normal(5, 1023)
    # the IPU's associative scan sums as XLA:CPU's; cumprod of 20 factors and logsumexp round a little
    assert_matches_cpu(lambda x: (jnp.cumsum(x, 1), jnp.cumprod(x[:, :20] * 0.5 + 1, 1), jax.lax.cummax(x, 1),
                                  jax.lax.cummin(x, 0), jax.lax.cumlogsumexp(x, 1), jax.lax.cummax(x, 1, reverse=True)),
                       x, rtol=1e-5, atol=1e-4)
    assert_matches_cpu(lambda x: (jnp.cumsum(x), jnp.cumsum(x > 0), jnp.cumprod(x, 1)), integers(-5, 5, (3, 33)),
                       **EXACT)
    assert_matches_cpu(lambda x: jnp.cumsum(x, 1), normal(5, 4096), rtol=1e-5, atol=1e-4)   # did not fit a tile before
    big = normal(1 << 20)
    assert_matches_cpu(lambda x: (jnp.cumsum(x)[::4096], jax.lax.cummax(x), jnp.cumsum(x > 0)), big, rtol=1e-5,
                       atol=1e-3)


def test_segment_sum_one_hot_take_along_axis_and_scatter_modes():
    idx, vals = integers(0, 10, 40), normal(40)
    assert_matches_cpu(lambda d, i: (jax.ops.segment_sum(d, i, 10), jax.ops.segment_max(d, i, 10),
                                     jax.ops.segment_min(d, i, 10),
                                     jax.ops.segment_prod(d, i, 10), jax.nn.one_hot(i, 10), jnp.bincount(i, length=12)),
                       vals, idx, rtol=1e-5, atol=1e-5)
    ones = np.ones(10, np.float32)
    assert_matches_cpu(lambda z, i, v: (z.at[i].add(v), z.at[i].min(v), z.at[i].max(v), z.at[i].mul(v),
                                        z.at[i].set(1.0),
                                        z.at[i + 5].get(mode="fill", fill_value=-7.0), z.at[i + 3].add(v, mode="drop"),
                                        z.at[i - 10].get()), ones, idx, vals, rtol=1e-5, atol=1e-5)
    assert_matches_cpu(lambda z, i, v: z.at[i, 2:5].add(v[:, None]).at[:, ::2].multiply(2.0).at[-1].set(3.0),
                       normal(10, 7), idx, vals, rtol=1e-5, atol=1e-5)
    assert_matches_cpu(lambda x, i: (jnp.take_along_axis(x, i, axis=1), jnp.take(x[0], i * 3 - 10, mode="clip"),
                                     jnp.take(x[0], i * 3 - 10, mode="wrap")), normal(5, 9), integers(0, 9, (5, 4)),
                       rtol=1e-5, atol=1e-5)
    assert_matches_cpu(lambda x: (x[jnp.array([0, 2, 4]), :, jnp.array([1, 1, 0])],
                                  jnp.nonzero(x[:, 0, 0] > 0, size=4, fill_value=-1)),
                       normal(5, 3, 2), rtol=1e-5, atol=1e-5)
    assert_matches_cpu(jax.grad(lambda table, i: jnp.sum(table[i] ** 2)), normal(10, 4), idx, rtol=1e-5, atol=1e-5)
    assert_matches_cpu(lambda x, i: jnp.zeros(1000).at[i].add(x), normal(1 << 20), integers(0, 1000, 1 << 20),
                       rtol=1e-4, atol=1e-3)     # ~1000 f32 additions per bucket, in another order


def test_where_and_nan_handling():
    x = np.array([1.0, np.nan, -np.inf, np.inf, 0.0, -0.0, 3.0], np.float32)
    assert_matches_cpu(lambda x: (jnp.where(jnp.isnan(x), 0.0, x), jnp.nan_to_num(x), jnp.nanmean(x), jnp.nansum(x),
                                  jnp.nanmax(x), jnp.nanargmax(x), jnp.isfinite(x), jnp.max(x), jnp.fmax(x, 1.0),
                                  jnp.maximum(x, 1.0), jnp.sign(x), jax.nn.relu(x), jnp.clip(x, 0, 1), 1 / x), x,
                       rtol=1e-5, atol=1e-5)
    assert_matches_cpu(jax.grad(lambda x: jnp.sum(jnp.where(x > 0, jnp.log(jnp.where(x > 0, x, 1.0)), 0.0))), normal(9),
                       rtol=1e-5, atol=1e-5)
    assert_matches_cpu(lambda x: (x / x, jnp.log(x), jnp.sqrt(x - 1), jnp.arctan2(x, x), x ** 0.5),
                       np.array([0.0, -1.0, 2.0, -0.0], np.float32), rtol=1e-5, atol=1e-5)
    assert_matches_cpu(lambda z: (jax.nn.logsumexp(z, 1), jax.nn.softmax(z, where=jnp.isfinite(z))),
                       np.array([[-np.inf, -np.inf], [0.0, -np.inf]], np.float32), rtol=1e-5, atol=1e-5)


# --- integers, float16, booleans, einsum, jax.nn ----------------------------------------------------

def test_integer_arithmetic_and_bit_ops():
    a = np.random.default_rng(1).integers(-2 ** 31, 2 ** 31 - 1, 64, dtype=np.int64).astype(np.int32)
    b = integers(-50, 50, 64, seed=2)
    b[b == 0] = 3
    assert_matches_cpu(lambda a, b: (a + b, a * b, a // b, a % b, jnp.abs(a), -a, jax.lax.div(a, b), jax.lax.rem(a, b),
                                     a ** 2,
                                     jnp.gcd(b, b[::-1]), jnp.lcm(a % 100, b), jnp.sum(a), jnp.cumsum(a), jnp.mean(b)),
                       a, b, **EXACT)
    assert_matches_cpu(lambda a, b: (a & b, a | b, a ^ b, ~a, a << (b & 31), a >> (b & 31),
                                     jax.lax.shift_right_logical(a, b & 31),
                                     jax.lax.population_count(a), jax.lax.clz(a), jnp.left_shift(a, 33),
                                     jnp.right_shift(a, -1)), a, b, **EXACT)
    assert_matches_cpu(lambda a, b: (a + b, a * b, a // (b | 1), a % (b | 1), a >> 3, jnp.maximum(a, b),
                                     a.astype(jnp.float32)), a.view(np.uint32), b.view(np.uint32), **EXACT)
    assert_matches_cpu(lambda a, b: (a + b, a * b, a.astype(jnp.int16) * 300, (a * b).astype(jnp.uint8)),
                       (b * 3).astype(np.int8), b.astype(np.int8), **EXACT)
    edge_a, edge_b = np.array([7, -7, 0, 2 ** 31 - 1, -2 ** 31, 5], np.int32), np.array([0, 0, 0, -1, -1, 2], np.int32)
    # XLA's x/0 and MIN/-1
    assert_matches_cpu(lambda a, b: (jax.lax.div(a, b), jax.lax.rem(a, b)), edge_a, edge_b, **EXACT)
    f = np.array([np.nan, np.inf, -np.inf, 3e9, -3e9, 2.5, -2.5, 255.7, -1.0], np.float32)
    assert_matches_cpu(lambda x: (x.astype(jnp.int32), x.astype(jnp.uint8), x.astype(jnp.int8), jnp.round(x),
                                  jnp.rint(x)), f, **EXACT)


def test_float16_programs():
    h = normal(8, 64).astype(np.float16)
    w = normal(64, 32, seed=1, scale=0.1).astype(np.float16)
    # f16 keeps 11 bits: 1e-2 covers a 64-term product and the transcendentals
    tol = dict(rtol=1e-2, atol=1e-2)
    assert_matches_cpu(lambda x, w: jax.nn.relu(x @ w).sum(0), h, w, **tol)
    assert_matches_cpu(lambda x: (jax.nn.softmax(x), x.mean(-1), x.var(-1), jax.nn.logsumexp(x, -1), jnp.tanh(x),
                                  jnp.sort(x, 1), (x.astype(jnp.float32) * 3).astype(jnp.float16)), h, **tol)
    assert_matches_cpu(jax.grad(lambda w, x: jnp.sum((x @ w).astype(jnp.float32) ** 2)), w[:, :4], h, rtol=2e-2,
                       atol=2e-2)
    big = (np.random.default_rng(3).random(1 << 20) * 0.01).astype(np.float16)
    assert_matches_cpu(lambda x: (jnp.sum(x), jnp.mean(x), jnp.max(x)), big, rtol=1e-2, atol=1e-5)
    # Overflow as IEEE f16 rounds each op (numpy); XLA:CPU folds (x*1000)*1000 into x*1e6, inf in f16.
    got = jax.jit(lambda x: x * 1000 * 1000)(jax.device_put(h, jax.devices("ipu")[0]))
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(got, h * np.float16(1000) * np.float16(1000))
    assert np.isfinite(np.asarray(got)).any() and np.isinf(np.asarray(got)).any()


def test_bool_reductions_and_masks():
    b = np.random.default_rng(0).random((7, 33)) < 0.3
    assert_matches_cpu(lambda b: (b.any(), b.all(), b.any(0), b.all(1), b.sum(), b.sum(1), jnp.count_nonzero(b, 0),
                                  b.mean(),
                                  jnp.logical_xor(b, b[::-1]), ~b, b.argmax(1), jnp.cumsum(b, 1), b.max(0), b.min(1)),
                       b, **EXACT)
    assert_matches_cpu(lambda b, x: (b * x, jnp.where(b, x, -x), (x * b).sum()), b, normal(7, 33), rtol=1e-5, atol=1e-5)


def test_einsum_variants():
    a, b, c = normal(3, 4, 5), normal(5, 6, seed=1), normal(3, 6, seed=2)
    assert_matches_cpu(lambda a, b, c: (jnp.einsum("ijk,kl->ijl", a, b), jnp.einsum("ijk,kl,il->j", a, b, c),
                                        jnp.einsum("ijk->", a), jnp.einsum("ijk,ijk->ik", a, a),
                                        jnp.einsum("i,j->ij", c[0], c[1]),
                                        jnp.einsum("bij,bjk->bik", a, a.transpose(0, 2, 1)),
                                        jnp.einsum("...k,kl->...l", a, b),
                                        jnp.einsum("ii->i", b[:5, :5]), jnp.einsum("ii", b[:5, :5]),
                                        jnp.tensordot(a, b, axes=([2], [0])), jnp.kron(b[:2, :2], c[:2, :2])), a, b, c,
                       rtol=1e-5, atol=1e-5)
    assert_matches_cpu(lambda x, y: jnp.einsum("ij,jk->ik", x, y), integers(-9, 9, (3, 4)),
                       integers(-9, 9, (4, 3), seed=1), **EXACT)


def test_jax_nn_functions_and_their_gradients():
    z = normal(4, 9, scale=3)
    assert_matches_cpu(lambda z: (jax.nn.softmax(z), jax.nn.log_softmax(z), jax.nn.logsumexp(z, 1), jax.nn.relu6(z),
                                  jax.nn.silu(z), jax.nn.log_sigmoid(z), jax.nn.elu(z), jax.nn.selu(z),
                                  jax.nn.leaky_relu(z),
                                  jax.nn.softplus(z), jax.nn.gelu(z), jax.nn.gelu(z, approximate=False),
                                  jax.nn.glu(z[:, :8]),
                                  jax.nn.standardize(z), jax.nn.mish(z), jax.nn.hard_swish(z), jax.nn.sigmoid(z)), z,
                       rtol=1e-5, atol=1e-5)
    assert_matches_cpu(jax.grad(lambda z: jnp.sum(jax.nn.relu6(z) + jax.nn.silu(z) + jax.nn.log_sigmoid(z)
                                                  + jax.nn.gelu(z) + jax.nn.logsumexp(z, 1, keepdims=True))), z,
                       rtol=1e-5, atol=1e-5)
    q, k, v = (normal(2, 7, 4, 8, seed=s) for s in range(3))
    assert_matches_cpu(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True), q, k, v, rtol=1e-4,
                       atol=1e-5)
    x = normal(50)
    assert_matches_cpu(lambda x: (jax.scipy.special.erf(x), jax.lax.lgamma(jnp.abs(x) + 0.1),
                                  jax.lax.digamma(jnp.abs(x) + 0.1),
                                  jax.scipy.special.erfinv(jnp.tanh(x)), jnp.expm1(x), jnp.log1p(jnp.abs(x)),
                                  jnp.cbrt(x)),
                       x, rtol=1e-4, atol=1e-5)   # polynomial approximations, evaluated in another order


# --- jax.random ---------------------------------------------------------------------------------

def test_random_distributions():
    def sample(key):
        k = jax.random.split(key, 8)
        return dict(normal=jax.random.normal(k[0], (5, 7)), uniform=jax.random.uniform(k[1], (1023,), minval=-2, maxval=3),
                    categorical=jax.random.categorical(k[2], jnp.log(jnp.array([0.1, 0.2, 0.7])), shape=(50,)),
                    bernoulli=jax.random.bernoulli(k[3], 0.3, (64,)), permutation=jax.random.permutation(k[4], 20),
                    choice=jax.random.choice(k[5], 10, (6,), replace=False),
                    weighted=jax.random.choice(k[6], 5, (20,), p=jnp.array([0.1, 0.2, 0.3, 0.2, 0.2])),
                    randint=jax.random.randint(k[7], (33,), -5, 17), half=jax.random.normal(k[0], (9,), jnp.float16),
                    folded=jax.random.normal(jax.random.fold_in(key, 7), (3,)))
    # The same random bits; normal's erfinv polynomial may round its last bit differently. Integer
    # samples (categorical, permutation, choice, randint) differ by at least 1 if the bits do.
    assert_matches_cpu(sample, jax.random.key(42), rtol=1e-6, atol=1e-6)
    assert_matches_cpu(lambda k: (jax.random.bits(k, (4,)), jax.random.split(k, 3)), jax.random.PRNGKey(0), **EXACT)
    assert_matches_cpu(lambda k: jax.vmap(lambda k: jax.random.uniform(k, (3,)))(jax.random.split(k, 5)),
                       jax.random.key(1), rtol=1e-6, atol=1e-6)


def test_random_samplers_with_loops_and_transcendentals():
    def sample(key):
        k = jax.random.split(key, 4)
        return (jax.random.gamma(k[0], 2.0, (20,)), jax.random.poisson(k[1], 3.0, (20,)),
                jax.random.truncated_normal(k[2], -1.0, 1.0, (40,)), jax.random.orthogonal(k[3], 4))
    assert_matches_cpu(sample, jax.random.key(3), rtol=1e-5, atol=1e-5)   # rejection loops on log/exp of the same bits


# --- sizes: 1M elements, empty, tiny, odd ------------------------------------------------------------

def test_large_arrays():
    x = normal(1 << 20)
    # sums of 1M f32 in different orders differ in the last bits of a ~1e3 total
    assert_matches_cpu(lambda x: (jnp.tanh(x) * 2 + 1, jnp.sum(x), jnp.max(x), jnp.argmax(x), jax.lax.top_k(x, 10)), x,
                       rtol=1e-5, atol=1e-3)
    assert_matches_cpu(lambda x: x.reshape(1024, 1024) @ x.reshape(1024, 1024)[:, :7], x, rtol=1e-4, atol=1e-3)
    assert_matches_cpu(lambda x: jax.lax.scan(lambda c, _: (jnp.sin(c) * 0.9, c[:3]), x, None, length=8), x,
                       rtol=1e-5, atol=1e-5)


def test_zero_size_tiny_and_odd_shapes():
    z = np.zeros((0, 5), np.float32)
    assert_matches_cpu(lambda z: (z.sum(0), z.sum(), z @ np.ones((5, 2), np.float32), jnp.sort(z, 0), jnp.cumsum(z, 0),
                                  z.max(initial=-1.0), jnp.concatenate([z, z]), z.mean(1), z.mean(0), jax.nn.softmax(z),
                                  jnp.argsort(z, 0)), z, rtol=1e-5, atol=1e-5)
    assert_matches_cpu(lambda z: jax.lax.scan(lambda c, x: (c + x.sum(), x), 0.0, z), z, rtol=1e-5, atol=1e-5)
    assert_matches_cpu(lambda a, b: a @ b, np.zeros((3, 0), np.float32), np.zeros((0, 4), np.float32),
                       rtol=1e-5, atol=1e-5)
    assert_matches_cpu(lambda a, b: (a + b, a * b, jnp.sin(a), jnp.where(a > b, a, b)), np.float32(3), np.float32(4),
                       rtol=1e-5, atol=1e-5)
    assert_matches_cpu(lambda x: (x.sum(), x @ x.T, jax.nn.softmax(x), jnp.linalg.inv(x)), normal(1, 1),
                       rtol=1e-5, atol=1e-5)
    assert_matches_cpu(lambda a, b: (a @ b, jnp.sort(a, 1), jnp.cumsum(a, 0), jnp.transpose(a)[::3]), normal(7, 1023),
                       normal(1023, 1, seed=1), rtol=1e-4, atol=1e-4)


def test_numpy_api_assortment():
    a = normal(6, 7)
    assert_matches_cpu(lambda a: (jnp.roll(a, 3, 1), jnp.tile(a, (2, 1)), jnp.repeat(a, 2, 0), jnp.diff(a, axis=1),
                                  jnp.triu(a),
                                  jnp.flip(a), jnp.rot90(a), jnp.pad(a, 2, mode="reflect"), jnp.pad(a, 2, mode="wrap"),
                                  jnp.interp(a, jnp.linspace(-2, 2, 5), jnp.arange(5.0)), jnp.convolve(a[0], a[1]),
                                  jnp.cov(a), jnp.corrcoef(a), jnp.cross(a[:, :3], a[:, 3:6]), jnp.round(a, 2),
                                  jnp.fmod(a, 0.3),
                                  jnp.nextafter(a, 0), jnp.frexp(a)[0], jnp.ldexp(a, 2), jnp.spacing(a)), a,
                       rtol=1e-5, atol=1e-5)
    assert_matches_cpu(lambda x: (jax.image.resize(x, (2, 13, 9, 3), "bilinear"),
                                  jax.image.resize(x, (2, 10, 10, 3), "cubic")),
                       normal(2, 6, 5, 3), rtol=1e-4, atol=1e-5)
    assert_matches_cpu(lambda x: jax.lax.associative_scan(lambda a, b: (a[0] * b[0], a[1] * b[0] + b[1]), (x[0], x[1])),
                       normal(2, 33, scale=0.5), rtol=1e-5, atol=1e-5)
    assert_matches_cpu(lambda x: jax.lax.map(lambda r: jnp.sort(r) * r.sum(), x, batch_size=3), normal(10, 5),
                       rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n", [9, 200_000], ids=lambda n: f"n{n}")
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=lambda d: np.dtype(d).name)
def test_signed_zeros_keep_their_sign(dtype, n):
    """sign(-0.0) is -0.0 (XLA), so are arcsinh(-0.0) and i1e(-0.0), whose
    decompositions multiply by sign(x): seen through 1/x. Compared bit for
    bit with the CPU's (sign), and as 1/x (the others)."""
    x = np.resize(np.array([-0.0, 0.0, -1e-3, 2.5, -np.inf, np.nan, -7, 1e-4, -0.0], dtype), n)
    assert_matches_cpu(jnp.sign, x, exact="bits")
    got = assert_matches_cpu(lambda a: (1 / jnp.sign(a), 1 / jnp.arcsinh(a), 1 / jax.scipy.special.i1e(a)), x,
                             rtol=2e-3, atol=0)
    assert np.isneginf(got[1][0]) and np.isneginf(got[2][0])


@pytest.mark.parametrize("n", [9, 4096, 300_000], ids=lambda n: f"n{n}")
def test_square_root_as_a_power_of_one_half(ipu, n):
    """x ** 0.5 is pow, not sqrt: pow(-inf, 0.5) = +inf and pow(-0.0, 0.5) =
    +0.0 (numpy's float32 loop turns a scalar 0.5 into sqrt: NaN, -0.0).
    Equal to the CPU's, zeros' signs included, with the exponent a literal, a scalar
    argument, a row broadcast along columns, and an array."""
    x = np.resize(np.array([-np.inf, -0.0, 0.0, 4.0, np.inf, np.nan, -2.0, 1e-30, 3e38], np.float32), n)
    half = np.float32(0.5)
    def f(a, p, rows, full):
        return (a ** 0.5, jax.lax.pow(a, p), jax.lax.pow(a.reshape(-1, 1), jnp.broadcast_to(rows, (n, 1))),
                jax.lax.pow(a, full))
    args = x, half, np.full((1, 1), half), np.full(n, half)
    # Its own comparison: values exact and zeros' signs as the CPU's, but a
    # NaN's sign free (assert_matches_cpu's exact="bits" would compare it).
    for g, w in zip(run_on(ipu, f, *args), on_cpu(f, *args), strict=True):
        g, w = g.reshape(-1), w.reshape(-1)
        np.testing.assert_array_equal(g, w)                        # NaNs where the CPU's are (any sign)
        np.testing.assert_array_equal(np.signbit(g[~np.isnan(g)]), np.signbit(w[~np.isnan(w)]))


# --- what the IPU does not have: clear errors at the user's line --------------------------------

def _error_of(f, *args, options=None) -> str:
    """The error of f's compile (with these compiler options) or run."""
    args = jax.device_put(args, jax.devices("ipu")[0])
    with pytest.raises(Exception) as info:
        jax.block_until_ready(jax.jit(f).lower(*args).compile(compiler_options=options or {})(*args))
    return str(info.value)


def _line_of(text: str, test=None) -> int:
    import inspect
    lines, first = inspect.getsourcelines(test or test_fft_and_complex_are_refused_at_the_users_line)
    return first + next(i for i, line in enumerate(lines) if text in line)


def test_fft_and_complex_are_refused_at_the_users_line():
    """Where a program asks for native types only (complex64 is emulated
    by default)."""
    native = {"emulate_types": False}

    def spectrum(x):
        return jnp.abs(jnp.fft.rfft(x))          # fft here
    message = _error_of(spectrum, normal(16), options=native)
    assert "stablehlo.fft" in message and f"test_models_and_training.py:{_line_of('# fft here')}:" in message
    assert "complex" in message and "emulate_types" in message

    def rotate(x):
        return (x * 1j).real                      # complex constant here
    message = _error_of(rotate, normal(4), options=native)
    # The complex constant is hoisted with the jit call's location; its reader names this line.
    assert re.search(rf"test_models_and_training.py:{_line_of('# complex constant here')}:", message), message
    assert "complex<f32>" in message and "use float32" in message


def test_keyless_rng_and_narrow_types_are_refused_with_what_to_do():
    message = _error_of(lambda x: jax.lax.rng_uniform(0.0, 1.0, (4,)) + x, normal(4))    # rng here
    assert "stablehlo.rng" in message and "jax.random" in message and "i64" not in message, message
    line = _line_of('# rng here', test_keyless_rng_and_narrow_types_are_refused_with_what_to_do)
    assert f"test_models_and_training.py:{line}:" in message, message
    for narrow in (jnp.float8_e4m3fn, jnp.int4):
        message = _error_of(lambda x, narrow=narrow: x.astype(narrow).astype(jnp.float32), normal(4))
        assert "is not supported" in message and "Use float32" in message and "f16" in message, message


def test_float64_is_refused_unless_opted_in():
    with jax.enable_x64(True):
        message = _error_of(lambda x: x.astype(jnp.float32) + jnp.float64(0.5) * jnp.arange(4.0), normal(4))
    assert "the IPU has no f64 type" in message and "JAX_IPU_F64_AS_F32=1" in message
    assert "test_models_and_training.py:" in message
