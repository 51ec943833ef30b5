"""Textbook Flax models for benchmarks/models.py, written as a JAX user
writes them: flax.linen modules, optax optimisers, mixed precision as
`dtype=jnp.float16` (compute) with `param_dtype=jnp.float32` (master
weights) and a static loss scale.

- ResNet-50 (He et al. 2015, v1.5 strides as in Flax's ImageNet example):
  bottleneck blocks [3, 4, 6, 3], BatchNorm, 1000 classes, 224x224x3 NHWC.
  Besides float32 and mixed precision, float16 parameters and optimiser
  state (Graphcore's "16.16": the parameters cast to float16 after
  initialisation, so the gradients and the momentum are float16 too; the
  BatchNorm running statistics stay float32).
- BERT-base encoder: 12 layers, 768 wide, 12 heads, MLP 3072, 30,522-word
  vocabulary, learned positions, post-LayerNorm, GELU.
- A ResNet-18-style CIFAR network (basic blocks, 32 to 256 channels,
  32x32x3 images, 10 classes): the compile-time benchmarks' convolutional
  training step.
- GPT-2 small: 12 pre-LayerNorm blocks of causal nn.SelfAttention, 768 wide,
  12 heads, MLP 3072, 1024 positions, untied 50,257-word head.
"""
from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax


def _on_host(init):
    """Run a model's initialiser on XLA:CPU: initialising is not what these programs measure."""
    with jax.default_device(jax.local_devices(backend="cpu")[0]):
        return jax.jit(init)()

Dtype = Any


# ---------------------------------------------------------------- ResNet-50
class BasicBlock(nn.Module):
    features: int
    stride: int

    @nn.compact
    def __call__(self, x, train):
        norm = functools.partial(nn.BatchNorm, use_running_average=not train)
        y = nn.relu(norm()(nn.Conv(self.features, (3, 3), self.stride, use_bias=False)(x)))
        y = norm()(nn.Conv(self.features, (3, 3), use_bias=False)(y))
        if x.shape != y.shape:
            x = norm()(nn.Conv(self.features, (1, 1), self.stride, use_bias=False)(x))
        return nn.relu(x + y)


class CifarResNet18(nn.Module):
    @nn.compact
    def __call__(self, x, train):
        x = nn.relu(nn.BatchNorm(use_running_average=not train)(nn.Conv(32, (3, 3), use_bias=False)(x)))
        for features, stride in [(32, 1), (32, 1), (64, 2), (64, 1), (128, 2), (128, 1), (256, 2), (256, 1)]:
            x = BasicBlock(features, stride)(x, train)
        return nn.Dense(10)(x.mean((1, 2)))


class Bottleneck(nn.Module):
    filters: int
    strides: int = 1
    dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, x, train: bool):
        conv = functools.partial(nn.Conv, use_bias=False, dtype=self.dtype)
        norm = functools.partial(nn.BatchNorm, use_running_average=not train, momentum=0.9, epsilon=1e-5,
                                 dtype=self.dtype)
        residual = x
        y = nn.relu(norm()(conv(self.filters, (1, 1))(x)))
        y = nn.relu(norm()(conv(self.filters, (3, 3), self.strides)(y)))
        y = norm(scale_init=nn.initializers.zeros)(conv(self.filters * 4, (1, 1))(y))
        if residual.shape != y.shape:
            residual = norm()(conv(self.filters * 4, (1, 1), self.strides)(residual))
        return nn.relu(residual + y)


class ResNet50(nn.Module):
    stages: Sequence[int] = (3, 4, 6, 3)
    num_classes: int = 1000
    dtype: Dtype = jnp.float32
    remat: bool = False     # recompute each bottleneck block's activations in the backward pass
    width: int = 64         # the first stage's filters (each stage doubles them)
    # For resnet50_remat_bound_bytes: stop after this block (counting from
    # 0), not recomputed, and return its output summed (no head).
    until: int = -1

    @nn.compact
    def __call__(self, x, train: bool):
        # Recomputation (activation checkpointing) as a Flax user writes it:
        # nn.remat of the block, `train` static. The backward pass keeps only
        # each block's input and recomputes the block's activations.
        block = nn.remat(Bottleneck, static_argnums=(2,)) if self.remat else Bottleneck
        x = nn.Conv(self.width, (7, 7), (2, 2), padding=[(3, 3), (3, 3)], use_bias=False, dtype=self.dtype)(x)
        x = nn.relu(nn.BatchNorm(use_running_average=not train, momentum=0.9, dtype=self.dtype)(x))
        x = nn.max_pool(x, (3, 3), (2, 2), padding="SAME")
        k = 0
        for i, blocks in enumerate(self.stages):
            for j in range(blocks):
                last = k == self.until
                x = (Bottleneck if last else block)(self.width * 2 ** i, 2 if i > 0 and j == 0 else 1,
                                                    self.dtype)(x, train)
                if last:
                    return x.astype(jnp.float32).sum()
                k += 1
        x = jnp.mean(x, axis=(1, 2))
        return nn.Dense(self.num_classes, dtype=self.dtype)(x).astype(jnp.float32)


# ---------------------------------------------------------------- transformers
class Mlp(nn.Module):
    hidden: int
    dtype: Dtype

    @nn.compact
    def __call__(self, x):
        width = x.shape[-1]
        x = nn.gelu(nn.Dense(self.hidden, dtype=self.dtype)(x))
        return nn.Dense(width, dtype=self.dtype)(x)


class BertLayer(nn.Module):
    heads: int
    hidden: int
    dtype: Dtype

    @nn.compact
    def __call__(self, x, mask):
        a = nn.SelfAttention(self.heads, dtype=self.dtype, deterministic=True)(x, mask=mask)
        x = nn.LayerNorm(epsilon=1e-12, dtype=self.dtype)(x + a)
        return nn.LayerNorm(epsilon=1e-12, dtype=self.dtype)(x + Mlp(self.hidden, self.dtype)(x))


class BertBase(nn.Module):
    vocab: int = 30522
    layers: int = 12
    width: int = 768
    heads: int = 12
    hidden: int = 3072
    positions: int = 512
    dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, tokens):
        x = nn.Embed(self.vocab, self.width, dtype=self.dtype)(tokens)
        x = x + nn.Embed(self.positions, self.width, dtype=self.dtype)(jnp.arange(tokens.shape[1]))[None]
        x = x + nn.Embed(2, self.width, dtype=self.dtype)(jnp.zeros_like(tokens))
        x = nn.LayerNorm(epsilon=1e-12, dtype=self.dtype)(x)
        mask = nn.make_attention_mask(tokens > 0, tokens > 0)
        for _ in range(self.layers):
            x = BertLayer(self.heads, self.hidden, self.dtype)(x, mask)
        # Pooler: the [CLS] token through a tanh layer, as BERT's.
        return nn.tanh(nn.Dense(self.width, dtype=self.dtype)(x[:, 0])).astype(jnp.float32)


class Gpt2Block(nn.Module):
    heads: int
    hidden: int
    dtype: Dtype

    @nn.compact
    def __call__(self, x, mask):
        x = x + nn.SelfAttention(self.heads, dtype=self.dtype, deterministic=True)(
            nn.LayerNorm(dtype=self.dtype)(x), mask=mask)
        return x + Mlp(self.hidden, self.dtype)(nn.LayerNorm(dtype=self.dtype)(x))


class Gpt2Small(nn.Module):
    vocab: int = 50257
    layers: int = 12
    width: int = 768
    heads: int = 12
    hidden: int = 3072
    positions: int = 1024
    dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, tokens):
        x = nn.Embed(self.vocab, self.width, dtype=self.dtype)(tokens)
        x = x + nn.Embed(self.positions, self.width, dtype=self.dtype)(jnp.arange(tokens.shape[1]))[None]
        mask = nn.make_causal_mask(tokens)
        for _ in range(self.layers):
            x = Gpt2Block(self.heads, self.hidden, self.dtype)(x, mask)
        x = nn.LayerNorm(dtype=self.dtype)(x)
        return nn.Dense(self.vocab, use_bias=False, dtype=self.dtype)(x)


# ---------------------------------------------------------------- programs
LOSS_SCALE = 128.0   # static loss scale for float16 training (as Graphcore's examples use)
DTYPES = {"f32": jnp.float32, "f16": jnp.float16}


def resnet50_parts(batch: int, dtype, image: int = 224, classes: int = 1000, remat: bool = False,
                   stages: Sequence[int] = (3, 4, 6, 3), width: int = 64, param_dtype=jnp.float32):
    """What a ResNet-50 training step is made of: (loss_fn(params, stats,
    x, y) -> (scaled loss, (loss, new stats)), the optax optimiser, the loss
    scale, the initial variables, a batch x, y). With float16 compute the
    loss is scaled by LOSS_SCALE; the gradients are then of the scaled loss.
    remat: each bottleneck block under nn.remat; stages, width: bottleneck
    blocks per stage and the first stage's filters (fewer for quick runs);
    param_dtype: the parameters' type (float16: 16.16, the optimiser's
    momentum then float16 too)."""
    model = ResNet50(stages=tuple(stages), dtype=dtype, num_classes=classes, remat=remat, width=width)
    tx = optax.sgd(0.1, momentum=0.9)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, image, image, 3)).astype(np.float32)
    y = (np.arange(batch) % classes).astype(np.int32)
    variables = _on_host(lambda: model.init(jax.random.PRNGKey(0), x[:1], False))
    variables = {**variables, "params": jax.tree.map(lambda p: p.astype(param_dtype), variables["params"])}
    scale = LOSS_SCALE if dtype == jnp.float16 else 1.0

    def loss_fn(params, stats, x, y):
        logits, updates = model.apply({"params": params, "batch_stats": stats}, x.astype(dtype), True,
                                      mutable=["batch_stats"])
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
        return loss * scale, (loss, updates["batch_stats"])

    return loss_fn, tx, scale, variables, x, y


def resnet50_saved_bytes(batch: int, dtype: str, remat: bool, image: int = 224, params: str = "f32") -> int:
    """The bytes of the tensors JAX's ResNet-50 training program saves from
    its forward pass for its backward pass (jax's saved_residuals of the
    loss, the parameters themselves left out: they are arguments): what
    any plan must keep at the step's peak, the activations' lower bound."""
    loss_fn, _, _, variables, x, y = resnet50_parts(batch, DTYPES[dtype], image, remat=remat,
                                                    param_dtype=DTYPES[params])
    return _saved_bytes(loss_fn, variables, x, y)


def _saved_bytes(loss_fn, variables, x, y) -> int:
    from jax._src.ad_checkpoint import saved_residuals
    saved = saved_residuals(lambda p, s, x, y: loss_fn(p, s, x, y)[0], variables["params"],
                            variables["batch_stats"], x, y)
    return sum(int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize for a, why in saved if "argument" not in why)


def resnet50_remat_bounds(batch: int, dtype, image: int = 224, classes: int = 1000,
                          stages: Sequence[int] = (3, 4, 6, 3), width: int = 64,
                          param_dtype=jnp.float32) -> list[int]:
    """What the backward pass of ResNet-50 with each block under nn.remat
    keeps at least while it goes back through each block k: what the
    forward pass saved before block k (the stem's residuals, the earlier
    blocks' inputs) and block k's own residuals, recomputed: the saved
    residuals of the network cut after block k, that block not recomputed
    (one figure per block, then the whole network's). Their most is a lower
    bound of the backward pass's peak; resnet50_saved_bytes(remat=True)
    counts the blocks' inputs only, not the recomputed block's own.
    Traced from shapes (nothing is initialised or compiled)."""
    x = jax.ShapeDtypeStruct((batch, image, image, 3), jnp.float32)
    y = jax.ShapeDtypeStruct((batch,), jnp.int32)

    def saved(until):
        model = ResNet50(stages=tuple(stages), dtype=dtype, num_classes=classes, remat=True, width=width,
                         until=until)
        variables = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), jnp.zeros((1, image, image, 3)),
                                                      False))
        params = jax.tree.map(lambda p: jax.ShapeDtypeStruct(p.shape, param_dtype), variables["params"])

        def loss_fn(params, stats, x, y):
            out, updates = model.apply({"params": params, "batch_stats": stats}, x.astype(dtype), True,
                                       mutable=["batch_stats"])
            if until < 0:
                out = optax.softmax_cross_entropy_with_integer_labels(out, y).mean()
            return out, updates
        return _saved_bytes(loss_fn, {"params": params, "batch_stats": variables["batch_stats"]}, x, y)
    return [saved(k) for k in [*range(sum(stages)), -1]]


def remat_bound_per_image(batch: int, dtype, image: int = 224, classes: int = 1000,
                          stages: Sequence[int] = (3, 4, 6, 3), width: int = 64,
                          param_dtype=jnp.float32) -> float:
    """The most over the blocks of resnet50_remat_bounds' growth an image
    from batch 1 to `batch` (at least 2): the weights' float16 copies and
    other per-step tensors left out."""
    one, more = (resnet50_remat_bounds(n, dtype, image, classes, stages, width, param_dtype) for n in (1, batch))
    return max((b - a) / (batch - 1) for a, b in zip(one, more, strict=True))


def resnet50_train(batch: int, dtype, image: int = 224, classes: int = 1000, remat: bool = False,
                   stages: Sequence[int] = (3, 4, 6, 3), width: int = 64, param_dtype=jnp.float32,
                   momentum_host: bool = False):
    """(step, args): one SGD-momentum step of ResNet-50 on a batch, the
    parameters, batch statistics and optimiser state donated. With float16
    compute the loss is scaled and the gradients (of the parameters: float32
    master weights, or float16 ones) unscaled. Arguments as resnet50_parts.
    momentum_host: the optimiser state lives in the memory kind pinned_host
    (the caller places it there), moved to the device for the update and
    back, as JAX's offloading idioms write it (Graphcore's frameworks kept
    optimiser state in streaming memory so)."""
    loss_fn, tx, scale, variables, x, y = resnet50_parts(batch, dtype, image, classes, remat, stages, width,
                                                         param_dtype)

    def step(params, stats, opt_state, x, y):
        (_, (loss, stats)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, stats, x, y)
        grads = jax.tree.map(lambda g: g / scale, grads)
        if momentum_host:
            opt_state = jax.device_put(opt_state, jax.memory.Space.Device)
        updates, opt_state = tx.update(grads, opt_state, params)
        if momentum_host:
            opt_state = jax.device_put(opt_state, jax.memory.Space.Host)
        return optax.apply_updates(params, updates), stats, opt_state, loss

    args = (variables["params"], variables["batch_stats"], tx.init(variables["params"]), x, y)
    return jax.jit(step, donate_argnums=(0, 1, 2)), args


def cifar_resnet18_train(batch: int):
    """(step, args): one float32 SGD-momentum step of CifarResNet18, the
    parameters, batch statistics and optimiser state donated."""
    model, tx = CifarResNet18(), optax.sgd(0.1, momentum=0.9)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, 32, 32, 3)).astype(np.float32)
    y = (np.arange(batch) % 10).astype(np.int32)
    variables = _on_host(lambda: model.init(jax.random.PRNGKey(0), x[:1], False))

    def loss_fn(params, stats, x, y):
        logits, updates = model.apply({"params": params, "batch_stats": stats}, x, True, mutable=["batch_stats"])
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean(), updates["batch_stats"]

    def step(params, stats, opt_state, x, y):
        (loss, stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, stats, x, y)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), stats, opt_state, loss

    args = (variables["params"], variables["batch_stats"], tx.init(variables["params"]), x, y)
    return jax.jit(step, donate_argnums=(0, 1, 2)), args


def _tokens(batch: int, length: int, vocab: int) -> np.ndarray:
    return np.random.default_rng(0).integers(1, vocab, (batch, length)).astype(np.int32)


def transformer_infer(model: nn.Module, batch: int, length: int):
    """(forward, args): the model's forward pass on a batch of tokens, the
    parameters cast to the model's compute dtype (as one serves a model)."""
    tokens = _tokens(batch, length, model.vocab)
    params = _on_host(lambda: model.init(jax.random.PRNGKey(0), tokens[:1])["params"])
    params = jax.tree.map(lambda p: np.asarray(p).astype(model.dtype), params)
    return jax.jit(lambda params, tokens: model.apply({"params": params}, tokens)), (params, tokens)


def gpt2_train(batch: int, length: int, dtype):
    """(step, args): one AdamW step of GPT-2 small on next-token prediction,
    parameters and optimiser state donated."""
    model = Gpt2Small(dtype=dtype)
    tokens = _tokens(batch, length + 1, model.vocab)
    params = _on_host(lambda: model.init(jax.random.PRNGKey(0), tokens[:1, :-1])["params"])
    tx = optax.adamw(1e-4)
    scale = LOSS_SCALE if dtype == jnp.float16 else 1.0

    def loss_fn(params, tokens):
        logits = model.apply({"params": params}, tokens[:, :-1]).astype(jnp.float32)
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()
        return loss * scale, loss

    def step(params, opt_state, tokens):
        (_, loss), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, tokens)
        grads = jax.tree.map(lambda g: g / scale, grads)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return jax.jit(step, donate_argnums=(0, 1)), (params, tx.init(params), tokens)


# ---------------------------------------------------------------- pipeline stages
# The busiest pipeline stage of Graphcore's own BERT and GPT-2 training
# configurations (docs/models.md cites them: graphcore/examples,
# nlp/bert/pytorch/configs_pretraining.yml and nlp/gpt2/pytorch/run/*.sh):
# the stage with the most layers, its micro-batch and sequence length,
# float16 weights and compute (model.half()), float16 partials
# (enable_half_partials), a recomputation checkpoint after every layer, the
# optimiser state off chip (BERT's optimizer_state_offchip; GPT-2's
# replicated tensor sharding over replicas), the stage's matmul
# available-memory proportion (matmul_proportion), and the 1F1B stash of
# 2(S - 1 - k) + 1 stage inputs of stage k of S (as frontend/pipelining.py).
STAGES = {
    # name: (layer, layers on the stage, width, heads, MLP, micro-batch, sequence, stages S, stage k,
    #        matmul proportion)
    "bert-large-128": ("bert", 7, 1024, 16, 4096, 8, 128, 4, 1, 0.25),    # layers_per_ipu [3, 7, 7, 7]
    "bert-large-384": ("bert", 7, 1024, 16, 4096, 2, 384, 4, 1, 0.25),
    "bert-base-128": ("bert", 4, 768, 12, 3072, 32, 128, 4, 1, 0.25),     # layers_per_ipu [0, 4, 4, 4]
    "bert-base-384": ("bert", 4, 768, 12, 3072, 8, 384, 4, 1, 0.25),
    "gpt2-small": ("gpt2", 4, 768, 12, 3072, 1, 1024, 4, 1, 0.15),        # layers-per-ipu 0 4 4 4
    "gpt2-medium": ("gpt2", 4, 1024, 16, 4096, 1, 1024, 8, 5, 0.15),      # layers-per-ipu 0 3 3 3 3 4 4 4
}


class Stage(nn.Module):
    """`layers` transformer layers, each under jax.checkpoint (nn.remat):
    the backward pass keeps each layer's input and recomputes its inside,
    as Graphcore's recompute_checkpoint_every_layer."""
    layer: str
    layers: int
    heads: int
    hidden: int
    dtype: Dtype = jnp.float16

    @nn.compact
    def __call__(self, x):
        if self.layer == "bert":
            block, mask = nn.remat(BertLayer), None
        else:
            block, mask = nn.remat(Gpt2Block), nn.make_causal_mask(jnp.ones(x.shape[:2], jnp.int32))
        for _ in range(self.layers):
            x = block(self.heads, self.hidden, self.dtype)(x, mask)
        return x


def stage_parts(name: str, **shrink):
    """(stage module, stash slots, micro-batch, sequence, width) of a
    STAGES configuration; shrink overrides its fields (layers, width, heads,
    hidden, batch, length) for small-scale runs."""
    layer, layers, width, heads, hidden, batch, length, stages, k, _ = STAGES[name]
    c = dict(layers=layers, width=width, heads=heads, hidden=hidden, batch=batch, length=length) | shrink
    module = Stage(layer, c["layers"], c["heads"], c["hidden"])
    return module, 2 * (stages - 1 - k) + 1, c["batch"], c["length"], c["width"]


def _half_params(module: nn.Module, x: np.ndarray):
    """The module's parameters in float16 (Graphcore's model.half())."""
    params = _on_host(lambda: module.init(jax.random.PRNGKey(0), x[:1])["params"])
    return jax.tree.map(lambda p: np.asarray(p).astype(np.float16), params)


def stage_train(name: str, **shrink):
    """(tick, args): one steady-state 1F1B tick of a pipeline stage in
    training: the forward pass of a new micro-batch (its input stashed) and
    the backward pass of the oldest stashed one (the gradient from the next
    stage in, the layers recomputed from their checkpoints), its weight
    gradients added to the float16 accumulators. The accumulators and the
    stash are donated; the optimiser runs off chip, once per
    accumulated batch, outside this step."""
    module, slots, batch, length, width = stage_parts(name, **shrink)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, length, width)).astype(np.float16)
    params = _half_params(module, x)
    stash = rng.standard_normal((slots, batch, length, width)).astype(np.float16)
    dy = (rng.standard_normal((batch, length, width)) * 1e-3).astype(np.float16)

    def tick(params, acc, stash, x, dy):
        y = module.apply({"params": params}, x)
        _, pull = jax.vjp(lambda p, h: module.apply({"params": p}, h), params, stash[0])
        grads, dx = pull(dy)
        acc = jax.tree.map(jnp.add, acc, grads)
        stash = jnp.concatenate([stash[1:], x[None]])
        return acc, stash, y, dx

    acc = jax.tree.map(np.zeros_like, params)
    return jax.jit(tick, donate_argnums=(1, 2)), (params, acc, stash, x, dy)


def stage_saved_bytes(name: str, **shrink) -> int:
    """The bytes JAX's program keeps from the stage's forward pass for its
    backward pass (saved_residuals, the parameters and the stage input
    left out: they are arguments): with a checkpoint per layer, the layers'
    inputs."""
    from jax._src.ad_checkpoint import saved_residuals
    module, _, batch, length, width = stage_parts(name, **shrink)
    x = np.zeros((batch, length, width), np.float16)
    params = _half_params(module, x)
    saved = saved_residuals(lambda p, h: module.apply({"params": p}, h).astype(jnp.float32).sum(), params, x)
    return sum(int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize for a, why in saved if "argument" not in why)


def program(model: str, mode: str, dtype: str, batch: int, length: int = 128, image: int = 224,
            remat: bool = False, params: str = "f32", momentum_host: bool = False):
    """(jitted function, host arguments, samples per call). remat: ResNet-50's
    bottleneck blocks recomputed in the backward pass (nn.remat); params:
    ResNet-50's parameter and optimiser-state type ("f16" with dtype "f16":
    16.16); momentum_host: ResNet-50's optimiser state in pinned_host
    (resnet50_train)."""
    dt = DTYPES[dtype]
    if params != "f32" and not (model == "resnet50" and mode == "train"):
        raise SystemExit("--params: only for --model resnet50 --mode train")
    if model == "resnet50":
        if mode != "train":
            raise SystemExit("resnet50: only --mode train")
        f, args = resnet50_train(batch, dt, image, remat=remat, param_dtype=DTYPES[params],
                                 momentum_host=momentum_host)
    elif model == "bert":
        if mode != "infer":
            raise SystemExit("bert: only --mode infer")
        f, args = transformer_infer(BertBase(dtype=dt), batch, length)
    elif model in STAGES:
        if mode != "train" or dtype != "f16":
            raise SystemExit(f"{model}: a pipeline stage in training, float16 (--mode train --dtype f16)")
        f, args = stage_train(model)
        return f, args, STAGES[model][5]
    elif model == "gpt2":
        f, args = (transformer_infer(Gpt2Small(dtype=dt), batch, length) if mode == "infer"
                   else gpt2_train(batch, length, dt))
    else:
        raise SystemExit(f"unknown model {model!r}")
    if remat and not (model == "resnet50" and mode == "train"):
        raise SystemExit("--remat: only for --model resnet50 --mode train")
    return f, args, batch
