"""The package's import structure, read from the source (ast), not from running it: imports run one way (no
circles), no private name (``_x``) is imported across modules, and the loading passes stay independent of the load
pipeline and of each other (docs/architecture.md). Function-local imports count like top-level ones: a circle
hidden in a function is still a circle."""
from __future__ import annotations

import ast
from pathlib import Path
from util import ROOT

# where each package's source lives (pyproject.toml's package-dir)
PACKAGE_DIRS = {"onnx_lrp": ROOT / "onnx_lrp", "onnx_lrp.rules": ROOT / "rules", "onnx_lrp.cli": ROOT / "cli"}
# the root package is the public facade (``__version__``, the lazy ``Explainer`` / ``explain_dataset``): modules may
# read ``__version__`` from it although it imports them on first use
FACADE = "onnx_lrp"
# the modules a loading pass may import from onnx_lrp (besides itself): the pass interface and the ground floor
PASS_MAY_IMPORT = ("onnx_lrp.load.builder", "onnx_lrp.core")
# the stages in pipeline order (docs/architecture.md): a module may import its own stage or an earlier one, never a
# later one; stages on one rank (the features) do not import each other
STAGES = [
    ("onnx_lrp.core",),
    ("onnx_lrp.load",),
    ("onnx_lrp.lrp", "onnx_lrp.rules"),
    ("onnx_lrp.building",),
    ("onnx_lrp.io",),
    ("onnx_lrp.run",),
    ("onnx_lrp.metrics", "onnx_lrp.methods"),  # faithfulness and similarity; attribution methods beyond LRP (the regression check compares with its Spearman)
    ("onnx_lrp.regression", "onnx_lrp.concepts", "onnx_lrp.dataset"),
    ("onnx_lrp", "onnx_lrp.explainer", "onnx_lrp.plot", "onnx_lrp.preprocess", "onnx_lrp.ray"),  # the public facade
    ("onnx_lrp.cli",),
]

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
              "onnx_lrp.lrp.ops.quantize", "onnx_lrp.rules.composite", "onnx_lrp.cli.main", "onnx_lrp.building",
              "onnx_lrp.run.runner", "onnx_lrp.core.meta"):
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


def _stage_of(module: str) -> tuple[int, str]:
    """(rank, stage) of a module: the longest stage name that is the module or a package above it."""
    best = None
    for rank, names in enumerate(STAGES):
        for name in names:
            if (module == name or module.startswith(name + ".")) and (best is None or len(name) > len(best[1])):
                best = (rank, name)
    assert best is not None, f"{module} belongs to no stage: add it to STAGES (and docs/architecture.md)"
    return best


def test_the_package_root_holds_the_facade_and_the_stages():
    """onnx_lrp/ holds the public facade (``__init__``, ``explainer``, ``plot``, ``ray``) and one package per stage;
    every other module lives in its stage's package."""
    facade = set(STAGES[-2])
    stages = {name for names in STAGES for name in names} - facade
    root = {m for m in MODULES if m.count(".") == 1 and not m.startswith(("onnx_lrp.rules", "onnx_lrp.cli"))}
    stray = sorted(m for m in root if m not in facade and m not in stages)
    assert stray == [], f"modules at the package root that are neither facade nor a stage: {stray}"
    assert all(MODULES[s].name == "__init__.py" for s in stages if s in MODULES), "a stage is a package"
    assert all(_stage_of(m) for m in MODULES)


def test_the_version_is_the_projects():
    """``onnx_lrp.__version__`` (core/version.py, written into manifests and snapshots) is pyproject.toml's."""
    import tomllib

    from onnx_lrp.core.version import VERSION

    assert VERSION == tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def test_no_stage_imports_a_later_stage():
    """Imports run down the pipeline: core < load < lrp (and rules) < building < io < run < metrics < the features
    (regression, concepts, dataset; none imports another) < the facade < cli. Function-local imports count too,
    except the facade's own (it names everything on first use)."""
    offenders = []
    for m in MODULES:
        rank, stage = _stage_of(m)
        if rank == len(STAGES) - 2:  # the facade: lazy names of every stage
            continue
        for target, name, line, _ in _imports(m)[1]:
            t_rank, t_stage = _stage_of(target)
            if t_rank > rank or (t_rank == rank and t_stage != stage and rank == len(STAGES) - 3):
                offenders.append(f"{MODULES[m].relative_to(ROOT)}:{line} ({stage}) imports {target} ({t_stage})")
    assert offenders == [], offenders


def _built_name(node: ast.AST) -> bool:
    """An attribute name made at run time from pieces: ``"propagate_" + x``, an f-string, ``"...".format``."""
    if isinstance(node, ast.JoinedStr):
        return True
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mod)):
        return True
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("format", "join")


def test_rules_dispatch_through_tables_not_built_names():
    """Rules reach op families through their ``families`` table (onnx_lrp.lrp.families), never by building a
    method name (``getattr(self, "propagate_" + family)``): what a rule supports is data that ``fits`` checks."""
    offenders = []
    for m, path in MODULES.items():
        if not (m.startswith("onnx_lrp.rules") or m.startswith("onnx_lrp.lrp")):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                    node.func.id in ("getattr", "hasattr", "setattr") and len(node.args) >= 2 and \
                    _built_name(node.args[1]):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert offenders == [], f"attribute names built at run time: {offenders}"
    assert _built_name(ast.parse('"propagate_" + f', mode="eval").body)  # the check sees the old form


def _meta_key_literals(tree: ast.AST, names=()) -> list[int]:
    """Lines that use a string literal ``lrp_...`` as a key of a ``meta`` store (``x.meta["lrp_k"]``,
    ``x.meta.get("lrp_k")``, ``x.meta.pop("lrp_k")``, ``"lrp_k" in x.meta``), or spell one of ``names`` (the keys'
    strings) anywhere."""
    def is_meta(n):
        return isinstance(n, ast.Attribute) and n.attr == "meta"

    def literal(n):
        return isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.startswith("lrp_")

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and is_meta(node.value) and literal(node.slice):
            found.append(node.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and is_meta(node.func.value) and \
                node.func.attr in ("get", "pop", "setdefault") and node.args and literal(node.args[0]):
            found.append(node.lineno)
        elif isinstance(node, ast.Compare) and literal(node.left) and \
                any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops) and any(is_meta(c) for c in node.comparators):
            found.append(node.lineno)
        elif isinstance(node, ast.Constant) and node.value in names:
            found.append(node.lineno)
    return found


def test_every_meta_key_is_a_named_constant():
    """The facts the loader leaves for the rewriter travel under the typed keys of onnx_lrp/core/meta.py
    (``meta.BIAS.get(node)``), never under string literals; each key there is ``lrp_``-prefixed and named once."""
    from onnx_lrp.core import meta

    names = {k.name for k in meta.KEYS}
    offenders = []
    for m, path in MODULES.items():
        if m != "onnx_lrp.core.meta":
            offenders += [f"{path.relative_to(ROOT)}:{line}" for line in sorted(set(_meta_key_literals(
                ast.parse(path.read_text(encoding="utf-8")), names)))]
    assert offenders == [], f"meta keys as string literals (name them in onnx_lrp/core/meta.py): {offenders}"
    assert len(names) == len(meta.KEYS) and all(n.startswith("lrp_") for n in names)
    assert set(meta.KEYS) == {v for v in vars(meta).values() if isinstance(v, meta.Key)}
    assert _meta_key_literals(ast.parse('n.meta["lrp_x"]; n.meta.get("lrp_y"); "lrp_z" in n.meta; K = "lrp_bias"'),
                              names) == [1, 1, 1, 1]


def _rule_imports(module: str) -> list[str]:
    """The imports of ``module`` that name onnx_lrp.rules or a module of it (function-local ones included)."""
    return [f"{module} -> {t} (line {line})" for t, _, line, _ in _imports(module)[1]
            if t == "onnx_lrp.rules" or t.startswith("onnx_lrp.rules.")]


def test_the_engine_imports_no_rule(tmp_path, monkeypatch):
    """Nothing under onnx_lrp/lrp imports onnx_lrp.rules: the engine reads a rule's properties (``passes_through``,
    ``linear``, ``is_box``) and a composite through ``onnx_lrp.lrp.vocabulary``'s views, never their classes; the
    arrow runs rules -> lrp only (rules/ lives apart, so the package mapping alone would hide a tie back)."""
    engine = [m for m in MODULES if m == "onnx_lrp.lrp" or m.startswith("onnx_lrp.lrp.")]
    assert len(engine) > 10 and "onnx_lrp.lrp.walk" in engine
    assert [hit for m in engine for hit in _rule_imports(m)] == []
    assert any(t.startswith("onnx_lrp.lrp") for t, _, _, _ in _imports("onnx_lrp.rules.base")[1])  # rules -> lrp
    old = tmp_path / "walk.py"  # the check sees the old forms, at top level and inside a function
    old.write_text("from ..rules.elementwise import Pass\n\ndef f():\n    from ..rules import linear\n"
                   "    import onnx_lrp.rules.composite\n", encoding="utf-8")
    monkeypatch.setitem(MODULES, "onnx_lrp.lrp.walk", old)
    assert len(_rule_imports("onnx_lrp.lrp.walk")) == 3


def _category_literals(tree: ast.AST) -> list[int]:
    """Lines comparing an attribute ``category`` with a string literal (``op.category == "linear"``, either side,
    or ``in`` a tuple / list / set of them)."""
    def literal(n):
        if isinstance(n, (ast.Tuple, ast.List, ast.Set)):
            return any(literal(e) for e in n.elts)
        return isinstance(n, ast.Constant) and isinstance(n.value, str)

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(isinstance(s, ast.Attribute) and s.attr == "category" for s in sides) and any(map(literal, sides)):
                found.append(node.lineno)
    return found


def test_no_category_is_compared_with_a_string():
    """Op categories are ``onnx_lrp.lrp.vocabulary.Category`` members (``op.category is Category.LINEAR``), never
    strings, in onnx_lrp/, rules/ and cli/."""
    offenders = [f"{path.relative_to(ROOT)}:{line}" for path in MODULES.values()
                 for line in _category_literals(ast.parse(path.read_text(encoding="utf-8")))]
    assert offenders == [], f"category compared with a string (use Category): {offenders}"
    assert _category_literals(ast.parse('op.category == "linear"\n"move" != a.op.category\n'
                                        'op.category in ("linear", "activation")\nop.category is Category.MOVE\n'
                                        'kind == "linear"\n')) == [1, 2, 3]


# ---------------------------------------------------------------------------------------------- options as objects
MAX_PARAMETERS = 8
# the public facade (onnx_lrp's names: they keep their friendly keywords and forward ONE options object) and the
# options types; "path:function" (a method: "path:Class.method")
PARAMETER_FACADE = {
    "onnx_lrp/explainer.py:Explainer.explain_text", "onnx_lrp/explainer.py:Explainer.explain_concepts",
    "onnx_lrp/metrics/__init__.py:evaluate", "onnx_lrp/dataset/__init__.py:explain_dataset",
    "onnx_lrp/plot.py:heatmap", "onnx_lrp/run/explanation.py:Explanation.heatmap",
}
# not yet passed one options object (each moves to an options type of its stage, then leaves this list): none left
PARAMETER_DEBT: set[str] = set()


def _many_parameters(source: str) -> list[tuple[str, int]]:
    """(qualified name, parameters) of each function of ``source`` with more than MAX_PARAMETERS parameters (self /
    cls not counted; ``*args`` and ``**kwargs`` count one each)."""
    found = []

    def visit(node, prefix: str):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = child.args
                names = [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs]
                if names and names[0] in ("self", "cls") and prefix:
                    names = names[1:]
                n = len(names) + (a.vararg is not None) + (a.kwarg is not None)
                if n > MAX_PARAMETERS:
                    found.append((prefix + child.name, n))
                visit(child, f"{prefix}{child.name}.")
    visit(ast.parse(source), "")
    return found


def test_no_function_takes_more_than_eight_parameters():
    """Options travel as objects (BuildOptions, RunOptions, ExplainOptions, EvaluateOptions, DatasetOptions), not as
    long lists: no function in onnx_lrp/, rules/, cli/ takes more than 8 parameters, except the public facade and
    the listed debt (which only shrinks: an entry that no longer offends must leave the list)."""
    offenders, seen = [], set()
    for path in MODULES.values():
        for name, n in _many_parameters(path.read_text(encoding="utf-8")):
            key = f"{path.relative_to(ROOT).as_posix()}:{name}"
            seen.add(key)
            if key not in PARAMETER_FACADE | PARAMETER_DEBT:
                offenders.append(f"{key} ({n})")
    assert offenders == [], f"functions with more than {MAX_PARAMETERS} parameters (pass an options object): {offenders}"
    stale = sorted(PARAMETER_DEBT - seen)
    assert stale == [], f"no longer over {MAX_PARAMETERS} parameters: remove from PARAMETER_DEBT: {stale}"
    sample = ("def f(a, b, c, d, e, f, g, h): pass\nclass C:\n    def m(self, a, b, c, d, e, f, g, *h, **k): pass\n"
              "def g(self, a, b, c, d, e, f, g, h): pass\n")
    assert _many_parameters(sample) == [("C.m", 9), ("g", 9)]


def test_test_file_names_are_unique_across_the_stage_folders():
    """tests/<stage>/ folders have no __init__.py and every stage folder is importable (conftest.py): two test files
    of one name would shadow each other, so each name is unique across tests/."""
    from collections import Counter

    names = Counter(p.name for p in (ROOT / "tests").rglob("test_*.py"))
    assert len(names) > 60
    assert [n for n, c in names.items() if c > 1] == []
