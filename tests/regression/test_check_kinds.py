"""`onnx-lrp check` tells output drift, explanation drift and changed predictions apart (issue 27, point 6).

Two edits of the demo model with known effects, measured independently (onnxruntime runs of both files, numpy):

* ``scaled``: the last dense layer's weights x 1.04: every logit moves by ~4 % (output drift beyond 0.02) while the
  relevance is the baseline's times 1.04 (epsilon rule at a linear last layer; cosine 1, rel-L2 0.04): the default
  check passes and reports the output drift; ``--fail-on outputs`` (or ``fail_on`` in the TOML) fails on it;
* ``biased``: +30 on class 0's bias: every prediction but item 0's changes to 0 while the relevance of the stored
  targets does not move: the default check fails on the changed predictions only; ``--fail-on relevance`` passes.

The table, JSON and JUnit name the kind of each drift and whether it fails. The HTML report is checked in
tests/regression/test_report_html.py.
"""
from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from onnx_lrp import regression as rg
from onnx_lrp.core.errors import InputError
from util import ROOT

DEMO = ROOT / "models" / "digits_cnn.onnx"
SAMPLES = ROOT / "models" / "samples" / "batch.npy"
X = np.load(SAMPLES)


def edited(path: Path, change) -> Path:
    """The demo with the last Gemm's weight (input 1) or bias (2) changed by ``change(input, array) -> array``."""
    m = onnx.load(str(DEMO))
    last = [n for n in m.graph.node if n.op_type == "Gemm"][-1]
    inputs = list(last.input)
    for t in m.graph.initializer:
        if t.name in inputs[1:]:
            t.CopyFrom(numpy_helper.from_array(change(inputs.index(t.name), numpy_helper.to_array(t)), t.name))
    onnx.save(m, str(path))
    return path


def logits(path) -> np.ndarray:
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(["logits"], {"image": X})[0].astype(np.float64)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("kinds")
    scaled = edited(d / "scaled.onnx", lambda k, a: a * np.float32(1.04) if k == 1 else a)
    biased = edited(d / "biased.onnx", lambda k, a: a + np.float32(30) * (np.arange(a.size) == 0) if k == 2 else a)
    return dict(scaled=scaled, biased=biased, dir=d)


@pytest.fixture(scope="module")
def baseline(models):
    from click.testing import CliRunner

    from onnx_lrp.cli.main import main

    out = models["dir"] / "baseline.npz"
    r = CliRunner().invoke(main, ["snapshot", str(DEMO), str(SAMPLES), "-o", str(out)])
    assert r.exit_code == 0, r.output
    return out


@pytest.fixture
def check(monkeypatch, capsys, tmp_path):
    from onnx_lrp.cli.main import main

    def run(*args):
        monkeypatch.chdir(tmp_path)
        capsys.readouterr()
        with pytest.raises(SystemExit) as exc:
            main.main(["check", *map(str, args)], prog_name="onnx-lrp")
        got = capsys.readouterr()
        return exc.value.code, got.out, got.err
    return run


def test_output_drift_alone_is_reported_not_failed(models, baseline, check, tmp_path):
    y0, y1 = logits(DEMO), logits(models["scaled"])
    drift = np.abs(y1 - y0).max(1) / np.abs(y0).max(1)  # output_diff, independently
    assert np.all(drift > 0.02) and np.all(y1.argmax(1) == y0.argmax(1))
    code, out, err = check(models["scaled"], baseline, "--report-json", tmp_path / "r.json",
                           "--junit-xml", tmp_path / "j.xml")
    assert code == 0, out + err  # failed before: 10 of 10 drifted on output_diff alone
    assert "note: outputs drift in 10 of 10 sample(s), reported, not failing" in out
    assert "OK: all 10 sample(s) within the thresholds (fail on relevance, predictions)" in out
    assert "drift outputs: output_diff" in out and "FAIL" not in out
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["passed"] and rep["fail_on"] == ["relevance", "predictions"]
    assert rep["drift_counts"] == dict(outputs=10, relevance=0, predictions=0)
    for s, d in zip(rep["samples"], drift):
        assert s["metrics"]["output_diff"] == pytest.approx(d, rel=1e-5)
        assert list(s["drift"]) == ["outputs"] and s["failed_kinds"] == [] and s["passed"]
        # rel_l2 on the relevance divided by the explained logit: the x 1.04 of both cancels (raw it was 0.04)
        assert s["metrics"]["cosine"] > 0.99999 and s["metrics"]["rel_l2"] < 0.005
    suite = ET.parse(tmp_path / "j.xml").getroot().find("testsuite")
    assert suite.get("failures") == "0" and not suite.findall("testcase/failure")
    props = {p.get("name"): p.get("value") for p in suite.find("properties")}
    assert props["fail_on"] == "relevance,predictions"
    for case in suite.findall("testcase"):
        assert {p.get("name"): p.get("value") for p in case.find("properties")}["drift"] == "outputs"
        assert "drift outputs: output_diff" in case.find("system-out").text

    # the user's choice: on the command line, or in the thresholds file the check reads
    code, out, err = check(models["scaled"], baseline, "--fail-on", "outputs,relevance,predictions",
                           "--junit-xml", tmp_path / "j2.xml")
    assert code == 1 and "DRIFT: 10 of 10 sample(s) beyond the thresholds (outputs 10)" in out, out + err
    assert "FAIL outputs: output_diff" in out
    for f in ET.parse(tmp_path / "j2.xml").getroot().findall("testsuite/testcase/failure"):
        assert f.get("type") == "OutputDrift" and f.get("message").startswith("outputs: output_diff")
    (tmp_path / ".onnx-lrp.toml").write_text('[check]\nfail_on = ["outputs"]\n')
    code, out, err = check(models["scaled"], baseline)
    assert code == 1 and "fail on outputs" in out, out + err
    code, out, err = check(models["scaled"], baseline, "--fail-on", "relevance")  # the command line wins
    assert code == 0, out + err


def test_changed_predictions_fail_and_are_named(models, baseline, check, tmp_path):
    y0, y1 = logits(DEMO), logits(models["biased"])
    changed = y1.argmax(1) != y0.argmax(1)
    assert changed.sum() == 9 and not changed[0]
    code, out, err = check(models["biased"], baseline, "--report-json", tmp_path / "r.json",
                           "--junit-xml", tmp_path / "j.xml")
    assert code == 1, out + err
    assert "DRIFT: 9 of 10 sample(s) beyond the thresholds (predictions 9)" in out
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["drift_counts"] == dict(outputs=10, relevance=0, predictions=9)
    for s, c, a, b in zip(rep["samples"], changed, y0.argmax(1), y1.argmax(1)):
        assert (s["predicted_baseline"], s["predicted_current"]) == (a, b)
        assert s["failed_kinds"] == (["predictions"] if c else []) and s["passed"] == (not c)
        assert s["drift"].get("predictions") == ([f"prediction {a} -> {b}"] if c else None)
    cases = ET.parse(tmp_path / "j.xml").getroot().findall("testsuite/testcase")
    failures = {c.get("name"): c.find("failure") for c in cases if c.find("failure") is not None}
    assert len(failures) == 9 and all(f.get("type") == "PredictionChanged" for f in failures.values())
    code, out, err = check(models["biased"], baseline, "--fail-on", "relevance")
    assert code == 0, out + err
    assert "note: predictions drift in 9 of 10 sample(s), reported, not failing" in out


def test_relevance_drift_fails_with_its_kind():
    """compare() on arrays: a relevance map replaced fails as relevance drift, with the metric named."""
    rng = np.random.default_rng(0)
    r = rng.normal(size=(3, 1, 4, 4))
    y = rng.normal(size=(3, 5))
    moved = r.copy()
    moved[1] = rng.normal(size=(1, 4, 4))
    comp = rg.compare(rg.Result({"x": r}, y, y.argmax(1), ["a", "b", "c"]),
                      rg.Result({"x": moved}, y, y.argmax(1), ["a", "b", "c"]))
    assert [s.item for s in comp.drifted] == ["b"] and comp.drifted[0].failed_kinds == ("relevance",)
    assert comp.drift_counts() == dict(outputs=0, relevance=1, predictions=0)
    assert rg.sample_status(comp.drifted[0]).startswith("FAIL relevance: cosine")
    assert repr(comp).startswith("Comparison(samples=3, failing=1") and len(repr(comp.samples[0])) < 300


@pytest.mark.parametrize("value, words", [("outputs,sizes", "unknown kind 'sizes'"), (3, "give a list of")])
def test_fail_on_refuses_unknown_kinds(value, words):
    with pytest.raises(InputError) as e:
        rg.parse_fail_on(value)
    assert words in str(e.value)
    assert rg.parse_fail_on("none") == () and rg.parse_fail_on(["predictions", "outputs"]) == ("outputs",
                                                                                                 "predictions")


def test_result_objects_have_short_reprs(baseline):
    snap = rg.read_snapshot(baseline)
    for obj in (snap, snap.result()):
        text = repr(obj)
        assert len(text) < 400 and "[[" not in text and "float32[10x1x16x16]" in text, text
