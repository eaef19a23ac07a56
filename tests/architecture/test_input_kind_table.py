"""The input-kind table (onnx_lrp/io/kinds.py) is the one place a kind is added (issue 33): every kind in it names
its reader (a function of the io stage taking the file, the model's inputs and the preprocessing) and has a case in
tests/io/test_input_kinds.py, and the one reader of files (onnx_lrp.io.inputs.load_inputs) picks a file's reader
from the table, never by kind."""
from __future__ import annotations

import ast
import inspect

from util import ROOT

from onnx_lrp.io import inputs
from onnx_lrp.io.kinds import KINDS, Kind


def _cases() -> set[str]:
    """The kinds named as keys of CASES in tests/io/test_input_kinds.py (read from its source)."""
    tree = ast.parse((ROOT / "tests" / "io" / "test_input_kinds.py").read_text(encoding="utf-8"))
    for n in ast.walk(tree):
        if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "CASES" for t in n.targets):
            return {k.attr for k in n.value.keys if isinstance(k, ast.Attribute)}
    return set()


def test_every_kind_names_a_reader_and_has_a_test():
    assert set(KINDS) == set(Kind)
    for kind, spec in KINDS.items():
        reader = spec.reader
        assert inspect.isfunction(reader) and reader.__module__.startswith("onnx_lrp.io."), (kind, reader)
        assert list(inspect.signature(reader).parameters) == ["path", "infos", "pre"], (kind, reader)
    assert _cases() == {k.name for k in Kind}, "every kind in the table needs a case in tests/io/test_input_kinds.py"


def test_files_are_read_by_the_reader_their_row_names():
    """load_inputs calls KINDS[kind].reader and compares no kind with a Kind member (a new kind needs no branch)."""
    tree = ast.parse(inspect.getsource(inputs.load_inputs))
    assert any(isinstance(n, ast.Attribute) and n.attr == "reader" for n in ast.walk(tree))
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
                and n.value.id == "Kind"]
