"""Differential fuzzing of sharded programs: random JAX programs over a
random mesh of 2-8 devices, run on the IPUs and on as many XLA:CPU devices
with the same mesh, the same input shardings and the same constraints.

    JAX_IPU_DEVICE_COUNT=8 JAX_NUM_CPU_DEVICES=8 python tests/fuzz/sharded.py --programs 500 --seed 0

A program is Python source (printed as a reproducer when it differs):
inputs placed with random NamedShardings, one op per line (element-wise,
einsum, reductions, layout ops, indexing, scatters, sorts, cumulative sums,
loops and conditionals), `with_sharding_constraint` between ops, shard_map
blocks (full or partly manual, check_vma on or off) naming collectives
(psum, pmax, all_gather, psum_scatter, ppermute, all_to_all, axis_index),
random out_shardings, and sometimes the gradient of the whole program.

Comparison: same shapes and dtypes; integers equal; floats within
RTOL * (|cpu| + scale) (partial sums over devices are added in other
orders on the two backends); the shardings of the results equal where the
program names them. Ops whose result jumps with a rounding (comparisons,
argmax, integer casts) only read values both backends compute exactly.
The generator only writes programs XLA:CPU accepts and whose meaning does
not depend on the device a replicated value is read from."""
from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
import time
import traceback

os.environ.setdefault("JAX_IPU_DEVICE_COUNT", "8")
os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P

RTOL = 1e-4
MESHES = [(2,), (4,), (8,), (2, 2), (2, 4), (4, 2), (2, 2, 2)]
NAMES = ("x", "y", "z")
DIMS = (2, 4, 8, 16)


@dataclasses.dataclass
class Var:
    shape: tuple
    dtype: str            # "f" float32 or "i" int32
    exact: bool = True    # both backends compute it bit for bit
    vary: frozenset = frozenset()   # inside a shard_map: the manual axes it varies over


@dataclasses.dataclass
class Program:
    mesh_shape: tuple
    inputs: dict          # name -> np.ndarray
    in_specs: dict        # name -> PartitionSpec
    lines: list           # source lines of f's body
    outputs: list
    out_specs: list | None
    grad: bool
    helpers: list         # source of the shard_map bodies
    sources: dict = dataclasses.field(default_factory=dict)   # name -> expression making the input
    seed: int = 0

    def source(self, plain: bool = False) -> str:
        """plain: with_sharding_constraint left out (the values are the same)."""
        head = "".join(self.helpers)
        lines = [re.sub(r"jax\.lax\.with_sharding_constraint\((\w+), .*\)$", r"\1", line) if plain else line
                 for line in self.lines]
        body = "".join(f"    {line}\n" for line in lines)
        f = f"def f({', '.join(self.inputs)}):\n{body}    return ({''.join(o + ', ' for o in self.outputs)})\n"
        if self.grad:
            floats = [n for n, a in self.inputs.items() if a.dtype.kind == "f"]
            f += (f"\n_f = f\ndef f({', '.join(self.inputs)}):\n"
                  f"    def loss({', '.join(floats)}):\n"
                  f"        outs = _f({', '.join(self.inputs)})\n"
                  f"        return sum((jnp.sum(o * o) for o in outs if o.dtype == jnp.float32), jnp.float32(0))\n"
                  f"    return jax.value_and_grad(loss, argnums=tuple(range({len(floats)})))"
                  f"({', '.join(floats)})\n")
        return head + f

    def reproducer(self) -> str:
        inputs = ",\n    ".join(f"{n}={self.sources[n]}" for n in self.inputs)
        specs = ", ".join(f"{n}={s!r}" for n, s in self.in_specs.items())
        return (f"# mesh {self.mesh_shape} over the first devices of each platform\n"
                "import jax, jax.numpy as jnp, numpy as np\nfrom jax import lax\n"
                "from jax.sharding import Mesh, NamedSharding, PartitionSpec as P\n"
                f"{self.source()}\ninputs = dict({inputs})\nin_specs = dict({specs})\n"
                f"out_specs = {self.out_specs!r}\n\n"
                "for platform in ('cpu', 'ipu'):\n"
                f"    mesh = Mesh(np.array(jax.devices(platform)[:{int(np.prod(self.mesh_shape))}]).reshape("
                f"{self.mesh_shape}), {NAMES[:len(self.mesh_shape)]})\n"
                "    args = [jax.device_put(a, NamedSharding(mesh, in_specs[k])) for k, a in inputs.items()]\n"
                "    kw = {} if out_specs is None else dict(out_shardings=tuple(NamedSharding(mesh, s) for s in "
                "out_specs))\n"
                "    print(platform, jax.jit(f, **kw)(*args))\n")


class Gen:
    def __init__(self, rng: np.random.Generator):
        self.rng = rng
        self.mesh_shape = MESHES[rng.integers(len(MESHES))]
        self.axes = NAMES[:len(self.mesh_shape)]
        self.size = dict(zip(self.axes, self.mesh_shape, strict=False))
        self.vars: dict[str, Var] = {}
        self.inputs: dict = {}
        self.in_specs: dict = {}
        self.sources: dict = {}       # name -> the expression making its value
        self.lines: list = []
        self.helpers: list = []
        self.count = 0

    def name(self) -> str:
        self.count += 1
        return f"v{self.count}"

    def pick(self, cond=lambda v: True):
        names = [n for n, v in self.vars.items() if cond(v)]
        return names[self.rng.integers(len(names))] if names else None

    def shape(self, rank=None) -> tuple:
        rank = int(self.rng.integers(1, 4)) if rank is None else rank
        return tuple(int(self.rng.choice(DIMS)) for _ in range(rank))

    def spec(self, shape, axes=None, allow_empty=True) -> P:
        """A random PartitionSpec of `shape` over `axes` (default all)."""
        axes = list(self.axes if axes is None else axes)
        self.rng.shuffle(axes)
        dims = [None] * len(shape)
        for a in axes:
            if self.rng.random() < (0.35 if allow_empty else 0.7):
                continue
            d = int(self.rng.integers(len(shape))) if shape else None
            if d is None:
                continue
            now = dims[d] or ()
            if shape[d] % (int(np.prod([self.size[b] for b in now])) * self.size[a]) == 0:
                dims[d] = now + (a,)
        return P(*[None if not d else d[0] if len(d) == 1 else d for d in dims])

    def input(self, shape, dtype="f", index_range=None) -> str:
        n = self.name()
        seed = int(self.rng.integers(1 << 30))
        if dtype == "f":
            source = f"np.random.default_rng({seed}).standard_normal({tuple(shape)}).astype(np.float32)"
        else:
            source = f"np.random.default_rng({seed}).integers(0, {index_range or 8}, {tuple(shape)}).astype(np.int32)"
        self.inputs[n] = eval(source, {"np": np})
        self.sources[n] = source
        self.in_specs[n] = self.spec(shape)
        self.vars[n] = Var(tuple(shape), dtype)
        return n

    def add(self, expr: str, shape, dtype="f", exact=False, vary=frozenset()) -> str:
        n = self.name()
        self.lines.append(f"{n} = {expr}")
        self.vars[n] = Var(tuple(shape), dtype, exact, vary)
        return n

    # -- op families --
    def unary(self):
        n = self.pick(lambda v: v.dtype == "f")
        if n is None:
            return None
        v = self.vars[n]
        fn = ["jnp.tanh", "jnp.sin", "jnp.exp(-jnp.abs({}))", "jnp.abs", "-", "jnp.sqrt(jnp.abs({}) + 1)"][
            self.rng.integers(6)]
        expr = fn.format(n) if "{}" in fn else f"{fn}({n})"
        return self.add(expr, v.shape, exact=v.exact and fn in ("jnp.abs", "-"))

    def binary(self):
        n = self.pick()
        v = self.vars[n]
        other = self.pick(lambda w: w.shape == v.shape and w.dtype == v.dtype)
        op = ["+", "-", "*", "jnp.maximum", "jnp.minimum"][self.rng.integers(5)]
        expr = f"{op}({n}, {other})" if op.startswith("jnp") else f"{n} {op} {other}"
        exact = v.exact and self.vars[other].exact and (op.startswith("jnp") or v.dtype == "i")
        if v.dtype == "f" and self.rng.random() < 0.2 and v.exact and self.vars[other].exact:
            return self.add(f"jnp.where({n} > {other}, {n}, 2.0 * {other})", v.shape, exact=False)
        return self.add(expr, v.shape, v.dtype, exact)

    def cast(self):
        n = self.pick(lambda v: v.exact)
        v = self.vars[n]
        if v.dtype == "f":
            return self.add(f"jnp.floor({n} * 4).astype(jnp.int32)", v.shape, "i", True)
        return self.add(f"{n}.astype(jnp.float32) * 0.5", v.shape, "f", True)

    def dot(self):
        a = self.pick(lambda v: v.dtype == "f")
        if a is None:
            return None
        va = self.vars[a]
        r = len(va.shape)
        form = self.rng.integers(4)
        if form == 0 or r == 1:       # contract the last dimension with a new matrix
            k, n = va.shape[-1], int(self.rng.choice(DIMS))
            b = self.input((k, n))
            return self.add(f"{a} @ {b}", va.shape[:-1] + (n,))
        if form == 1:                 # contract the first dimension
            n = int(self.rng.choice(DIMS))
            b = self.input((va.shape[0], n))
            letters = "abc"[:r]
            return self.add(f"jnp.einsum('{letters},{letters[0]}z->{letters[1:]}z', {a}, {b})",
                            va.shape[1:] + (n,))
        if form == 2 and r == 3:      # batched
            n = int(self.rng.choice(DIMS))
            b = self.input((va.shape[0], va.shape[2], n))
            return self.add(f"jnp.einsum('bij,bjk->bik', {a}, {b})", (va.shape[0], va.shape[1], n))
        b = self.pick(lambda v: v.dtype == "f" and v.shape == va.shape and r <= 2)
        if b is None:
            return None
        letters = "ab"[:r]
        return self.add(f"jnp.einsum('{letters},{letters}->', {a}, {b})", ())

    def reduce(self):
        n = self.pick(lambda v: len(v.shape) >= 1)
        if n is None:
            return None
        v = self.vars[n]
        r = len(v.shape)
        axes = tuple(sorted(int(a) for a in self.rng.choice(r, int(self.rng.integers(1, r + 1)), replace=False)))
        keep = bool(self.rng.random() < 0.3)
        shape = tuple(1 if d in axes else s for d, s in enumerate(v.shape)) if keep else \
            tuple(s for d, s in enumerate(v.shape) if d not in axes)
        op = ["jnp.sum", "jnp.max", "jnp.min", "jnp.mean", "jnp.prod"][self.rng.integers(5 if v.dtype == "f" else 3)]
        if op == "jnp.prod":
            return self.add(f"jnp.prod(jnp.tanh({n}) * 0.5 + 1.0, axis={axes}, keepdims={keep})", shape)
        if op in ("jnp.max", "jnp.min") and v.exact and self.rng.random() < 0.3 and r >= 1:
            d = axes[0]
            arg = "jnp.argmax" if op == "jnp.max" else "jnp.argmin"
            return self.add(f"{arg}({n}, axis={d})", tuple(s for i, s in enumerate(v.shape) if i != d), "i", True)
        exact = v.exact and op in ("jnp.max", "jnp.min") or v.dtype == "i"
        return self.add(f"{op}({n}, axis={axes}, keepdims={keep})", shape, v.dtype, exact)

    def layout(self):
        n = self.pick(lambda v: len(v.shape) >= 1)
        if n is None:
            return None
        v = self.vars[n]
        r = len(v.shape)
        form = self.rng.integers(8)
        if form == 0:
            perm = tuple(int(i) for i in self.rng.permutation(r))
            return self.add(f"jnp.transpose({n}, {perm})", tuple(v.shape[i] for i in perm), v.dtype, v.exact)
        if form == 1 and r >= 2:      # merge two neighbours
            d = int(self.rng.integers(r - 1))
            shape = v.shape[:d] + (v.shape[d] * v.shape[d + 1],) + v.shape[d + 2:]
            return self.add(f"{n}.reshape({shape})", shape, v.dtype, v.exact)
        if form == 2:                 # split one
            d = int(self.rng.integers(r))
            if v.shape[d] < 4:
                return None
            shape = v.shape[:d] + (2, v.shape[d] // 2) + v.shape[d + 1:]
            return self.add(f"{n}.reshape({shape})", shape, v.dtype, v.exact)
        if form == 3 and r < 3:       # broadcast a new leading dimension
            k = int(self.rng.choice((2, 4, 8)))
            return self.add(f"jnp.broadcast_to({n}[None], {(k,) + v.shape})", (k,) + v.shape, v.dtype, v.exact)
        if form == 4:
            d = int(self.rng.integers(r))
            other = self.pick(lambda w: w.dtype == v.dtype and len(w.shape) == r and all(
                a == b for i, (a, b) in enumerate(zip(w.shape, v.shape, strict=False)) if i != d))
            shape = v.shape[:d] + (v.shape[d] + self.vars[other].shape[d],) + v.shape[d + 1:]
            return self.add(f"jnp.concatenate([{n}, {other}], axis={d})", shape, v.dtype,
                            v.exact and self.vars[other].exact)
        if form == 5:
            d = int(self.rng.integers(r))
            lo = int(self.rng.integers(0, v.shape[d]))
            hi = int(self.rng.integers(lo + 1, v.shape[d] + 1))
            index = ", ".join([":"] * d + [f"{lo}:{hi}"])
            return self.add(f"{n}[{index}]", v.shape[:d] + (hi - lo,) + v.shape[d + 1:], v.dtype, v.exact)
        if form == 6:
            d = int(self.rng.integers(r))
            return self.add(f"jnp.flip({n}, axis={d})", v.shape, v.dtype, v.exact)
        d = int(self.rng.integers(r))
        pads = [(0, 0)] * r
        pads[d] = (int(self.rng.integers(0, 3)), int(self.rng.integers(0, 3)))
        shape = tuple(s + sum(pads[i]) for i, s in enumerate(v.shape))
        return self.add(f"jnp.pad({n}, {pads})", shape, v.dtype, v.exact)

    def indexing(self):
        n = self.pick(lambda v: len(v.shape) >= 1)
        if n is None:
            return None
        v = self.vars[n]
        r = len(v.shape)
        d = int(self.rng.integers(r))
        form = self.rng.integers(5)
        if form == 0:                 # take with an index array
            k = int(self.rng.choice((2, 4, 8)))
            idx = self.input((k,), "i", v.shape[d])
            return self.add(f"jnp.take({n}, {idx}, axis={d})", v.shape[:d] + (k,) + v.shape[d + 1:], v.dtype, v.exact)
        if form == 1:                 # take_along_axis
            idx = self.input(v.shape, "i", v.shape[d])
            return self.add(f"jnp.take_along_axis({n}, {idx}, axis={d})", v.shape, v.dtype, v.exact)
        if form == 2:                 # scatter-add rows
            k = int(self.rng.choice((2, 4)))
            idx = self.input((k,), "i", v.shape[0])
            upd = self.input((k,) + v.shape[1:], v.dtype)
            how = "add" if self.rng.random() < 0.6 else "max"
            return self.add(f"{n}.at[{idx}].{how}({upd})", v.shape, v.dtype, v.exact and how == "max")
        if form == 3:                 # dynamic slice
            i = self.input((), "i", v.shape[d])
            size = int(self.rng.integers(1, v.shape[d] + 1))
            return self.add(f"lax.dynamic_slice_in_dim({n}, {i}, {size}, axis={d})",
                            v.shape[:d] + (size,) + v.shape[d + 1:], v.dtype, v.exact)
        i = self.input((), "i", v.shape[d])
        size = int(self.rng.integers(1, v.shape[d] + 1))
        upd = self.input(v.shape[:d] + (size,) + v.shape[d + 1:], v.dtype)
        return self.add(f"lax.dynamic_update_slice_in_dim({n}, {upd}, {i}, axis={d})", v.shape, v.dtype, v.exact)

    def scan_like(self):
        n = self.pick(lambda v: len(v.shape) >= 1)
        if n is None:
            return None
        v = self.vars[n]
        d = int(self.rng.integers(len(v.shape)))
        form = self.rng.integers(3)
        if form == 0:
            return self.add(f"jnp.cumsum({n}, axis={d})", v.shape, v.dtype, v.dtype == "i")
        if form == 1:
            return self.add(f"jnp.sort({n}, axis={d})", v.shape, v.dtype, v.exact)
        if v.dtype != "f":
            return None
        return self.add(f"jnp.cumsum({n}[..., ::-1], axis=-1) * 0.5", v.shape, "f")

    def control(self):
        n = self.pick(lambda v: v.dtype == "f")
        if n is None:
            return None
        v = self.vars[n]
        if self.rng.random() < 0.5:
            other = self.pick(lambda w: w.shape == v.shape and w.dtype == "f")
            return self.add(f"lax.fori_loop(0, 3, lambda i, c: jnp.tanh(c * 0.5 + {other}) + i, {n})", v.shape)
        p = self.pick(lambda w: w.exact)
        cond = f"jnp.sum({p}) > 0"
        return self.add(f"lax.cond({cond}, lambda a: a * 2.0, lambda a: jnp.sin(a), {n})", v.shape)

    def accumulate(self):
        """Gradient accumulation's shape: a loop adding products of split
        values into a carried sum."""
        a = self.pick(lambda v: v.dtype == "f" and len(v.shape) == 2)
        if a is None:
            return None
        va = self.vars[a]
        b = self.input((va.shape[0], int(self.rng.choice(DIMS))))
        n = self.vars[b].shape[1]
        init = "jnp.zeros" if self.rng.random() < 0.5 else "jnp.ones"
        return self.add(f"lax.fori_loop(0, 3, lambda i, c: c + jnp.tanh({a}.T * (i + 1.0)) @ {b}, "
                        f"{init}(({va.shape[1]}, {n}), jnp.float32))", (va.shape[1], n))

    def constraint(self):
        n = self.pick()
        v = self.vars[n]
        return self.add(f"jax.lax.with_sharding_constraint({n}, NamedSharding(mesh, {self.spec(v.shape)!r}))",
                        v.shape, v.dtype, v.exact)

    def shard_map(self):
        """A shard_map block over all or some mesh axes, its body made of
        element-wise ops and collectives over its manual axes."""
        manual = list(self.axes)
        if len(manual) > 1 and self.rng.random() < 0.4:
            k = int(self.rng.integers(1, len(manual)))
            manual = sorted(self.rng.choice(manual, k, replace=False).tolist(), key=self.axes.index)
        partial = len(manual) < len(self.axes)
        check = bool(self.rng.random() < 0.5)
        args = []
        for _ in range(int(self.rng.integers(1, 3))):
            n = self.pick(lambda v: len(v.shape) >= 1 and v.dtype == "f")
            if n is None:
                return None
            args.append(n)
        args = list(dict.fromkeys(args))
        specs = [self.spec(self.vars[a].shape, manual) for a in args]
        body_vars = {}
        for a, s in zip(args, specs, strict=False):
            local = list(self.vars[a].shape)
            vary = set()
            for d, axes in enumerate(s):
                for ax in ((axes,) if isinstance(axes, str) else axes or ()):
                    local[d] //= self.size[ax]
                    vary.add(ax)
            body_vars[a] = Var(tuple(local), "f", self.vars[a].exact, frozenset(vary))
        fn = f"sm{self.count + 1}"
        params = [f"a{i}" for i in range(len(args))]
        env = {p: body_vars[a] for p, a in zip(params, args, strict=False)}
        body = []
        count = 0

        def emit(expr, var):
            nonlocal count
            count += 1
            name = f"b{count}"
            body.append(f"    {name} = {expr}\n")
            env[name] = var
            return name
        for _ in range(int(self.rng.integers(1, 4))):
            names = list(env)
            x = names[self.rng.integers(len(names))]
            xv = env[x]
            r = len(xv.shape)
            ax = manual[self.rng.integers(len(manual))]
            n_ax = self.size[ax]
            form = self.rng.integers(9)
            if form == 0:
                emit(f"lax.psum({x}, '{ax}')", Var(xv.shape, "f", False, xv.vary - {ax}))
            elif form == 1:
                emit(f"lax.pmax({x}, '{ax}')", Var(xv.shape, "f", xv.exact, xv.vary - {ax}))
            elif form == 2 and r:
                d = int(self.rng.integers(r))
                shape = xv.shape[:d] + (xv.shape[d] * n_ax,) + xv.shape[d + 1:]
                emit(f"lax.all_gather({x}, '{ax}', axis={d}, tiled=True)", Var(shape, "f", xv.exact, xv.vary - {ax}))
            elif form == 3 and r:
                ds = [d for d in range(r) if xv.shape[d] % n_ax == 0]
                if ds:
                    d = ds[self.rng.integers(len(ds))]
                    shape = xv.shape[:d] + (xv.shape[d] // n_ax,) + xv.shape[d + 1:]
                    emit(f"lax.psum_scatter({x}, '{ax}', scatter_dimension={d}, tiled=True)",
                         Var(shape, "f", False, xv.vary | {ax}))
            elif form == 4:
                shift = int(self.rng.integers(1, n_ax)) if n_ax > 1 else 0
                perm = [(i, (i + shift) % n_ax) for i in range(n_ax)]
                emit(f"lax.ppermute({x}, '{ax}', {perm})", Var(xv.shape, "f", xv.exact, xv.vary | {ax}))
            elif form == 5 and r:
                ds = [d for d in range(r) if xv.shape[d] % n_ax == 0]
                if ds:
                    s = ds[self.rng.integers(len(ds))]
                    c = int(self.rng.integers(r))
                    shape = list(xv.shape)
                    shape[s] //= n_ax
                    shape[c] *= n_ax
                    emit(f"lax.all_to_all({x}, '{ax}', {s}, {c}, tiled=True)",
                         Var(tuple(shape), "f", xv.exact, xv.vary | {ax}))
            elif form == 6:
                emit(f"{x} * 2.0 + lax.axis_index('{ax}').astype(jnp.float32)",
                     Var(xv.shape, "f", False, xv.vary | {ax}))
            elif form == 7 and not partial:
                others = [o for o, w in env.items() if w.shape == xv.shape and o != x]
                if others:
                    o = others[self.rng.integers(len(others))]
                    emit(f"{x} * {o}", Var(xv.shape, "f", False, xv.vary | env[o].vary))
            else:
                emit(f"jnp.tanh({x})", Var(xv.shape, "f", False, xv.vary))
        out = list(env)[-1]
        ov = env[out]
        # Out spec: every axis the value varies over must split a dimension.
        dims = [[] for _ in ov.shape]
        global_shape = list(ov.shape)
        for ax in manual:
            if ax not in ov.vary and (not check or self.rng.random() < 0.7):
                continue
            if not ov.shape:
                return None
            d = int(self.rng.integers(len(ov.shape)))
            dims[d].append(ax)
            global_shape[d] *= self.size[ax]
        out_spec = P(*[None if not d else d[0] if len(d) == 1 else tuple(d) for d in dims])
        if not check and any(ax not in sum(dims, []) for ax in ov.vary):
            return None
        self.helpers.append(f"def {fn}({', '.join(params)}):\n" + "".join(body) + f"    return {out}\n\n")
        names = "{" + ", ".join(repr(a) for a in manual) + "}"
        kw = f", axis_names={names}" if partial else ""
        self.lines.append(f"v{self.count + 1} = jax.shard_map({fn}, mesh=mesh, in_specs=({''.join(repr(s) + ', ' for s in specs)}), "
                          f"out_specs={out_spec!r}{kw}, check_vma={check})({', '.join(args)})")
        self.count += 1
        self.vars[f"v{self.count}"] = Var(tuple(global_shape), "f", ov.exact)
        return f"v{self.count}"


FAMILIES = [("unary", 2), ("binary", 2), ("cast", 0.7), ("dot", 2), ("reduce", 1.5), ("layout", 2.5),
            ("indexing", 1.5), ("scan_like", 1), ("control", 0.7), ("constraint", 2), ("shard_map", 1.5),
            ("accumulate", 0.7)]


def generate(seed: int, max_steps: int = 8) -> Program | None:
    rng = np.random.default_rng(seed)
    g = Gen(rng)
    for _ in range(int(rng.integers(1, 3))):
        g.input(g.shape(), "f" if rng.random() < 0.85 else "i")
    names, weights = [f for f, _ in FAMILIES], np.array([w for _, w in FAMILIES])
    steps = int(rng.integers(1, max_steps + 1))
    attempts = 0
    while len(g.lines) < steps and attempts < 60:
        attempts += 1
        family = names[rng.choice(len(names), p=weights / weights.sum())]
        mark = (dict(g.inputs), dict(g.in_specs), dict(g.vars), list(g.lines), list(g.helpers), g.count,
                dict(g.sources))
        try:
            out = getattr(g, family)()
            if out is not None:
                _check_shapes(g)
        except Exception:   # noqa: BLE001 (an op the generator could not fit to its operands)
            out = None
        if out is None:
            g.inputs, g.in_specs, g.vars, g.lines, g.helpers, g.count, g.sources = mark
    if not g.lines:
        return None
    made = [n for n in g.vars if n not in g.inputs]
    outputs = list(dict.fromkeys([made[-1]] + [made[i] for i in rng.choice(len(made), min(2, len(made)))]))
    out_specs = [g.spec(g.vars[o].shape) for o in outputs] if rng.random() < 0.6 else None
    # (pmax has no derivative in JAX.)
    grad = bool(rng.random() < 0.25) and any(a.dtype.kind == "f" for a in g.inputs.values()) and \
        not any("pmax" in h for h in g.helpers)
    return Program(g.mesh_shape, g.inputs, g.in_specs, g.lines, outputs, out_specs, grad, g.helpers, g.sources, seed)


def _check_shapes(g: Gen) -> None:
    """The program so far traced by JAX on an abstract mesh: every line
    valid, every shape as the generator thinks."""
    program = Program(g.mesh_shape, g.inputs, g.in_specs, g.lines, [n for n in g.vars if n not in g.inputs][-1:],
                      None, False, g.helpers)
    mesh = jax.sharding.AbstractMesh(g.mesh_shape, g.axes)
    f = _function(program, mesh)
    args = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=NamedSharding(mesh, g.in_specs[n]))
            for n, a in g.inputs.items()]
    out, = jax.eval_shape(f, *args)
    want = g.vars[program.outputs[0]]
    if out.shape != want.shape:
        raise ValueError(f"shape {out.shape} != {want.shape}")


def _function(program: Program, mesh, plain: bool = False):
    namespace = {"jax": jax, "jnp": jnp, "lax": lax, "np": np, "P": P, "NamedSharding": NamedSharding, "mesh": mesh}
    exec(program.source(plain), namespace)
    return namespace["f"]


def run(program: Program, platform: str, plain: bool = False):
    """The program jitted over the first devices of a platform: outputs
    (numpy) and their shardings' specs. plain: every input whole on every
    device, no constraint, no out_shardings (only shard_maps split values)."""
    n = int(np.prod(program.mesh_shape))
    devices = np.array(jax.devices(platform)[:n]).reshape(program.mesh_shape)
    mesh = Mesh(devices, NAMES[:len(program.mesh_shape)])
    f = _function(program, mesh, plain)
    args = [jax.device_put(a, NamedSharding(mesh, P() if plain else program.in_specs[k]))
            for k, a in program.inputs.items()]
    kw = {}
    if program.out_specs is not None and not program.grad and not plain:
        kw["out_shardings"] = tuple(NamedSharding(mesh, s) for s in program.out_specs)
    out = jax.jit(f, **kw)(*args)
    leaves = jax.tree.leaves(out)
    return [np.asarray(x) for x in leaves], [x.sharding.spec if hasattr(x.sharding, "spec") else None
                                             for x in leaves]


def compare(program: Program) -> tuple[str, str]:
    """(status, detail): ok | mismatch | ipu_error | cpu_error."""
    try:
        want, want_specs = run(program, "cpu")
    except Exception:   # noqa: BLE001 (a program JAX or XLA:CPU refuses)
        return "cpu_error", traceback.format_exc(limit=2)[-800:]
    try:
        got, got_specs = run(program, "ipu")
    except Exception:   # noqa: BLE001
        text = traceback.format_exc()
        status = "unsupported" if "UNIMPLEMENTED" in text else "ipu_error"
        return status, text[-1500:]
    problems = _differences(got, want)
    if problems:
        # XLA:CPU's partitioner is not always right either: a difference
        # where the IPUs agree with the program run on whole inputs (the
        # same values by definition) is XLA:CPU's.
        plain, _ = run(program, "cpu", plain=True)
        if not _differences(got, plain):
            return "xla_cpu_differs", "; ".join(problems)
    if program.out_specs is not None and not program.grad:
        for i, (gs, ws) in enumerate(zip(got_specs, want_specs, strict=False)):
            if gs != ws:
                problems.append(f"output {i}: sharding {gs} != {ws}")
    return ("mismatch", "; ".join(problems)) if problems else ("ok", "")


def _differences(got, want) -> list[str]:
    problems = []
    for i, (g, w) in enumerate(zip(got, want, strict=False)):
        if g.shape != w.shape or g.dtype != w.dtype:
            problems.append(f"output {i}: {g.dtype}{g.shape} != {w.dtype}{w.shape}")
        elif w.dtype.kind in "iub":
            if not np.array_equal(g, w):
                problems.append(f"output {i}: integers differ at {np.argwhere(g != w)[:3].tolist()}")
        else:
            scale = max(1.0, float(np.max(np.abs(w), initial=0.0)))
            bad = ~(np.abs(g - w) <= RTOL * (np.abs(w) + scale))
            if bad.any():
                problems.append(f"output {i}: max error {float(np.max(np.abs(g - w))):.3g} "
                                f"(scale {scale:.3g}) at {np.argwhere(bad)[:3].tolist()}")
    return problems


def fuzz(programs: int, seed: int = 0, log=None) -> dict:
    counts, failures = {}, []
    start = time.perf_counter()
    for s in range(seed, seed + programs):
        p = generate(s)
        if p is None:
            counts["not generated"] = counts.get("not generated", 0) + 1
            continue
        status, detail = compare(p)
        counts[status] = counts.get(status, 0) + 1
        if status in ("mismatch", "ipu_error"):
            failures.append((s, status, detail, p.reproducer()))
            if log:
                print(f"=== seed {s}: {status}: {detail}\n{p.reproducer()}", file=log, flush=True)
        elif status != "ok" and log:
            lines = [line for line in detail.strip().splitlines() if "Error" in line or "error" in line] or [detail]
            print(f"--- seed {s}: {status}: {lines[-1][:300]}", file=log, flush=True)
        jax.clear_caches()
    return {"counts": counts, "failures": failures, "seconds": time.perf_counter() - start}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--programs", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    result = fuzz(args.programs, args.seed, log=sys.stdout)
    print(f"{args.programs} programs in {result['seconds']:.0f} s: {result['counts']}")
    return 1 if result["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
