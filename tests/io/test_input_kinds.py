"""The input-kind table (onnx_lrp/io/kinds.py): every kind in it is read alike by the API (onnx_lrp.io.inputs), the
command line (``onnx-lrp explain``) and the dataset engine (onnx_lrp.dataset.open_source), each against the data the
case wrote (the oracle); and no module but the table tells a model input's kind from its suffix."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

import onnx_lrp
from onnx_lrp.cli.main import main
from onnx_lrp.dataset import open_source
from onnx_lrp.io.inputs import input_infos, input_kind, items_kind, load_inputs
from onnx_lrp.io.kinds import FILE_KINDS, KINDS, Kind, kind_of
from onnx_lrp.core.errors import InputError

from util import ROOT  # noqa: E402
DIGITS = ROOT / "models" / "digits_cnn.onnx"  # one input "image", float32 [N, 1, 16, 16]
SHAPE = (1, 16, 16)


# ---------------------------------------------------------------------------------------------- one case per kind
def _npy(tmp: Path):
    x = np.random.default_rng(0).random((3, *SHAPE), dtype=np.float32)
    np.save(tmp / "x.npy", x)
    return tmp / "x.npy", x, "x.relevance.npy"


def _npz(tmp: Path):
    x = np.random.default_rng(1).random((2, *SHAPE), dtype=np.float32)
    np.savez(tmp / "x.npz", image=x)
    return tmp / "x.npz", x, "x.relevance.npz"


def _image(tmp: Path):
    pixels = np.random.default_rng(2).integers(0, 256, SHAPE[1:], dtype=np.uint8)
    Image.fromarray(pixels, mode="L").save(tmp / "x.png")
    return tmp / "x.png", (pixels.astype(np.float32) / np.float32(255))[None, None], "x.relevance.npy"


def _parquet(tmp: Path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq
    x = np.random.default_rng(3).random((4, *SHAPE), dtype=np.float32)
    pq.write_table(pa.table({"image": [row.ravel().tolist() for row in x]}), tmp / "x.parquet")
    return tmp / "x.parquet", x, None


def _pixels(tmp: Path):
    pixels = np.random.default_rng(4).integers(0, 256, (2, *SHAPE), dtype=np.uint8)
    np.save(tmp / "x.npy", pixels)
    return tmp / "x.npy", pixels.astype(np.float32) / np.float32(255), "x.relevance.npy"


CASES = {Kind.NPY: _npy, Kind.NPZ: _npz, Kind.IMAGE: _image, Kind.PARQUET: _parquet, Kind.PIXELS: _pixels}


def test_every_kind_in_the_table_has_a_case():
    assert set(CASES) == set(KINDS) == set(Kind)


def test_each_suffix_names_one_kind_in_any_case():
    seen = [s for spec in KINDS.values() for s in spec.suffixes]
    assert len(seen) == len(set(seen)) and all(re.fullmatch(r"\.[a-z0-9]+", s) for s in seen)
    for spec in KINDS.values():
        for s in spec.suffixes:
            assert kind_of(f"dir.v1/a{s}") is spec.kind and kind_of(f"A{s.upper()}") is spec.kind
    assert kind_of("x.onnx") is None and kind_of("npy") is None and kind_of("x.npy.txt") is None


def _one_line_refusal(args, *needles):
    r = CliRunner().invoke(main, [str(a) for a in args])
    lines = r.stderr.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 1 and all(n in lines[0] for n in needles), (r.exit_code, r.output)


@pytest.mark.parametrize("kind", list(Kind))
def test_the_api_the_cli_and_the_dataset_engine_read_a_kind_alike(kind, tmp_path, monkeypatch):
    path, oracle, default_out = CASES[kind](tmp_path)
    spec = KINDS[kind]
    infos = input_infos(onnx_lrp.Explainer(DIGITS, composite="epsilon").inputs)
    if spec.single_run:  # the API, then the CLI's relevance against the API's on the oracle
        batch = load_inputs(path, infos)
        np.testing.assert_array_equal(batch.arrays["image"], oracle)
        assert items_kind(path) is kind and input_kind(path) in FILE_KINDS
        want = onnx_lrp.Explainer(DIGITS, composite="epsilon").explain(oracle).relevance
        monkeypatch.chdir(tmp_path)
        r = CliRunner().invoke(main, ["explain", str(DIGITS), str(path), "-c", "epsilon", "--json"])
        assert r.exit_code == 0, r.output
        got = np.load(tmp_path / default_out)
        got = got["relevance"] if default_out.endswith(".npz") else got
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * float(np.abs(want).max()))
    else:  # refused by the single run in one line naming the file
        with pytest.raises(InputError, match=re.escape(str(path))):
            load_inputs(path, infos)
        _one_line_refusal(["explain", DIGITS, path], str(path), "unknown type")
    if kind is Kind.PIXELS:  # the dataset reader feeds arrays as stored: uint8 is refused, not read otherwise
        _one_line_refusal(["explain", DIGITS, path, "--out-dir", tmp_path / "out"], "uint8")
        return
    source = open_source(path, infos)
    ok, bad = source.read(0, len(source))
    assert not bad and [i for i, _ in ok] == list(range(len(oracle)))
    np.testing.assert_array_equal(np.stack([item["image"] for _, item in ok]), oracle)


# ---------------------------------------------------------------------------------------------- the one dispatch
# checks of a suffix outside the table, each for a file that is not a model input (an output's format, an option's
# own file): (module, function, suffix)
NOT_MODEL_INPUTS = {
    ("onnx_lrp/io/text_inputs.py", "token_embeddings", ".npy"),  # --embeddings: the embedding matrix
    ("cli/evaluate.py", "_mask", ".npy"),  # --mask
    ("cli/evaluate.py", "evaluate", ".png"),  # --plot
    ("cli/concepts.py", "concepts", ".npz"),  # -o
    ("cli/explain.py", "_destinations", ".npy"), ("cli/explain.py", "_destinations", ".npz"),  # -o
    ("cli/explain.py", "_run", ".npy"), ("cli/explain.py", "_write", ".npy"),  # -o: one relevance or an archive
    ("cli/regress.py", "snapshot", ".npz"),  # -o
    ("cli/text.py", "_text_outputs", ".npy"), ("cli/text.py", "_text_outputs", ".npz"),  # -o
    ("cli/text.py", "_write_text", ".npy"),  # -o
    ("cli/regress.py", "<module>", "REPORT_SUFFIXES"),  # --report-json / --junit-xml / --report-html
    ("cli/regress.py", "_check_outputs", "REPORT_SUFFIXES"),
}
SUFFIX = re.compile(r"\.[a-z0-9]{2,8}")


def _suffix_tests(tree: ast.AST):
    """(function, suffix literal) of every comparison with a suffix (==, !=, in, not in) and every ``endswith``
    / ``removesuffix`` / ``with_suffix`` of one, plus (function, name) of every use of a suffix tuple."""
    owner = {}
    for f in ast.walk(tree):
        if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for n in ast.walk(f):
                owner.setdefault(id(n), f.name)
    for n in ast.walk(tree):
        parts = []
        if isinstance(n, ast.Compare) and any(isinstance(o, (ast.In, ast.NotIn, ast.Eq, ast.NotEq)) for o in n.ops):
            parts = [n]
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and \
                n.func.attr in ("endswith", "removesuffix", "with_suffix"):
            parts = n.args
        for part in parts:
            for c in ast.walk(part):
                if isinstance(c, ast.Constant) and isinstance(c.value, str) and SUFFIX.fullmatch(c.value.lower()):
                    yield owner.get(id(n), "<module>"), c.value.lower()
        if isinstance(n, ast.Name) and n.id.endswith("_SUFFIXES"):
            yield owner.get(id(n), "<module>"), n.id


def test_no_module_but_the_table_tells_an_inputs_kind_from_its_suffix():
    table = {s for spec in KINDS.values() for s in spec.suffixes}
    found = set()
    for folder in ("onnx_lrp", "cli", "rules"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel == "onnx_lrp/io/kinds.py":
                continue
            for func, what in _suffix_tests(ast.parse(path.read_text(encoding="utf-8"))):
                if what in table or what.endswith("_SUFFIXES"):
                    found.add((rel, func, what))
    stray = sorted(found - NOT_MODEL_INPUTS)
    assert not stray, f"suffixes tested outside onnx_lrp/io/kinds.py (use kind_of / is_kind): {stray}"
    gone = sorted(NOT_MODEL_INPUTS - found)
    assert not gone, f"allowed checks no longer in the code; drop them from NOT_MODEL_INPUTS: {gone}"


def test_the_scan_sees_a_suffix_dispatch():
    """The scan above finds the forms a suffix test takes (its oracle: code written to be caught)."""
    code = ("def f(p, q):\n    if p.suffix.lower() in ('.npy', '.npz'):\n        pass\n"
            "    return q.endswith('.png') or p.suffix == '.parquet' or p in IMAGE_SUFFIXES\n")
    assert set(_suffix_tests(ast.parse(code))) == {("f", ".npy"), ("f", ".npz"), ("f", ".png"), ("f", ".parquet"),
                                                   ("f", "IMAGE_SUFFIXES")}
