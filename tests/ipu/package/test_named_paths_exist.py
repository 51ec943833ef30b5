"""Every module and file the code's comments, the docs and the README name
exists: a path (`model/fast/lanes.py`, `tests/ipu/helpers.py`, `docs/ipu.md`)
is the end of a file's path in the tree, a dotted name (`jax_ipu.model.registry`,
`jax_ipu.pipeline.gpipe`) a module of the package or a name in one. Names
go stale when code moves; this catches them."""
from __future__ import annotations

import importlib
import pathlib
import re
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]


def _tracked() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        out = None
    if out is None or out.returncode != 0:
        pytest.skip("not a git checkout: the tree's files are not listed")
    return out.stdout.split()


FILES = _tracked() if (ROOT / ".git").exists() else []
# A path: a file name with one of the tree's extensions, maybe after folders.
PATH = re.compile(r"(?<![\w./{*$-])((?:[\w-]+/)*[\w-]+\.(?:py|pyx|pxi|md|h|txt|toml))(?![\w/])")
# (Quoted or after "@": a custom call's target, "jax_ipu.svd", not a module.)
DOTTED = re.compile(r"(?<![\w.\"'@])(jax_ipu(?:\.[A-Za-z_]\w*)+)")
# Modules of a package of jax_ipu named from the package (graph.codelets,
# model.engine; "model" is also the user's model, "stablehlo" the dialect).
PACKAGE_DOTTED = re.compile(r"(?<![\w.\"'@/])((?:compiler|graph|pjrt|profile|frontend|utils"
                            r"|model(?=\.(?:engine|executors|fast|kernels|registry|links|lanes|helper|blas)\b))"
                            r"(?:\.[a-z_]\w*)+)(?![\w(])")
# A file named without its folder is checked when it is a test file or a
# test's cases (other bare names are the user's: train.py, model.py).
BARE = re.compile(r"^(test_\w+|\w+_cases)\.py$")
# Names of files outside this tree (JAX's, XLA's, Graphcore's, the user's).
ELSEWHERE = re.compile(r"^(jax|jaxlib|xla|tensorflow|poplar|popops|poplin|tessellate|numpy|scipy|setuptools|tsl"
                       r"|pjrt_c_api|stablehlo|mlir|_src|third_party|examples/mnist|tests/(?!ipu/|fuzz/|conformance/))\b"
                       r"|^(setup\.py|conftest\.py|__init__\.py|README\.md)$")


def _texts():
    for name in FILES:
        if name.endswith((".py", ".pyx", ".pxi", ".md", ".toml")) and not name.endswith("test_named_paths_exist.py"):
            yield name, (ROOT / name).read_text(errors="replace")


def _path_exists(path: str) -> bool:
    return any(f == path or f.endswith("/" + path) for f in FILES)


def _dotted_exists(name: str) -> bool:
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def _missing() -> list[str]:
    found = []
    for name, text in _texts():
        for line_no, line in enumerate(text.splitlines(), 1):
            for path in PATH.findall(line):
                if ("/" in path or BARE.match(path)) and not ELSEWHERE.search(path) and not _path_exists(path):
                    found.append(f"{name}:{line_no}: {path}")
            for dotted in DOTTED.findall(line) + ["jax_ipu." + d for d in PACKAGE_DOTTED.findall(line)]:
                if not dotted.endswith((".md", ".py")) and not _dotted_exists(dotted):
                    found.append(f"{name}:{line_no}: {dotted}")
    return found


@pytest.mark.skipif(not FILES, reason="not a git checkout")
def test_every_named_module_and_file_exists():
    missing = _missing()
    assert not missing, "names of modules or files that do not exist (moved or renamed?):\n" + "\n".join(missing)


def test_the_check_finds_a_moved_module():
    assert not _path_exists("model/kernels.py") and _path_exists("model/fast/lanes.py")
    assert not _dotted_exists("jax_ipu.lowerings") and _dotted_exists("jax_ipu.pipeline.gpipe")
