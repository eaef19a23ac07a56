"""Every repository path named in docs/*.md, README.md and in the comments and docstrings of onnx_lrp/, rules/ and
cli/ exists (a path that moved is a dead pointer for the next reader): anything that looks like ``onnx_lrp/...``,
``tests/...``, ``scripts/...``, ``cli/...``, ``rules/...``, ``docs/...`` or ``benchmarks/...``; a glob must match a
file; names with placeholders (``<kind>``, ``{name}``) are skipped."""
from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

from util import ROOT  # noqa: E402
PATH = re.compile(r"(?<![\w./-])((?:onnx_lrp|tests|scripts|cli|rules|docs|benchmarks)/[\w./*<>{}-]*)")

# paths that are examples of a user's files, not of this repository: (file, path)
USER_FILES: set = set()
# dead paths in lines another change owns, to be fixed there (drop an entry once its line is fixed)
FIXED_ELSEWHERE: set = set()  # (file, path) pairs being fixed on another branch (none now)


def _comments_and_docstrings(source: str) -> str:
    parts = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                parts.append(doc)
    parts += [t.string for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type == tokenize.COMMENT]
    return "\n".join(parts)


def _texts():
    for path in [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md"]:
        yield path.relative_to(ROOT).as_posix(), path.read_text(encoding="utf-8")
    for folder in ("onnx_lrp", "rules", "cli"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            yield path.relative_to(ROOT).as_posix(), _comments_and_docstrings(path.read_text(encoding="utf-8"))


def repo_paths(text: str) -> list[str]:
    """The repository paths a text names (trailing punctuation dropped; placeholders skipped)."""
    found = [m.group(1).rstrip(".,:;)'\"`") for m in PATH.finditer(text)]
    return [p for p in found if not any(c in p for c in "<>{}")]


def _exists(path: str) -> bool:
    return any(ROOT.glob(path)) if "*" in path else (ROOT / path).exists()


def test_every_named_repository_path_exists():
    named = {(where, p) for where, text in _texts() for p in repo_paths(text)}
    dead = sorted((where, p) for where, p in named if not _exists(p))
    unexplained = [d for d in dead if d not in USER_FILES | FIXED_ELSEWHERE]
    assert not unexplained, f"paths that do not exist (file, path): {unexplained}"
    stale = sorted(USER_FILES - named)
    assert not stale, f"USER_FILES entries no longer named; drop them: {stale}"


def test_the_scan_finds_paths_in_prose_comments_and_docstrings():
    """The scan's own oracle: the paths written in a made-up text, with the forms the pages use."""
    text = ("see `onnx_lrp/io/kinds.py`, docs/gpu.md#tf32 and (scripts/fingerprint.py). A glob: rules/composites/"
            "*.toml; a placeholder: onnx_lrp/lrp/ops/<kind>.py; not a path: lrp/relevance/x, onnx_lrp.io.kinds")
    assert repo_paths(text) == ["onnx_lrp/io/kinds.py", "docs/gpu.md", "scripts/fingerprint.py",
                                "rules/composites/*.toml"]
    source = '"""Reads tests/util.py."""\n# writes benchmarks/timing.py\nx = "cli/not_a_comment.py"\n'
    assert repo_paths(_comments_and_docstrings(source)) == ["tests/util.py", "benchmarks/timing.py"]
    assert _exists("rules/composites/*.toml") and not _exists("onnx_lrp/ops/")
