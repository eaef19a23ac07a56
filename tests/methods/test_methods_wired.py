"""The newer methods behind the Explainer and the command line: ``Explainer(model, method="grad-cam" / "rise" /
"expected-gradients" / "gradient-shap")`` returns an Explanation equal to captum's stored goldens (LayerGradCam +
interpolate, GradientShap with the same draws) or to an exact property (RISE with every mask all ones is f(x) at
every entry); ``explain --method`` writes what the API returns for the same options and seed; a missing or misplaced
option is one line, exit 2, nothing written; ``evaluate --methods`` runs every method side by side and names
grad-cam's default layer (the model's last N x C x H x W tensor). Runs from the committed goldens: no torch."""
from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from onnx_lrp import Explainer
from onnx_lrp.cli.main import main
from util import GOLDENS, assert_cli_refuses, assert_close, rel_l2

METHODS = GOLDENS / "methods"
DATA = np.load(METHODS / "captum_more.npz")
INDEX = json.loads(str(DATA["index"]))
CNN = str(METHODS / "cnn.onnx")
X, TARGET = DATA["cnn/x"], DATA["cnn/target"]
LAST_SPATIAL = "/Relu_1_output_0"  # cnn.onnx: conv -> relu -> pool -> conv2 -> relu (N x 8 x 2 x 2) -> flatten


def _case(key):
    case = INDEX[key]
    return case["method"], {**case["options"], **{n: DATA[f"{key}/{n}"] for n in case["arrays"]}}


@pytest.mark.parametrize("key", ["cnn/grad_cam_0", "cnn/grad_cam_1", "cnn/gradient_shap", "cnn/expected_gradients"])
def test_explainer_is_captums(key):
    method, options = _case(key)
    e = Explainer(CNN, method=method, **options).explain(X, target=TARGET)
    ref = DATA[f"{key}/ref"]
    assert e.relevance.shape == ref.shape and e.relevance.dtype == np.float32
    assert rel_l2(e.relevance, ref) <= 1e-5
    np.testing.assert_array_equal(e.target, TARGET)
    y = e.outputs[e.explained_output]
    np.testing.assert_array_equal(e.explained_value, y[np.arange(len(X)), TARGET])


def test_grad_cam_map_is_n_x_1_x_spatial_and_one_item_drops_the_batch_axis():
    ex = Explainer(CNN, method="grad-cam", layer="/conv2/Conv_output_0")
    whole = ex.explain(X)
    assert whole.relevance.shape == (len(X), 1) + X.shape[2:]
    one = ex.explain(X[1])
    assert one.relevance.shape == (1,) + X.shape[2:] and int(one.target) == int(whole.target[1])
    assert_close(one.relevance, whole.relevance[1], rtol=1e-6)


def test_rise_with_masks_all_ones_is_the_output_everywhere():
    """S = sum_i f(x * M_i) M_i / (n p): with every mask 1 and p = 1 that is f(x)[target] at every entry."""
    masks = np.ones((3,) + X.shape[2:], np.float32)
    e = Explainer(CNN, method="rise", masks=masks, probability=1.0).explain(X, target=TARGET)
    assert e.relevance.shape == (len(X), 1) + X.shape[2:]
    expected = np.broadcast_to(e.explained_value.reshape(-1, 1, 1, 1), e.relevance.shape)
    assert_close(e.relevance, expected, rtol=1e-6)


def _explain(tmp_path, *args):
    x_path = tmp_path / "x.npy"
    np.save(x_path, X)
    out = tmp_path / "out.npz"
    result = CliRunner().invoke(main, ["explain", CNN, str(x_path), "-t", ",".join(map(str, TARGET)), "-o",
                                       str(out), "--json", *args])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["method"] == args[1]
    return np.load(out)["relevance"]


def test_cli_writes_what_the_api_returns(tmp_path):
    layer = INDEX["cnn/grad_cam_1"]["options"]["layer"]
    got = _explain(tmp_path, "--method", "grad-cam", "--layer", layer, "--relu-attributions")
    api = Explainer(CNN, method="grad-cam", layer=layer, relu_attributions=True).explain(X, target=TARGET)
    np.testing.assert_array_equal(got, api.relevance)
    assert got.min() >= 0 and got.shape == (len(X), 1) + X.shape[2:]
    got = _explain(tmp_path, "--method", "rise", "--n-masks", "16", "--probability", "0.4", "--seed", "3",
                   "--baselines", "0.1")
    api = Explainer(CNN, method="rise", n_masks=16, probability=0.4, seed=3, baselines=0.1).explain(X, target=TARGET)
    np.testing.assert_array_equal(got, api.relevance)
    background = DATA["cnn/gradient_shap/baselines"]
    np.save(tmp_path / "bg.npy", background)
    got = _explain(tmp_path, "--method", "gradient-shap", "--baselines", str(tmp_path / "bg.npy"), "--n-samples",
                   "4", "--stdevs", "0.2", "--seed", "7")
    api = Explainer(CNN, method="gradient-shap", baselines=background, n_samples=4, stdevs=0.2, seed=7)
    np.testing.assert_array_equal(got, api.explain(X, target=TARGET).relevance)


def _refused(tmp_path, args, *words):
    np.save(tmp_path / "x.npy", X)
    assert_cli_refuses(["explain", CNN, tmp_path / "x.npy", "-o", tmp_path / "r.npy", *args], tmp_path, *words)


@pytest.mark.parametrize("args,words", [
    (["--method", "grad-cam"], ["grad-cam needs --layer"]),
    (["--layer", "/conv2/Conv_output_0"], ["--layer", "--method"]),
    (["--method", "rise", "--layer", "/conv2/Conv_output_0"], ["--layer is for --method grad-cam"]),
    (["--method", "gradient", "--n-masks", "4"], ["--n-masks is for --method rise"]),
    (["--method", "grad-cam", "--layer", "/Flatten_output_0"], ["'/Flatten_output_0'", "2 x 32", "spatial"]),
    (["--method", "grad-cam", "--layer", "nope"], ["'nope'"]),
    (["--method", "expected-gradients", "--baselines", "0"], ["--baselines FILE.npy", "background"]),
    (["--method", "rise", "--probability", "0"], ["--probability"]),
])
def test_cli_refusals_one_line(tmp_path, args, words):
    _refused(tmp_path, args, *words)


def test_evaluate_side_by_side_names_grad_cams_layer(tmp_path):
    np.save(tmp_path / "x.npy", X)
    names = ["lrp", "integrated-gradients", "smoothgrad", "occlusion", "grad-cam", "rise"]
    args = ["evaluate", CNN, str(tmp_path / "x.npy"), "--methods", ",".join(names), "--patch", "2"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    rows = [line.split()[0] for line in result.stdout.splitlines() if line.startswith("  ")][1:]
    assert rows == names
    assert f"grad-cam at {LAST_SPATIAL} (the last spatial tensor" in result.stdout
    result = CliRunner().invoke(main, args + ["--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["methods"]["grad-cam"]["layer"] == LAST_SPATIAL


def test_evaluate_layer_names_grad_cams_tensor_and_is_refused_without_it(tmp_path):
    np.save(tmp_path / "x.npy", X)
    args = ["evaluate", CNN, str(tmp_path / "x.npy"), "--layer", "/conv2/Conv_output_0"]
    result = CliRunner().invoke(main, args + ["--methods", "lrp,grad-cam", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["methods"]["grad-cam"]["layer"] == "/conv2/Conv_output_0"
    for extra in ([], ["--methods", "lrp,rise"]):
        result = CliRunner().invoke(main, args + extra)
        err = result.stderr
        assert result.exit_code == 2 and err.count("\n") == 1 and "--layer" in err and "grad-cam" in err, err


def test_evaluate_grad_cam_without_spatial_axes_refused(tmp_path):
    x = np.load(METHODS / "captum.npz")["mlp/x"]
    np.save(tmp_path / "x.npy", x)
    result = CliRunner().invoke(main, ["evaluate", str(METHODS / "mlp.onnx"), str(tmp_path / "x.npy"), "--methods",
                                       "lrp,grad-cam"])
    assert result.exit_code == 2 and result.stderr.count("\n") == 1 and "spatial" in result.stderr, result.output
