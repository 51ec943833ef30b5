"""The package's layers import one way, and no modules import each other in
a circle (docs/architecture.md).

Read from the installed package's source with `ast`: every import counts,
at module level or inside a function. An import names a module (a parent
package that `from pkg import name` reaches through is not an edge)."""
from __future__ import annotations

import ast
import importlib
import pathlib

import jax_ipu

ROOT = pathlib.Path(jax_ipu.__file__).resolve().parent

# Lowest first; a module may import its own layer or any layer below. The
# compiler and the Model share a level and never import each other, as do
# the importer and the graph.
LAYERS = [
    {"jax_ipu.errors", "jax_ipu.version", "jax_ipu.targets", "jax_ipu.ir", "jax_ipu.ir_printer",
     "jax_ipu.ops", "jax_ipu.ops_complex", "jax_ipu.config", "jax_ipu.utils"},
    {"jax_ipu.graph", "jax_ipu.stablehlo"},
    {"jax_ipu.compiler", "jax_ipu.model"},
    {"jax_ipu.profile"},
    {"jax_ipu.pjrt"},
    {"jax_ipu", "jax_ipu._plugin", "jax_ipu.cli", "jax_ipu.frontend", "jax_ipu.feeds", "jax_ipu.pipeline"},
]
# Groups on one level that must not import each other.
SIBLINGS = [("jax_ipu.compiler", "jax_ipu.model"), ("jax_ipu.graph", "jax_ipu.stablehlo")]


def _module_name(path: pathlib.Path) -> str:
    parts = ("jax_ipu",) + path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _component(module: str) -> str:
    """The layer entry a module belongs to: its longest listed prefix."""
    names = [n for layer in LAYERS for n in layer]
    found = [n for n in names if module == n or module.startswith(n + ".")]
    assert found, f"{module} is in no layer of test_layering.LAYERS: add it"
    return max(found, key=len)


def _level(module: str) -> int:
    component = _component(module)
    return next(i for i, layer in enumerate(LAYERS) if component in layer)


def _imports(module: str) -> set[str]:
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "jax_ipu")
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + ([base] if base else []))
            if base.split(".")[0] != "jax_ipu":
                continue
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.add(full if full in MODULES else base)
    return {m for m in found if m in MODULES and m != module}


GRAPH = {m: _imports(m) for m in MODULES}


def test_every_module_has_a_layer():
    for module in MODULES:
        _component(module)


def test_no_module_imports_a_layer_above_it():
    wrong = [f"{m} (layer {_level(m)}) imports {i} (layer {_level(i)})"
             for m, imported in GRAPH.items() for i in sorted(imported) if _level(i) > _level(m)]
    assert not wrong, "imports against the layers:\n" + "\n".join(wrong)


def test_siblings_do_not_import_each_other():
    wrong = [f"{m} imports {i}" for m, imported in GRAPH.items() for i in sorted(imported)
             for a, b in SIBLINGS
             if {_component(m), _component(i)} == {a, b}]
    assert not wrong, "the compiler and the Model (or the importer and the graph) meet only in " \
                      "graph.Program:\n" + "\n".join(wrong)


def _cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in GRAPH[v]:
                found.append(sorted(component))
    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    return found


def test_no_import_circles():
    assert _cycles() == []


def test_the_checks_catch_what_they_look_for(monkeypatch):
    """A circle and an upward import, planted, are found."""
    monkeypatch.setitem(GRAPH, "jax_ipu.ir", GRAPH["jax_ipu.ir"] | {"jax_ipu.ops"})
    monkeypatch.setitem(GRAPH, "jax_ipu.ops", GRAPH["jax_ipu.ops"] | {"jax_ipu.ir"})
    assert ["jax_ipu.ir", "jax_ipu.ops"] in _cycles()
    monkeypatch.setitem(GRAPH, "jax_ipu.model.engine", GRAPH["jax_ipu.model.engine"] | {"jax_ipu.compiler"})
    with __import__("pytest").raises(AssertionError, match="compiler and the Model"):
        test_siblings_do_not_import_each_other()


# ------------------------------------------------------- the kernel registry --
# (docs/architecture.md, "Adding a kernel"): every kernel is one record
# (graph/records.py) with a reference executor (model/executors/) and
# maybe a fast one (model/fast/), found through model/registry.py alone.

def _kernel_modules() -> list:
    return [importlib.import_module(m) for m in MODULES if m.startswith("jax_ipu.graph.codelets")]


def test_every_kernel_class_is_a_record_with_a_reference_executor():
    from jax_ipu.graph import codelets, records
    from jax_ipu.model import engine, registry  # noqa: F401  (loads every executor)
    attribute_types = {codelets.Instruction}           # held by kernels' fields, not kernels
    classes = {obj for module in _kernel_modules() for obj in vars(module).values()
               if isinstance(obj, type) and obj.__module__ == module.__name__} - attribute_types
    assert classes == set(records.RECORDS), "a class in graph/codelets* that is no @codelet record"
    missing = [k.__name__ for k in records.RECORDS if k not in registry.REFERENCE]
    assert not missing, f"kernels without a reference executor (model/executors/): {missing}"
    assert set(registry.FAST) <= set(records.RECORDS)
    for found in registry.FUSIONS.values():
        declared = {f.name: f for f in records.record_of(found.producer).fields}
        assert declared[found.field].stand_in, f"{found.producer.__name__}.{found.field} holds no stand-in"


def test_reference_executors_never_import_the_fast_ones():
    wrong = [f"{m} imports {i}" for m, imported in GRAPH.items() if m.startswith("jax_ipu.model.executors")
             for i in sorted(imported) if i.startswith("jax_ipu.model.fast")]
    assert not wrong, "model/executors/ states what kernels compute; model/fast/ registers beside it:\n" \
                      + "\n".join(wrong)


def test_fast_executors_are_reached_only_through_the_registry():
    """The modules registering fast executors are imported by model/fast
    itself (its package, which loads them, and each other), never by the
    engine or anything else, which build kernels with registry.build."""
    from jax_ipu.model import registry
    registering = {build.__module__ for build in registry.FAST.values()} \
        | {f.build_producer.__module__ for f in registry.FUSIONS.values()}
    wrong = [f"{m} imports {i}" for m, imported in GRAPH.items() for i in sorted(imported & registering)
             if not m.startswith("jax_ipu.model.fast")]
    assert not wrong, "\n".join(wrong)


def test_a_kernel_field_without_a_declaration_is_refused():
    import dataclasses

    from jax_ipu.graph import records
    with __import__("pytest").raises(TypeError, match="says what it holds"):
        @records.codelet
        class Undeclared:
            out: object = dataclasses.field(default=None)
