"""issue 35 item 6: `check` measures relevance drift on the relevance divided by its sum of |r| (its shape), and
reports a change of scale as output drift. Made here on the shipped models/digits_cnn.onnx: the last convolution's
weights x 1.5 (a ReLU net: the logit and the relevance grow together) must pass the relevance check and report
output drift (failing only with --fail-on outputs); the same convolution's first filter negated, or its weights
drawn at random, must fail. The figures are checked against an inline numpy recomputation."""
from __future__ import annotations

import json

import numpy as np
import pytest
from onnx import numpy_helper
import onnx
from util import ROOT

import onnx_lrp

DEMO = ROOT / "models" / "digits_cnn.onnx"
SAMPLES = ROOT / "models" / "samples" / "batch.npy"
WEIGHT = "features.6.weight"  # the last convolution (Conv -> Relu -> MaxPool -> Flatten -> Gemm ...)


def _variant(path, change):
    m = onnx.load(str(DEMO))
    (init,) = [i for i in m.graph.initializer if i.name == WEIGHT]
    init.CopyFrom(numpy_helper.from_array(change(numpy_helper.to_array(init)).astype(np.float32), WEIGHT))
    onnx.save(m, str(path))
    return path


def _flip(w):
    w = w.copy()
    w[0] = -w[0]
    return w


CHANGES = {"rescale": lambda w: w * 1.5, "flip": _flip,
           "random": lambda w: np.random.default_rng(0).standard_normal(w.shape) * w.std()}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("shape")
    return {k: _variant(d / f"{k}.onnx", f) for k, f in CHANGES.items()}


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    from onnx_lrp.cli.main import main
    d = tmp_path_factory.mktemp("base")
    with pytest.raises(SystemExit) as exc:
        main.main(["snapshot", str(DEMO), str(SAMPLES), "-o", str(d / "b.npz")], prog_name="onnx-lrp")
    assert exc.value.code == 0
    return d / "b.npz"


def _check(capsys, tmp_path, model, baseline, *extra):
    from onnx_lrp.cli.main import main
    capsys.readouterr()
    rep = tmp_path / "r.json"
    with pytest.raises(SystemExit) as exc:
        main.main(["check", str(model), str(baseline), "--report-json", str(rep), *map(str, extra)],
                  prog_name="onnx-lrp")
    return exc.value.code, capsys.readouterr().out, json.loads(rep.read_text())


def _oracle(model):
    """Inline numpy: the relevance of baseline and model on the baseline's targets, each divided by its sum of |r|."""
    x = np.load(SAMPLES)
    e0 = onnx_lrp.Explainer(str(DEMO)).explain(x)
    e1 = onnx_lrp.Explainer(str(model)).explain(x, target=e0.target)
    out = []
    for i in range(len(x)):
        a, b = (np.asarray(e.relevance[i], np.float64).ravel() for e in (e0, e1))
        a, b = a / np.abs(a).sum(), b / np.abs(b).sum()
        raw = np.linalg.norm(e1.relevance[i] - e0.relevance[i]) / np.linalg.norm(e0.relevance[i])
        out.append(dict(rel_l2=np.linalg.norm(b - a) / np.linalg.norm(a), raw=float(raw),
                        out=float(np.max(np.abs(e1.outputs["logits"][i] - e0.outputs["logits"][i]))
                                  / np.max(np.abs(e0.outputs["logits"][i])))))
    return out


def test_a_harmless_rescale_passes_relevance_and_reports_output_drift(models, baseline, tmp_path, capsys):
    code, out, rep = _check(capsys, tmp_path, models["rescale"], baseline)
    assert code == 0, out
    assert rep["passed"] and rep["drifted"] == []
    ref = _oracle(models["rescale"])
    for s, r in zip(rep["samples"], ref):
        # the raw relevance moved as much as the logit (~50 %): the old rel_l2 would have failed every sample
        assert r["raw"] > 0.3 and r["out"] > 0.3
        assert s["metrics"]["rel_l2"] == pytest.approx(r["rel_l2"], rel=1e-4, abs=1e-6)
        assert s["metrics"]["rel_l2"] < 0.02 and s["metrics"]["cosine"] > 0.9999
        assert s["metrics"]["output_diff"] == pytest.approx(r["out"], rel=1e-4)
        assert list(s["drift"]) == ["outputs"] and s["passed"]
    # the same run fails where outputs fail the check
    code, out, rep = _check(capsys, tmp_path, models["rescale"], baseline, "--fail-on", "outputs,relevance")
    assert code == 1 and not rep["passed"] and len(rep["drifted"]) == rep["n_samples"], out


@pytest.mark.parametrize("change", ["flip", "random"])
def test_a_real_drift_fails_the_relevance_check(models, baseline, tmp_path, capsys, change):
    code, out, rep = _check(capsys, tmp_path, models[change], baseline)
    assert code == 1 and not rep["passed"], out
    ref = _oracle(models[change])
    failing = [s for s in rep["samples"] if "relevance" in s["drift"]]
    assert len(failing) >= rep["n_samples"] // 2
    for s, r in zip(rep["samples"], ref):
        assert s["metrics"]["rel_l2"] == pytest.approx(r["rel_l2"], rel=1e-4, abs=1e-6)
    assert max(s["metrics"]["rel_l2"] for s in rep["samples"]) > 0.25  # 2.5 x the default threshold 0.1
