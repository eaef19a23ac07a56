"""The package's import structure, read from the source (ast), not from running it: imports run one way (no
circles), no private name (``_x``) is imported across modules, and the loading passes stay independent of the load
pipeline and of each other (docs/architecture.md). Function-local imports count like top-level ones: a circle
hidden in a function is still a circle."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# where each package's source lives (pyproject.toml's package-dir)
PACKAGE_DIRS = {"onnx_lrp": ROOT / "onnx_lrp", "onnx_lrp.rules": ROOT / "rules", "onnx_lrp.cli": ROOT / "cli"}
# the root package is the public facade (``__version__``, the lazy ``Explainer`` / ``explain_dataset``): modules may
# read ``__version__`` from it although it imports them on first use
FACADE = "onnx_lrp"
# the modules a loading pass may import from onnx_lrp (besides itself): the pass interface, the ground floor, op facts
PASS_MAY_IMPORT = ("onnx_lrp.load.builder", "onnx_lrp.core", "onnx_lrp.lrp.ops")

# Known violations, each "module: name" (none since the op facts / rule dispatch half of issue 19 was merged).
KNOWN_PRIVATE_IMPORTS: set[str] = set()


def _modules() -> dict[str, Path]:
    mods = {}
    for pkg, base in PACKAGE_DIRS.items():
        for path in sorted(base.rglob("*.py")):
            rel = path.relative_to(base).with_suffix("")
            parts = list(rel.parts)
            if parts[0] in ("rules", "cli") and pkg == "onnx_lrp":
                continue
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join([pkg] + parts)] = path
    return mods


MODULES = _modules()


def _package_of(module: str) -> str:
    return module if MODULES[module].name == "__init__.py" else module.rsplit(".", 1)[0]


def _imports(module: str):
    """(imported module, name or None, line) for every import of ``module`` that names a module of this package."""
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                target = a.name
                while target and target not in MODULES:
                    target = target.rpartition(".")[0]
                if target:
                    found.append((target, None, node.lineno, a.asname or a.name))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = _package_of(module)
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            if base not in MODULES:
                continue
            for a in node.names:
                sub = f"{base}.{a.name}"
                if sub in MODULES:
                    found.append((sub, None, node.lineno, a.asname or a.name))
                else:
                    found.append((base, a.name, node.lineno, None))
    return tree, found


def _graph() -> dict[str, set[str]]:
    return {m: {t for t, _, _, _ in _imports(m)[1] if t != m and t != FACADE} for m in MODULES}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_reader_sees_the_package():
    """The checks below read what they should: the loading pipeline, its passes, the ops and the CLI."""
    for m in ("onnx_lrp.load", "onnx_lrp.load.proto", "onnx_lrp.load.passes.qdq", "onnx_lrp.dataset.ray",
              "onnx_lrp.lrp.ops.quantize", "onnx_lrp.rules.composite", "onnx_lrp.cli.main"):
        assert m in MODULES, m
    g = _graph()
    assert "onnx_lrp.load.builder" in g["onnx_lrp.load.passes.qdq"]
    assert "onnx_lrp.dataset.shards" in g["onnx_lrp.dataset.ray"]
    # and the circle finder finds a circle
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circles():
    assert _circles(_graph()) == []


def test_no_private_name_imported_across_modules():
    found = set()
    for m in MODULES:
        tree, imports = _imports(m)
        aliases = {alias: target for target, name, _, alias in imports if name is None and alias}
        for target, name, line, _ in imports:
            if name is not None and name.startswith("_") and not name.startswith("__") and target != m:
                found.add(f"{m}: {target}.{name}")
        for node in ast.walk(tree):  # module._name through an imported module
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases \
                    and node.attr.startswith("_") and not node.attr.startswith("__"):
                found.add(f"{m}: {aliases[node.value.id]}.{node.attr}")
    assert found <= KNOWN_PRIVATE_IMPORTS, sorted(found - KNOWN_PRIVATE_IMPORTS)
    assert not KNOWN_PRIVATE_IMPORTS - found, f"fixed, remove from the list: {sorted(KNOWN_PRIVATE_IMPORTS - found)}"


def test_a_pass_imports_neither_the_pipeline_nor_another_pass():
    """Each module of onnx_lrp/load/passes imports only build, graph, errors, names and op facts: never the load
    pipeline (onnx_lrp.load, .proto, .fold) nor another pass, so a new deployed form is one new file (or one new
    package, whose modules may import each other)."""
    passes = [m for m in MODULES if m.startswith("onnx_lrp.load.passes.")]
    assert len(passes) >= 7
    offenders = []
    for m in passes:
        own = ".".join(m.split(".")[:4])  # the pass: its module, or its package
        for target, name, line, _ in _imports(m)[1]:
            if target != own and not target.startswith(own + ".") and \
                    not any(target == p or target.startswith(p + ".") for p in PASS_MAY_IMPORT):
                offenders.append(f"{MODULES[m].relative_to(ROOT)}:{line} imports {target}")
    assert not offenders, offenders


def test_only_load_proto_imports_onnx():
    """onnx (the protobuf library) is read and written in one package, the loader's proto layer
    (onnx_lrp/load/proto/); the rest edits onnx_ir graphs."""
    proto = "onnx_lrp.load.proto"
    assert MODULES[proto].name == "__init__.py"  # a package: its modules, one per job, may import onnx
    offenders = []
    for m, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            if any(n == "onnx" or n.startswith("onnx.") for n in names) and not m.startswith(proto + "."):
                offenders.append(f"{m}:{node.lineno}")
    assert not offenders, offenders


def test_every_package_is_installed():
    """pyproject.toml lists every package folder (setuptools installs only those listed: a package left out works in
    an editable install and is missing from a wheel)."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {name for name, path in MODULES.items() if path.name == "__init__.py"}
    assert found - listed == set(), f"packages missing from pyproject.toml: {sorted(found - listed)}"


def test_tests_and_scripts_import_the_installed_names():
    """``cli/`` and ``rules/`` install as ``onnx_lrp.cli`` / ``onnx_lrp.rules``: a bare ``from cli...`` works only
    when the repository root happens to be on sys.path (``python -m pytest``), not under CI's ``pytest``."""
    bare = []
    for folder in ("tests", "scripts", "benchmarks"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names = [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else \
                    [a.name for a in node.names] if isinstance(node, ast.Import) else []
                bare += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] in ("cli", "rules")]
    assert bare == [], f"import onnx_lrp.cli / onnx_lrp.rules instead: {bare}"
