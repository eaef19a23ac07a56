"""``--target NAME`` beyond ``explain`` (issue 35, point 3): ``evaluate``, ``trace``, ``snapshot`` and ``diff`` take a
class name from the config.json beside the model and give what the class index gives (same JSON figures, same
stored targets); a name the model does not have is refused in one line naming the closest class."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from util import DIGIT_NAMES, ROOT, cli, ok_json


NAMES = DIGIT_NAMES
X = np.load(ROOT / "models" / "samples" / "batch.npy")[:2]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    d = tmp_path_factory.mktemp("named")
    shutil.copy(ROOT / "models" / "digits_cnn.onnx", d / "digits.onnx")
    (d / "config.json").write_text(json.dumps({"id2label": {str(i): n for i, n in enumerate(NAMES)}}))
    np.save(d / "x.npy", X)
    return d


def test_trace_by_name_is_trace_by_index(folder):
    a = ok_json(cli("trace", folder / "digits.onnx", folder / "x.npy", "--target", "Seven", "--json"))
    b = ok_json(cli("trace", folder / "digits.onnx", folder / "x.npy", "--target", "7", "--json"))
    assert a["target"] == 7 and a["nodes"] == b["nodes"]


def test_evaluate_by_name_is_evaluate_by_index(folder):
    common = ["--patch", "8", "--steps", "2", "--json"]
    a = ok_json(cli("evaluate", folder / "digits.onnx", folder / "x.npy", "--target", "three,five", *common))
    b = ok_json(cli("evaluate", folder / "digits.onnx", folder / "x.npy", "--target", "3,5", *common))
    a.pop("seconds", None), b.pop("seconds", None)
    assert a == b


def test_snapshot_and_diff_by_name(folder, tmp_path):
    r = cli("snapshot", folder / "digits.onnx", folder / "x.npy", "-o", tmp_path / "b.npz", "--target", "nine")
    assert r.exit_code == 0, (r.output, r.stderr)
    with np.load(tmp_path / "b.npz", allow_pickle=False) as z:
        assert z["targets"].tolist() == [9, 9]
    r = cli("diff", folder / "digits.onnx", folder / "digits.onnx", folder / "x.npy", "--target", "nine")
    assert r.exit_code == 0, (r.output, r.stderr)


@pytest.mark.parametrize("cmd", ["trace", "evaluate"])
def test_a_miss_names_the_closest_class(folder, cmd):
    r = cli(cmd, folder / "digits.onnx", folder / "x.npy", "--target", "sevn")
    assert r.exit_code == 2, (r.output, r.stderr)
    errors = [line for line in r.stderr.splitlines() if line.startswith("onnx-lrp: error: ")]
    assert len(errors) == 1 and "'sevn' is not a class" in errors[0] and "7 'seven'" in errors[0], r.stderr
