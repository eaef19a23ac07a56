"""The documentation site as a reader sees it, checked without building it: the docstrings that the API reference
(docs/reference/*.md, mkdocstrings in Google style) renders contain no Sphinx role (it would show literally, as
``:class:`X```), and the user pages (every page of docs/ outside docs/development/) carry no development history
(issue numbers), no paths into the test suite and no internals in their headings, and stay short enough to read
(<= MAX_WORDS words, counted as ``wc -w`` counts them). `mkdocs build --strict` (CI) checks links and API names."""
from __future__ import annotations

import importlib
import inspect
import re
import types

from util import ROOT  # noqa: E402

DOCS = ROOT / "docs"
MAX_WORDS = 1800
ROLE = re.compile(r":(?:func|class|meth|mod|attr|exc|data|obj):`")
ISSUE = re.compile(r"\b(?:issues?|PR)\s*#?\d+", re.IGNORECASE)
TEST_PATH = re.compile(r"(?<![\w./-])tests/[\w./*-]+")
# a heading that names the package's files or a private name: internals, for docs/development/
INTERNAL_HEADING = re.compile(r"^#{1,6} .*(?:(?<![\w./-])(?:onnx_lrp|tests|rules|cli)/|(?<![\w.])_[a-z]\w*)")
OPTION = re.compile(r"^\s+(members|inherited_members):\s*\[(.*)\]\s*$")


def rendered_targets() -> list[tuple[str, str, list | None, list]]:
    """(page, ``::: name``, its ``members`` option or None, its ``inherited_members``) of every reference page."""
    found = []
    for page in sorted((DOCS / "reference").glob("*.md")):
        lines = page.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            if not line.startswith("::: "):
                continue
            options = {}
            for option in lines[i + 1:]:
                if option.strip() and not option.startswith((" ", "\t")):
                    break
                if m := OPTION.match(option):
                    options[m.group(1)] = [n.strip() for n in m.group(2).split(",") if n.strip()]
            found.append((page.name, line[4:].strip(), options.get("members"), options.get("inherited_members", [])))
    return found


def resolve(dotted: str):
    """The object a ``::: dotted.name`` line renders (the longest importable module, then attributes)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise AssertionError(f"{dotted} is not importable")


def _doc_of(member) -> str:
    """The docstring mkdocstrings shows for a function, method, property or class ("" for data)."""
    if isinstance(member, property):
        member = member.fget
    if not callable(member):
        return ""
    return member.__doc__ or ""


def rendered_docstrings(obj, members=None, inherited=()) -> list[tuple[str, str]]:
    """(name, raw docstring) of ``obj`` and of each member mkdocstrings shows (public ones, or ``members``)."""
    name = getattr(obj, "__qualname__", getattr(obj, "__name__", repr(obj)))
    out = [(name, obj.__doc__ or "")]
    if isinstance(obj, types.ModuleType):
        names = members if members is not None else [
            n for n, v in vars(obj).items() if not n.startswith("_") and getattr(v, "__module__", None) == obj.__name__]
        for n in names:
            out += rendered_docstrings(getattr(obj, n)) if isinstance(getattr(obj, n), type) else [
                (f"{name}.{n}", _doc_of(getattr(obj, n)))]
    elif isinstance(obj, type):
        out.append((f"{name}.__init__", _doc_of(obj.__dict__.get("__init__"))))  # merged into the class
        names = members if members is not None else [n for n in vars(obj) if not n.startswith("_")]
        for n in [*names, *inherited]:
            member = inspect.getattr_static(obj, n)
            out.append((f"{name}.{n}", _doc_of(member.__func__ if isinstance(member, (classmethod, staticmethod))
                                                else member)))
    return out


def user_pages():
    return [p for p in sorted(DOCS.rglob("*.md")) if "development" not in p.relative_to(DOCS).parts]


def test_the_reference_renders_no_sphinx_role():
    targets = rendered_targets()
    assert len(targets) >= 10 and any(t[1] == "onnx_lrp.explainer.Explainer" for t in targets), targets
    docs = [(page, doc_name, doc) for page, dotted, members, inherited in targets
            for doc_name, doc in rendered_docstrings(resolve(dotted), members, inherited)]
    assert any(n == "Explainer.explain" and "target" in d for _, n, d in docs)  # inherited members are read
    literal = [(page, n, ROLE.search(d).group(0)) for page, n, d in docs if ROLE.search(d)]
    assert not literal, f"Sphinx roles that render literally (write `name` or [name][dotted.name]): {literal}"


def test_the_site_reads_google_docstrings_and_hides_internal_bases():
    """mkdocstrings parses the style the docstrings are written in, and ``Explainer`` is not shown as "Bases: Runner"."""
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert re.search(r"^\s+docstring_style: google$", config, re.MULTILINE), "docstring_style must be google"
    assert re.search(r"^\s+show_bases: false$", config, re.MULTILINE), "show_bases: false (Runner is internal)"


def test_the_explainer_documents_its_parameters():
    from onnx_lrp.explainer import Explainer

    doc = Explainer.__init__.__doc__
    assert "Args:" in doc
    listed = set(re.findall(r"^\s+(\**\w+)(?: \([^)]*\))?:", doc.split("Args:")[1].split("\n\n")[0], re.MULTILINE))
    signature = {("**" if p.kind is p.VAR_KEYWORD else "") + p.name
                 for p in inspect.signature(Explainer.__init__).parameters.values() if p.name != "self"}
    assert signature <= listed, f"parameters of Explainer() not under Args: {sorted(signature - listed)}"
    for keyword in ("output", "relevance_at", "ledger", "constants", "input_shapes", "precision", "threads", "start",
                    "strict", "precise", "tf32", "epsilon", "gamma"):
        assert f"`{keyword}`" in doc, keyword


def test_user_pages_have_no_development_history_and_stay_short():
    pages = user_pages()
    assert len(pages) > 20 and all("development" not in p.parts for p in pages)
    problems = []
    for page in pages:
        text = page.read_text(encoding="utf-8")
        where = page.relative_to(ROOT).as_posix()
        problems += [(where, m.group(0)) for m in ISSUE.finditer(text)]
        problems += [(where, m.group(0)) for m in TEST_PATH.finditer(text)]
        problems += [(where, line) for line in text.splitlines() if INTERNAL_HEADING.match(line)]
        if len(text.split()) > MAX_WORDS:
            problems.append((where, f"{len(text.split())} words > {MAX_WORDS}"))
    assert not problems, f"user pages (move internals to docs/development/): {problems}"


def test_the_patterns_find_what_they_are_for():
    """The checks' own oracle, on made-up texts."""
    assert ROLE.search("Returns a :class:`Explanation`.") and ROLE.search("see :func:`onnx_lrp.plot.heatmap`")
    assert not ROLE.search("Returns an [`Explanation`][onnx_lrp.Explanation] (``explain``); ratio 1:2")
    assert [m.group(0) for m in ISSUE.finditer("6e30 in issue 35; issue #7; tissue 3; issues: none")] == [
        "issue 35", "issue #7"]
    assert [m.group(0) for m in TEST_PATH.finditer("(`tests/lrp/test_x.py`) and contests/x, my_tests/y")] == [
        "tests/lrp/test_x.py"]
    assert INTERNAL_HEADING.match("## Numeric honesty (`onnx_lrp/explainer.py: _check_finite`)")
    assert INTERNAL_HEADING.match("## Conservation sweep (`tests/lrp/test_conservation_sweep.py`)")
    assert not INTERNAL_HEADING.match("## Numeric honesty") and not INTERNAL_HEADING.match("# onnx_lrp.plot")

    class Made:
        """A :class:`Made`."""

        @property
        def value(self):
            """See :meth:`Made.value`."""

        def _hidden(self):
            """:func:`never_rendered`"""

    found = dict(rendered_docstrings(Made))
    assert ROLE.search(found[f"{Made.__qualname__}.value"]) and not any("never_rendered" in d for d in found.values())
