"""Class names in what one explanation gives back (issue 35, point 3): the API's `Explanation.heatmap()` captions
and `arrays()` (the `.npz` of `explain -o`) name the target and the predicted class, checked against the names
looked up by hand at the target and at onnxruntime's own arg-max; the arrays load without pickle; a model without
names gets neither."""
from __future__ import annotations

import json
import shutil

import numpy as np
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from util import ROOT, assert_close

from onnx_lrp import Explainer
from onnx_lrp.cli.main import main

DIGITS = ROOT / "models" / "digits_cnn.onnx"
X = np.load(ROOT / "models" / "samples" / "batch.npy")[:4]  # [4, 1, 16, 16]
NAMES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


@pytest.fixture(scope="module")
def logits():
    sess = ort.InferenceSession(str(DIGITS), providers=["CPUExecutionProvider"])
    return sess.run(["logits"], {sess.get_inputs()[0].name: X})[0]


@pytest.fixture(scope="module")
def named():
    return Explainer(DIGITS, labels=NAMES)


def test_arrays_name_target_and_prediction(named, logits, tmp_path):
    res = named.explain(X, target=[3, 3, 7, 7])
    out = res.arrays()
    assert out["target_labels"].tolist() == ["three", "three", "seven", "seven"]
    assert out["predicted_labels"].tolist() == [NAMES[i] for i in np.argmax(logits, axis=1)]
    np.savez(tmp_path / "r.npz", **out)
    with np.load(tmp_path / "r.npz", allow_pickle=False) as z:  # fixed-width unicode, no object arrays
        assert z["target_labels"].dtype.kind == "U" and z["predicted_labels"].tolist() == \
            out["predicted_labels"].tolist()


def test_captions_name_the_classes(named, logits):
    res = named.explain(X, target=[3, 3, 7, 7])
    pred = np.argmax(logits, axis=1)
    lines = res._labels(np.asarray(res.relevance))
    for i, line in enumerate(lines):
        assert line[1].startswith(f"pred {pred[i]}  target {res.target[i]}")
        want = NAMES[res.target[i]] + ("" if pred[i] == res.target[i] else f" (pred {NAMES[pred[i]]})")
        assert line[3] == want
    assert res.heatmap().size[1] > Explainer(DIGITS).explain(X, target=[3, 3, 7, 7]).heatmap().size[1]


def test_target_by_name_is_the_index(named):
    by_name = named.explain(X, target="seven")
    by_index = named.explain(X, target=7)
    assert by_name.target.tolist() == [7] * len(X)
    assert_close(np.asarray(by_name.relevance), np.asarray(by_index.relevance))


def test_no_names_no_label_arrays(logits):
    res = Explainer(DIGITS).explain(X)
    assert res.class_names is None
    assert not {"target_labels", "predicted_labels"} & set(res.arrays())
    assert all(len(line) == 3 for line in res._labels(np.asarray(res.relevance)))


def test_cli_npz_names_from_config_beside_the_model(tmp_path, logits):
    model = tmp_path / "digits.onnx"
    shutil.copy(DIGITS, model)
    (tmp_path / "config.json").write_text(json.dumps({"id2label": {str(i): n for i, n in enumerate(NAMES)}}))
    np.save(tmp_path / "x.npy", X)
    r = CliRunner().invoke(main, ["explain", str(model), str(tmp_path / "x.npy"), "-o", str(tmp_path / "r.npz"),
                                  "--target", "two"])
    assert r.exit_code == 0, r.output
    with np.load(tmp_path / "r.npz", allow_pickle=False) as z:
        assert z["targets"].tolist() == [2] * len(X)
        assert z["target_labels"].tolist() == ["two"] * len(X)
        assert z["predicted_labels"].tolist() == [NAMES[i] for i in np.argmax(logits, axis=1)]
