"""graph.serialize: compiled Programs saved as bytes and loaded back run to
the same bits, cycles and profile as the originals; the bytes grow with
the program, not with its elements; malformed bytes are refused with a
clear error, never run."""
from __future__ import annotations

import json
import struct
import types
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax._src.lib import _jax
from jaxlib.mlir.dialects import stablehlo

from helpers import SMALL, compile_fn, rewrite_saved_program, run_cpu
from jax_ipu.compiler import compile_module
from jax_ipu.graph import programs as p
from jax_ipu.graph import serialize
from jax_ipu.graph.validate import validate
from jax_ipu.model.engine import Engine
from jax_ipu.profile import report
from jax_ipu.stablehlo import import_module
from jax_ipu.targets import get_target

RNG = np.random.default_rng(0)


def f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def mlp_step(w1, w2, x, y):
    def loss(w1, w2):
        logits = jax.nn.relu(x @ w1) @ w2
        return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * jax.nn.one_hot(y, 4), -1))
    l, (g1, g2) = jax.value_and_grad(loss, argnums=(0, 1))(w1, w2)
    return w1 - 0.1 * g1, w2 - 0.1 * g2, l


def conv_step(w, x):
    def loss(w):
        y = lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
        y = lax.reduce_window(jax.nn.relu(y), -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
        return jnp.sum(y * y)
    return jax.value_and_grad(loss)(w)


def control_flow(x, n):
    def body(i, c):
        return lax.cond(c.sum() > 0, lambda c: c * 0.5, lambda c: c + 1.0, c)
    y = lax.fori_loop(0, 3, body, x)
    z = lax.while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, c[1] * 1.1), (0, y))[1]
    return lax.switch(n % 3, [jnp.sin, jnp.cos, jnp.tanh], z)


def indexing(x, i, idx):
    s = lax.dynamic_slice(x, (i, 0), (2, 4))
    u = lax.dynamic_update_slice(x, s * 2, (0, i))
    g = x[idx]
    sc = jnp.zeros(8).at[idx].add(x[:4, 0])
    v, k = lax.top_k(x[0], 3)
    return s, u, g, sc, jnp.sort(x, axis=1), v, k, jnp.cumsum(x, axis=0), jnp.argmax(x, axis=1)


def linalg(a, b):
    spd = a @ a.T + 4 * jnp.eye(4)
    return jnp.linalg.cholesky(spd), jnp.linalg.solve(spd, b)


PROGRAMS = {
    "mlp_step": (mlp_step, lambda: (f32(16, 32), f32(32, 4), f32(8, 16), np.arange(8, dtype=np.int32) % 4)),
    "conv_step": (conv_step, lambda: (f32(3, 3, 2, 4), f32(2, 8, 8, 2))),
    "control_flow": (control_flow, lambda: (f32(6), np.int32(4))),
    "indexing": (indexing, lambda: (f32(8, 6), np.int32(3), np.array([1, 5, 2, 1], np.int32))),
    "linalg": (linalg, lambda: (f32(4, 4), f32(4, 2))),
}


def _compile_for_ipu(f, *args):
    """f lowered for the ipu platform (linalg gets the plugin's lowerings)."""
    text = jax.jit(f).trace(*args).lower(lowering_platforms=("ipu",)).as_text(debug_info=True)
    return compile_module(import_module(_jax.mlir.serialize_portable_artifact(text, stablehlo.get_current_version())),
                          SMALL)


def _profile(program, run) -> dict:
    built = report.build(program, run, types.SimpleNamespace(id=0, target=SMALL))
    return json.loads(json.dumps(built))


@pytest.mark.parametrize("name", PROGRAMS)
def test_a_loaded_program_runs_and_reports_as_the_original(name):
    f, make_args = PROGRAMS[name]
    args = make_args()
    program = _compile_for_ipu(f, *args)
    data = serialize.dumps(program, {"note": "kept", "blob": b"\x00\x01"})
    loaded, meta = serialize.loads(data)
    assert meta == {"note": "kept", "blob": b"\x00\x01"}
    engine = Engine(SMALL)
    inputs = [np.asarray(a) for a in args]
    expected = engine.run(program, [a.copy() for a in inputs])
    first = engine.last_run
    got = engine.run(loaded, [a.copy() for a in inputs])
    again = engine.last_run
    for e, g, c in zip(expected, got, run_cpu(f, *args), strict=True):
        assert e.dtype == g.dtype and e.shape == g.shape
        np.testing.assert_array_equal(g, e)          # the same bits as the program compiled here
        np.testing.assert_allclose(g, c, rtol=2e-4, atol=2e-5)   # and right
    assert again.steps == first.steps                # the same steps, cycles and exchanged bytes
    assert _profile(loaded, again) == _profile(program, first)
    assert loaded.summary() == program.summary()
    assert loaded.cost_analysis() == program.cost_analysis()
    assert loaded.memory_stats() == program.memory_stats()
    validate(loaded, SMALL.num_tiles)                # builds and checks the vertices too
    assert serialize.dumps(loaded, meta) == data     # nothing lost: the same bytes again


def test_vertices_come_back_as_they_were():
    program = compile_fn(conv_step, *PROGRAMS["conv_step"][1]())
    loaded, _ = serialize.loads(serialize.dumps(program))
    sets = [[s.compute_set for s in p.leaves(prog.body) if isinstance(s, p.Execute)] for prog in (program, loaded)]
    assert len(sets[0]) == len(sets[1]) > 3
    for a, b in zip(*sets, strict=True):
        assert (a.name, len(a.vertices)) == (b.name, len(b.vertices))
        for u, v in zip(a.vertices, b.vertices, strict=True):
            assert (u.codelet, u.tile, u.cycles) == (v.codelet, v.tile, v.cycles)
            for ra, rb in zip(u.reads + u.writes, v.reads + v.writes, strict=True):
                assert ra.tensor.id == rb.tensor.id
                np.testing.assert_array_equal(ra.intervals, rb.intervals)
    for t, u in zip(program.tensors, loaded.tensors, strict=True):
        assert (t.name, t.shape, t.dtype) == (u.name, u.shape, u.dtype)
        np.testing.assert_array_equal(t.mapping.element_tiles(), u.mapping.element_tiles())


def test_size_grows_with_the_program_not_with_its_elements():
    ipu2 = get_target("ipu2")

    def f(x):
        return jnp.tanh(x) * 2 + x

    small = serialize.dumps(compile_fn(f, np.ones(4096, np.float32), target=ipu2))
    big = serialize.dumps(compile_fn(f, np.ones(1 << 20, np.float32), target=ipu2))
    assert len(big) < 2 * len(small) + 32 * 1024, (len(small), len(big))
    # A planned convolution's vertices name their input regions, kernel
    # blocks and partials as intervals, a run per row of each region (as
    # Poplar's vertices list theirs), and its pooling windows are patterns
    # (windows view ops), not an index per element: 8x the batch (8x the
    # elements, and more tiles in use) takes 2.3x the bytes on an ipu2
    # (93 -> 212 KB; through gather indices it was 72 -> 298 KB).
    sizes = [len(serialize.dumps(compile_fn(conv_step, f32(3, 3, 8, 8), f32(n, 16, 16, 8), target=ipu2)))
             for n in (4, 32)]
    assert sizes[1] < 3 * sizes[0], sizes


# ----------------------------------------------------------- malformed --

@pytest.fixture(scope="module")
def saved():
    return serialize.dumps(compile_fn(mlp_step, *PROGRAMS["mlp_step"][1]()))


def _load_fails(data: bytes, words: str) -> None:
    with pytest.raises(serialize.ProgramFormatError, match=words):
        serialize.loads(data)


def test_truncated_or_corrupted_bytes_are_refused(saved):
    _load_fails(saved[:-100], "checksum")
    _load_fails(saved[:30], "too few")
    flipped = bytearray(saved)
    flipped[len(saved) // 2] ^= 0x10
    _load_fails(bytes(flipped), "checksum")
    _load_fails(b"PK\x03\x04" + saved[4:], "program mark")
    _load_fails(saved[:8] + struct.pack("<I", 99) + saved[12:], "format 99")
    # Cut where the deferred section starts, or within it: refused at load
    # (the checksum covers both sections), not when the section is read.
    packed_size = serialize.PREFIX.unpack_from(saved)[4]
    _load_fails(saved[:serialize.PREFIX.size + packed_size], "checksum")
    _load_fails(saved[:serialize.PREFIX.size + packed_size + 4], "checksum")
    # An entry of the format before the deferred section (format 1) is another format.
    _load_fails(saved[:8] + struct.pack("<I", 1) + saved[12:], f"program format 1, this jax-ipu reads format {serialize.FORMAT_VERSION}")
    older = serialize.FORMAT_VERSION - 1
    _load_fails(saved[:8] + struct.pack("<I", older) + saved[12:],
                f"program format {older}, this jax-ipu reads format {serialize.FORMAT_VERSION}")


def test_another_version_is_refused(saved):
    def other(header):
        header["plugin"] = "0.0.1+0123456789abcdef"
    _load_fails(rewrite_saved_program(saved, other), "saved by jax-ipu 0.0.1")


def _first(header, kind):
    """The first object of `kind` in the header's tree."""
    def walk(node):
        if isinstance(node, dict):
            if node.get("k") == kind:
                return node
            values = node.values()
        elif isinstance(node, list):
            values = node
        else:
            return None
        for child in values:
            found = walk(child)
            if found is not None:
                return found
    return walk(header["program"])


@pytest.mark.parametrize("edit, words", [
    # Registers are ints: engine code is generated from them.
    (lambda h: _first(h, "Instruction").update(args=["0); import os; os.system('true')  #"]), "expected int"),
    (lambda h: _first(h, "Execute").update(k="Popen"), "unknown object kind 'Popen'"),
    (lambda h: _first(h, "View").update(tensor={"T": 10 ** 6}), "tensor 1000000 out of range"),
    (lambda h: _first(h, "View").update(shape=[12345]), "the view says"),
    (lambda h: _first(h, "View").update(ops=[["transpose", [0, 0]]]), "transpose"),
    (lambda h: _first(h, "MatMulPartials").pop("rhs"), "fields"),
    (lambda h: h["program"]["body"]["steps"]["L"].append(dict(_first(h, "View"))), "expected step"),
    (lambda h: _first(h, "ElementwiseChain").update(instructions=[_first(h, "Fill") or {"T": 0}]), "expected instruction"),
    (lambda h: h["tensors"]["meta"][0].__setitem__(1, "object"), "unknown element type 'object'"),
    (lambda h: h["arrays"][0]["parts"][0].__setitem__(1, 10 ** 9), "out of the data's bounds"),
    (lambda h: h["program"].update(aliases=[[99, 0]]), "out of range"),
])
def test_malformed_fields_are_refused_with_where(saved, edit, words):
    _load_fails(rewrite_saved_program(saved, edit), words)


def test_vertex_regions_are_checked_when_the_vertices_are_built(saved):
    # The vertex table's region and interval columns (tens of millions of
    # entries in a ResNet-50 step, never read to run) are decoded and
    # checked on first use: a region naming no tensor is refused then.
    def swap(h):
        table = h["vertices"]
        table["region_tensor"], table["region_block"] = table["region_block"], table["region_tensor"]
    program, _ = serialize.loads(rewrite_saved_program(saved, swap))
    with pytest.raises(serialize.ProgramFormatError, match="no tensor or interval block"):
        for step in p.leaves(program.body):
            if isinstance(step, p.Execute):
                list(step.compute_set.vertices)


def _edit_deferred_array(table: str, column: str, change):
    """deferred(header, packed) for rewrite_saved_program: the deferred
    section with the first part of a column's array (narrow-coded) replaced
    by change(values)."""
    import zlib

    def edit(header, packed):
        entry = header["arrays"][header[table][column]]
        assert entry.get("deferred") and entry["codec"] == "narrow", entry
        dtype, offset, nbytes = entry["parts"][0]
        section = bytearray(zlib.decompress(packed))
        values = np.frombuffer(section, dtype, nbytes // np.dtype(dtype).itemsize, offset).copy()
        section[offset:offset + nbytes] = change(values).astype(dtype).tobytes()
        return zlib.compress(bytes(section))
    return edit


def test_tensor_mappings_are_checked_when_first_read(saved):
    # Tile mappings (9.9M runs in a ResNet-50 step) are decoded and checked
    # when a mapping is first read (profiles, reports), not to run: one
    # naming a tile beyond the program's is refused then.
    beyond = _edit_deferred_array("tensors", "tiles", lambda tiles: np.full_like(tiles, SMALL.num_tiles))
    program, _ = serialize.loads(rewrite_saved_program(saved, lambda h: None, beyond))
    with pytest.raises(serialize.ProgramFormatError, match=f"mapped to a tile beyond {SMALL.num_tiles}"):
        for t in program.tensors:
            _ = t.mapping.tiles          # read: decoded and checked
    intact, _ = serialize.loads(saved)
    assert all(t.mapping.tiles.max(initial=0) < intact.num_tiles for t in intact.tensors)


def test_a_vertex_beyond_the_tiles_is_refused_at_load(saved):
    # The vertex table's tile column is read at load (the summary counts
    # each compute set's tiles): its range is checked then.
    _load_fails(rewrite_saved_program(saved, lambda h: h["program"].update(num_tiles=1)), "tile beyond 1")


def _deferred_steps(program) -> None:
    """Reads everything in the deferred section: vertices and mappings."""
    for step in p.leaves(program.body):
        if isinstance(step, p.Execute):
            list(step.compute_set.vertices)
    for t in program.tensors:
        _ = t.mapping.tiles


@pytest.mark.parametrize("spoil, words", [
    (lambda header, packed: packed[:len(packed) // 2], "deferred section inflates to other than"),
    (lambda header, packed: b"\x78\x01garbage" + packed[9:], "deferred section does not inflate"),
    (lambda header, packed: packed + b"\0", "deferred section inflates to other than"),
    (lambda header, packed: zlib.compress(zlib.decompress(packed)[:-64]), "inflates to other than"),
])
def test_a_spoilt_deferred_section_is_refused_when_first_read(saved, spoil, words):
    # With a good checksum (a forged entry: corruption and truncation fail
    # the checksum at load), the program loads and runs; reading the
    # deferred section raises a clear error, every time, never a crash.
    data = rewrite_saved_program(saved, lambda h: None, spoil)
    program, _ = serialize.loads(data)
    args = [np.asarray(a) for a in PROGRAMS["mlp_step"][1]()]
    expected = Engine(SMALL).run(serialize.loads(saved)[0], [a.copy() for a in args])
    for e, g in zip(expected, Engine(SMALL).run(program, [a.copy() for a in args]), strict=True):
        np.testing.assert_array_equal(g, e)
    for _ in range(2):
        with pytest.raises(serialize.ProgramFormatError, match=words):
            _deferred_steps(program)


@pytest.mark.parametrize("column, change, words", [
    ("region_tensor", lambda v: v * 0 - 1, "no tensor or interval block"),
    ("block_lengths", lambda v: v + 1, "interval columns do not match the blocks"),
    ("reads", lambda v: v + 1, "regions expected"),
    ("codelet", lambda v: v * 0 - 1, "codelet or region count out of range"),
])
def test_deferred_vertex_columns_are_checked_when_first_read(saved, column, change, words):
    program, _ = serialize.loads(rewrite_saved_program(
        saved, lambda h: None, _edit_deferred_array("vertices", column, change)))
    with pytest.raises(serialize.ProgramFormatError, match=words):
        _deferred_steps(program)


def test_deferred_arrays_are_checked_at_load_for_what_needs_no_values(saved):
    # Their entries (codec, parts, lengths) are checked at load, without
    # inflating the section.
    def shorten(h):
        h["arrays"][h["vertices"]["reads"]]["shape"] = [1]
    _load_fails(rewrite_saved_program(saved, shorten), "elements, not 1$")

    def beyond(h):
        h["arrays"][h["tensors"]["tiles"]]["parts"][0][1] = 10 ** 9
    _load_fails(rewrite_saved_program(saved, beyond), "out of the data's bounds")

    def in_body(h):
        h["arrays"][h["vertices"]["region_tensor"]]["deferred"] = False
    _load_fails(rewrite_saved_program(saved, in_body), "malformed entry")


def _count_inflations(monkeypatch) -> list:
    """What each zlib inflation of a saved program's sections was, from now on."""
    inflated = []
    original = serialize._inflate
    monkeypatch.setattr(serialize, "_inflate", lambda packed, size, what: inflated.append(what) or
                        original(packed, size, what))
    return inflated


def test_loading_inflates_only_the_body(saved, monkeypatch):
    inflated = _count_inflations(monkeypatch)
    program, _ = serialize.loads(saved)
    program.summary()
    assert inflated == ["its body"]
    _deferred_steps(program)
    assert inflated == ["its body", "its deferred section"]


def test_loading_leaves_the_garbage_collector_as_it_found_it(saved):
    # loads pauses the cyclic collector while it decodes (it makes no
    # cycles), and restores it, after a refused entry too.
    import gc
    assert gc.isenabled()
    serialize.loads(saved)
    assert gc.isenabled()
    with pytest.raises(serialize.ProgramFormatError):
        serialize.loads(saved[:-1])
    assert gc.isenabled()
    gc.disable()
    try:
        serialize.loads(saved)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_the_deferred_section_read_from_several_threads_at_once(saved, monkeypatch):
    # Profiles are made on the devices' threads: the section is inflated
    # once, and every thread reads the same columns.
    from concurrent.futures import ThreadPoolExecutor
    inflated = _count_inflations(monkeypatch)
    program, _ = serialize.loads(saved)

    def read(_):
        _deferred_steps(program)
        return [t.mapping.tiles.tolist() for t in program.tensors]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(read, range(8)))
    assert inflated == ["its body", "its deferred section"]
    intact, _ = serialize.loads(saved)
    assert all(r == [t.mapping.tiles.tolist() for t in intact.tensors] for r in results)
