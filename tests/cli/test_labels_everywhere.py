"""Class names on every command that explains a class (issue 35): ``--labels FILE`` on ``evaluate``, ``trace``,
``snapshot``, ``diff``, ``concepts`` and ``concept-graph`` turns ``--target NAME`` into the class index and names
the classes in their JSON and terminal output; ``Explainer(method="gradient", labels=...)`` takes targets by name.

Oracle: the same run with the class index (same figures, same stored targets, same attribution), and the names
file itself (the name printed is the one at that index)."""
from __future__ import annotations

import json

import numpy as np
import pytest
from util import DIGIT_NAMES, ROOT, cli, ok_json

import onnx_lrp
from onnx_lrp.core.errors import InputError

MODEL = ROOT / "models" / "digits_cnn.onnx"
LAYER = "/features/features.6/Conv_output_0"
NAMES = DIGIT_NAMES
X = np.load(ROOT / "models" / "samples" / "batch.npy")[:2]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("labels_everywhere")
    (d / "names.txt").write_text("\n".join(NAMES) + "\n")  # one name per line; the model has no names of its own
    (d / "short.json").write_text(json.dumps(NAMES[:9]))
    np.save(d / "x.npy", X)
    return d


def test_trace_names_the_class(files):
    a = ok_json(cli("trace", MODEL, files / "x.npy", "--labels", files / "names.txt", "-t", "Seven", "--json"))
    b = ok_json(cli("trace", MODEL, files / "x.npy", "-t", "7", "--json"))
    assert a["target"] == 7 and a["nodes"] == b["nodes"] and a["target_label"] == NAMES[7]
    assert a["predicted_label"] == NAMES[a["predicted"]] and "target_label" not in b
    r = cli("trace", MODEL, files / "x.npy", "--labels", files / "names.txt", "-t", "7")
    assert r.exit_code == 0 and "logits[7] 'seven'" in r.stdout.splitlines()[0], r.output


def test_evaluate_names_the_classes(files):
    common = ["--patch", "8", "--steps", "2", "--json"]
    a = ok_json(cli("evaluate", MODEL, files / "x.npy", "--labels", files / "names.txt", "-t", "three,five", *common))
    b = ok_json(cli("evaluate", MODEL, files / "x.npy", "-t", "3,5", *common))
    assert a.pop("target_labels") == ["three", "five"] and "target_labels" not in b
    a.pop("seconds", None), b.pop("seconds", None)
    assert a == b


def test_snapshot_and_diff_take_names(files, tmp_path):
    r = cli("snapshot", MODEL, files / "x.npy", "-o", tmp_path / "a.npz", "--labels", files / "names.txt", "-t", "nine")
    assert r.exit_code == 0, r.output
    r = cli("snapshot", MODEL, files / "x.npy", "-o", tmp_path / "b.npz", "-t", "9")
    assert r.exit_code == 0, r.output
    with np.load(tmp_path / "a.npz", allow_pickle=False) as a, np.load(tmp_path / "b.npz", allow_pickle=False) as b:
        assert a["targets"].tolist() == [9, 9]
        for key in [k for k in b.files if k.startswith("relevance")]:
            np.testing.assert_array_equal(a[key], b[key])
    r = cli("diff", MODEL, MODEL, files / "x.npy", "--labels", files / "names.txt", "-t", "two,six")
    assert r.exit_code == 0 and "OK" in r.stdout, r.output


@pytest.mark.parametrize("cmd", ["concepts", "concept-graph"])
def test_concepts_take_names(files, cmd):
    x = files / "x.npy"
    a = ok_json(cli(cmd, MODEL, x, "--layer", LAYER, "--labels", files / "names.txt", "-t", "four", "--json"))
    b = ok_json(cli(cmd, MODEL, x, "--layer", LAYER, "-t", "4", "--json"))
    assert a.pop("target_label") == "four" and a == b and b["target"] == 4
    if cmd == "concepts":
        r = cli(cmd, MODEL, x, "--layer", LAYER, "--labels", files / "names.txt", "-t", "4")
        assert r.exit_code == 0 and "class 4 'four'" in r.stdout, r.output


@pytest.mark.parametrize("cmd, extra", [("evaluate", ["--steps", "2"]), ("trace", []),
                                        ("concepts", ["--layer", LAYER])])
def test_wrong_names_are_refused_in_one_line(files, cmd, extra):
    r = cli(cmd, MODEL, files / "x.npy", *extra, "--labels", files / "short.json", "-t", "four")
    assert r.exit_code == 2 and "9 names for the 10 classes" in r.stderr, r.output
    r = cli(cmd, MODEL, files / "x.npy", *extra, "--labels", files / "names.txt", "-t", "sevn")
    errors = [line for line in r.stderr.splitlines() if line.startswith("onnx-lrp: error: ")]
    assert r.exit_code == 2 and len(errors) == 1 and "7 'seven'" in errors[0], r.output


def test_method_explainer_takes_names(files):
    ex = onnx_lrp.Explainer(MODEL, method="gradient", labels=files / "names.txt")
    assert ex.labels == NAMES
    a, b = ex.explain(X, target="eight"), ex.explain(X, target=8)
    assert a.target.tolist() == [8, 8] and a.class_names == NAMES
    np.testing.assert_array_equal(a.relevance, b.relevance)
    with pytest.raises(InputError, match="closest: 8 'eight'"):
        ex.explain(X, target="eigth")
    with pytest.raises(InputError, match="9 names for the 10 classes"):
        onnx_lrp.Explainer(MODEL, method="gradient", labels=NAMES[:9])


def test_check_and_diff_name_changed_predictions(files, tmp_path):
    import onnx
    from onnx import numpy_helper

    m = onnx.load(MODEL)
    bias = next(t for t in m.graph.initializer if t.name == "classifier.4.bias")
    b = numpy_helper.to_array(bias).copy()
    b[2] += 1000.0  # every item now predicts class 2
    bias.CopyFrom(numpy_helper.from_array(b, bias.name))
    onnx.save(m, tmp_path / "b.onnx")
    r = cli("snapshot", MODEL, files / "x.npy", "-o", tmp_path / "base.npz")
    assert r.exit_code == 0, r.output
    predicted = np.argmax(onnx_lrp.Explainer(MODEL).explain(X).outputs["logits"], axis=1)
    want = [f"prediction changed: x.npy[{i}]: {p} {NAMES[p]!r} -> 2 'two'" for i, p in enumerate(predicted)]
    r = cli("check", tmp_path / "b.onnx", tmp_path / "base.npz", "--labels", files / "names.txt", "--report-json",
            tmp_path / "c.json")
    assert r.exit_code == 1 and [ln for ln in r.stdout.splitlines() if ln.startswith("prediction")] == want, r.output
    assert json.loads((tmp_path / "c.json").read_text())["class_names"] == NAMES
    r = cli("diff", MODEL, tmp_path / "b.onnx", files / "x.npy", "--labels", files / "names.txt")
    assert r.exit_code == 1 and [ln for ln in r.stdout.splitlines() if ln.startswith("prediction")] == want, r.output
    r = cli("check", tmp_path / "b.onnx", tmp_path / "base.npz")  # without names: the table's indices only
    assert r.exit_code == 1 and "prediction changed" not in r.stdout


def test_relmax_build_takes_one_class_by_name(files, tmp_path):
    common = ["--layer", LAYER, "--samples", "2"]
    np.save(tmp_path / "fours.npy", np.full(len(X), 4))
    r = cli("relmax", "build", MODEL, files / "x.npy", *common, "--out-dir", tmp_path / "a", "--labels",
            files / "names.txt", "-t", "four")
    assert r.exit_code == 0, r.output
    r = cli("relmax", "build", MODEL, files / "x.npy", *common, "--out-dir", tmp_path / "b", "--labels",
            tmp_path / "fours.npy")
    assert r.exit_code == 0, r.output
    with np.load(tmp_path / "a" / "relmax.npz") as a, np.load(tmp_path / "b" / "relmax.npz") as b:
        assert a.files == b.files
        for k in a.files:
            np.testing.assert_array_equal(a[k], b[k])
    r = cli("relmax", "build", MODEL, files / "x.npy", *common, "--out-dir", tmp_path / "c", "--labels",
            tmp_path / "fours.npy", "-t", "4")
    assert r.exit_code == 2 and "give one of them" in r.output and not (tmp_path / "c").exists()
