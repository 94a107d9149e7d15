"""The package's shape: no import cycle, no import up the layers, imports at module level, the house lint.

Layers, lowest first; a module may import its own layer and those below it, never one above:

    base        errors, shorten, sqnr, progress, input_files (what every layer uses)
    ir          the ConnectedGraph IR
    patterns    the pattern DSL and library (matches IR graphs)
    onnx_io     import/export, safe writes, onnxruntime sessions, API argument checks
    passmanager passes, their registry and instrumentation
    quant       the model of quantization (core, targets, settings, calibration, placement, interop, runtime, api)
    passes      every transformation, quantization algorithms included
    cli         the command line, the onnxruntime drop-in and the Olive pass

Edges come from every `import` in the sources, module level and inside functions alike (a function-level import
is still a dependency); `if TYPE_CHECKING:` blocks are annotations only and are not edges. The pass registry
loads the built-in pass modules by name (that is how plug-ins join too), which is not an import edge.
"""
from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys

import networkx as nx
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = {"qcompiler": "qcompiler", "qcompiler.passes": "passes", "qcompiler.patterns": "patterns"}
LAYERS = (
    ("base", ("qcompiler.errors", "qcompiler.shorten", "qcompiler.sqnr", "qcompiler.progress",
              "qcompiler.input_files")),
    ("ir", ("qcompiler.ir",)),
    ("patterns", ("qcompiler.patterns",)),
    ("onnx_io", ("qcompiler.onnx_io", "qcompiler.ort_session", "qcompiler.ort_probe", "qcompiler.arguments")),
    ("passmanager", ("qcompiler.passmanager",)),
    ("quant", ("qcompiler.quant",)),
    ("passes", ("qcompiler.passes",)),
    ("cli", ("qcompiler.cli", "qcompiler.cli_instruments", "qcompiler.cli_quantize", "qcompiler.inspect_model",
             "qcompiler.ort", "qcompiler.__main__", "qcompiler", "qcompiler.olive")),
)
# Imports that stay inside functions, each for a reason: the CLI imports a command's modules when that command
# runs (start-up of `qcompiler --help`, `inspect`), and its shared flags their instrumentations when a command
# makes them; the packages `qcompiler` and `qcompiler.quant` load their public names on first use (PEP 562), so
# `qcompiler --help` imports neither onnx nor numpy and a graph pass that reads one module of quant/ does not
# import the quantizer; cross-layer equalization imports its activation capture when it runs on samples (the
# graph passes all register on `qcompiler run`); onnxruntime only for what runs a model; optional extras;
# networkx on the IR's first index query; onnx's reference evaluator on the first constant fold (every pipeline
# registers fold-constants); pickle only between our own worker processes; platform modules.
LAZY_THIRD_PARTY = {"onnxruntime", "matplotlib", "jinja2", "ray", "networkx", "pickle", "fcntl", "importlib",
                    "onnx.reference"}
LAZY_OWN = {"qcompiler.cli", "qcompiler.cli_instruments", "qcompiler", "qcompiler.quant",
            "qcompiler.passes.cross_layer_equalization"}


def _modules() -> dict:
    mods = {}
    for pkg, folder in PACKAGES.items():
        base = os.path.join(ROOT, folder)
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            rel = os.path.relpath(dirpath, base)
            parts = [] if rel == "." else rel.split(os.sep)
            for f in filenames:
                if f.endswith(".py"):
                    leaf = [] if f == "__init__.py" else [f[:-3]]
                    mods[".".join([pkg] + parts + leaf)] = (os.path.join(dirpath, f), f == "__init__.py")
    return mods


def _imports(mods: dict):
    """(importer, imported module, in a function?, line, third-party module name or None) for every import."""
    for m, (path, is_pkg) in mods.items():
        tree = ast.parse(open(path, encoding="utf-8").read())

        def visit(node, in_func):
            for ch in ast.iter_child_nodes(node):
                if isinstance(ch, ast.If) and "TYPE_CHECKING" in ast.dump(ch.test):
                    continue
                if isinstance(ch, ast.Import):
                    for a in ch.names:
                        yield from _resolve(mods, m, a.name, None, in_func, ch.lineno)
                elif isinstance(ch, ast.ImportFrom):
                    if ch.level:
                        base = m if is_pkg else m.rpartition(".")[0]
                        for _ in range(ch.level - 1):
                            base = base.rpartition(".")[0]
                        src = base + ("." + ch.module if ch.module else "")
                    else:
                        src = ch.module
                    for a in ch.names:
                        yield from _resolve(mods, m, src, a.name, in_func, ch.lineno)
                yield from visit(ch, in_func or isinstance(ch, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))
        yield from visit(tree, False)


def _resolve(mods, importer, src, name, in_func, line):
    target = f"{src}.{name}" if name and f"{src}.{name}" in mods else src
    while target and target not in mods:
        target = target.rpartition(".")[0]
    if target:
        yield importer, target, in_func, line, None
    else:
        yield importer, None, in_func, line, src


def _layer(module: str) -> int:
    best = (-1, -1)
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best[1]:
                best = (i, len(p))
    assert best[0] >= 0, f"{module} is in no layer: add it to LAYERS"
    return best[0]


@pytest.fixture(scope="module")
def edges():
    return list(_imports(_modules()))


def test_no_import_cycle(edges):
    g = nx.DiGraph()
    for a, b, _, _, _ in edges:
        # a module importing its own package (or an ancestor) is not a dependency the other way round
        if b is not None and a != b and not a.startswith(b + "."):
            g.add_edge(a, b)
    cycles = [sorted(c) for c in nx.strongly_connected_components(g) if len(c) > 1]
    assert not cycles, f"import cycles: {cycles}"
    selfs = [(a, line) for a, b, _, line, _ in edges if a == b]
    assert not selfs, f"modules importing themselves: {selfs}"


def test_no_upward_import(edges):
    up = [f"{a}:{line} imports {b} ({LAYERS[_layer(b)][0]} is above {LAYERS[_layer(a)][0]})"
          for a, b, _, line, _ in edges if b is not None and _layer(b) > _layer(a)]
    assert not up, "\n".join(up)


def _lazy_third_party(module: str) -> bool:
    """`module` (a third-party import) is, or is inside, one that may be imported in a function."""
    return any(module == m or module.startswith(m + ".") for m in LAZY_THIRD_PARTY)


def test_imports_at_module_level(edges):
    late = [f"{a}:{line} imports {b or third}" for a, b, in_func, line, third in edges if in_func
            and not (b is None and _lazy_third_party(third)) and not (b is not None and a in LAZY_OWN)]
    # an import inside a `try` for an optional dependency is fine; everything else moves to the top
    assert not [x for x in late if not _in_try(x)], "\n".join(late)


def _in_try(entry: str) -> bool:
    module, line = entry.split(" ")[0].rsplit(":", 1)
    path = _modules()[module][0]
    tree = ast.parse(open(path, encoding="utf-8").read())
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and node.lineno <= int(line) <= node.end_lineno:
            return True
    return False


def test_tree_matches_the_layout_doc():
    """Every package folder docs/layout.md ("Where things are") lists exists, and every package folder is listed."""
    section = open(os.path.join(ROOT, "docs", "layout.md"), encoding="utf-8").read()
    for folder in ("qcompiler/ir", "qcompiler/onnx_io", "qcompiler/passmanager", "qcompiler/quant/core",
                   "qcompiler/quant/targets", "qcompiler/quant/settings", "qcompiler/quant/calibration",
                   "qcompiler/quant/placement", "qcompiler/quant/interop", "qcompiler/quant/runtime",
                   "passes/quantize", "patterns"):
        assert os.path.isdir(os.path.join(ROOT, folder)), folder
    for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, "qcompiler")):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        if "__init__.py" in filenames:
            rel = os.path.relpath(dirpath, ROOT).replace(os.sep, "/")
            leaf = rel.split("/")[-1]
            assert f"{leaf}/" in section, f"docs/layout.md does not list {rel}/"


@pytest.mark.skipif(shutil.which("ruff") is None and not os.path.exists(os.path.join(os.path.dirname(sys.executable), "ruff")),
                    reason="ruff is in the test extra")
def test_house_lint():
    """pyproject.toml's [tool.ruff]: at most two blank lines between top-level definitions, no unused names."""
    ruff = shutil.which("ruff") or os.path.join(os.path.dirname(sys.executable), "ruff")
    r = subprocess.run([ruff, "check", "--no-cache", "--output-format", "concise", ROOT], capture_output=True,
                       text=True, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-1000:]


def test_no_issue_numbers_in_code():
    rx = re.compile(r"\b[Ii]ssues? ?#?\d+")
    hits = []
    for folder in ("qcompiler", "passes", "patterns", "tests", "benchmarks", "examples"):
        for dirpath, _, filenames in os.walk(os.path.join(ROOT, folder)):
            for f in filenames:
                if f.endswith((".py", ".yaml")):
                    p = os.path.join(dirpath, f)
                    for i, line in enumerate(open(p, encoding="utf-8"), 1):
                        if rx.search(line) and "onnxruntime issue" not in line and "github" not in line:
                            hits.append(f"{os.path.relpath(p, ROOT)}:{i}")
    assert not hits, hits
