"""``evaluate --methods``: the methods side by side on one faithfulness metric. Each method's row is what
``onnx_lrp.evaluate`` gives for that method's attribution computed on its own (the Attributor, LRP's Explainer),
the random floor is one for all, the picture has a column per method, and the refusals are one line. Runs from
the committed goldens (tests/goldens/methods)."""
from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

import onnx_lrp
from onnx_lrp.cli.main import main
from onnx_lrp.methods import Attributor
from util import GOLDENS

CNN = str(GOLDENS / "methods" / "cnn.onnx")
X = np.load(GOLDENS / "methods" / "captum.npz")["cnn/x"]
METRIC = ["--patch", "2", "--steps", "6", "--seed", "3"]


@pytest.fixture(scope="module")
def side_by_side(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cmp")
    np.save(tmp / "x.npy", X)
    result = CliRunner().invoke(main, ["evaluate", CNN, str(tmp / "x.npy"), "--methods",
                                       "lrp,integrated-gradients,occlusion", "-c", "epsilon", *METRIC,
                                       "--plot", str(tmp / "cmp.png"), "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout), tmp


def _direct(relevance, target):
    return onnx_lrp.evaluate(CNN, X, target=target, relevance=relevance, patch=2, steps=6, seed=3,
                             composite="epsilon").summary()


def test_each_row_is_evaluate_of_that_methods_attribution(side_by_side):
    out, _ = side_by_side
    rows = out["methods"]
    assert list(rows) == ["lrp", "integrated-gradients", "occlusion"]
    lrp = onnx_lrp.Explainer(CNN, composite="epsilon").explain(X)
    target = np.asarray(lrp.target)
    for row in rows.values():
        assert row["target"] == target.tolist()
    ig = Attributor(CNN, "integrated-gradients", n_steps=32, baselines=0.0).attribute(X, target)
    occ = Attributor(CNN, "occlusion", sliding_window_shapes=(3, 2, 2), strides=(1, 1, 1)).attribute(X, target)
    for name, relevance in (("lrp", lrp.relevance), ("integrated-gradients", ig), ("occlusion", occ)):
        want = _direct(relevance, target)
        got = rows[name]["summary"]
        for key in ("aopc/morf", "aopc/lerf", "abpc", "aopc/random"):
            np.testing.assert_allclose(got[key], want[key], rtol=1e-6, atol=1e-7, err_msg=f"{name} {key}")
        assert rows[name]["seconds_per_item"] > 0
    floors = {row["summary"]["aopc/random"] for row in rows.values()}
    assert len(floors) == 1  # one seeded random order for all: the same floor


def test_picture_has_a_column_per_method(side_by_side):
    _, tmp = side_by_side
    image = Image.open(tmp / "cmp.png")
    one = Image.open(_single_picture(tmp))
    # three tiles per row instead of one: about three times as wide, as tall (two rows of items either way)
    assert 2.5 < image.width / one.width < 3.5


def _single_picture(tmp):
    from onnx_lrp.cli import compare

    col = compare.Column("lrp", None, relevance=np.zeros_like(X))
    path = tmp / "one.png"
    compare.picture([col], X, ["a", "b"]).save(path)
    return path


def test_table_names_every_method(side_by_side):
    _, tmp = side_by_side
    result = CliRunner().invoke(main, ["evaluate", CNN, str(tmp / "x.npy"), "--methods", "gradient,epsilon",
                                       *METRIC])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert "ABPC" in lines[1] and "AOPC random" in lines[1] and "s / item" in lines[1]
    assert lines[2].split()[0] == "gradient" and lines[3].split()[0] == "epsilon"


@pytest.mark.parametrize("args,word", [
    (["--methods", "lrp,gradient", "-m", "randomisation"], "randomisation"),
    (["--methods", "lrp,lrp"], "distinct"),
    (["--methods", "lrp,nonsense"], "nonsense"),
])
def test_refusals_one_line(side_by_side, args, word):
    _, tmp = side_by_side
    result = CliRunner().invoke(main, ["evaluate", CNN, str(tmp / "x.npy"), *args])
    err = result.stderr
    assert result.exit_code == 2 and err.count("\n") == 1 and word in err, err
