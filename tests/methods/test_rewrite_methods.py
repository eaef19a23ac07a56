"""``rewrite --method`` for every method: the written ONNX file, run in plain onnxruntime with the random parts fed
as its inputs (lrp/noise, lrp/baseline_indices, lrp/alphas, lrp/baselines, lrp/masks), gives captum 0.9's stored
result for the same draws (tests/goldens/methods: captum.npz, captum_more.npz, and on a ResNet-, a BERT-shaped
model and an LSTM parity_models.npz, zennit's Occlusion there too; <= 1e-5 relative L2) and the
Attributor's (occlusion and RISE to float rounding); its outputs are the plain model's; a model with external data
is written as OUT + OUT.data that runs from the file; bad input is refused in one line, exit 2, nothing written.
No torch: the goldens are committed."""
from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner

from onnx_lrp import InputError
from onnx_lrp.cli.main import main
from onnx_lrp.methods import Attributor
from onnx_lrp.methods.ingraph import METHOD_INPUTS, method_model, save_method_model
from util import GOLDENS, assert_close, rel_l2

METHODS = GOLDENS / "methods"
CAPTUM = np.load(METHODS / "captum.npz")
MORE = np.load(METHODS / "captum_more.npz")
CNN, MLP = str(METHODS / "cnn.onnx"), str(METHODS / "mlp.onnx")


def _run(model, feeds: dict) -> dict:
    s = ort.InferenceSession(model if isinstance(model, bytes) else str(model), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in s.get_outputs()], s.run(None, feeds)))


def _golden(data, key):
    case = json.loads(str(data["index"]))[key]
    return case["method"], case["options"], {n: data[f"{key}/{n}"] for n in case["arrays"]}, data[f"{key}/ref"]


def _xt(net):
    return CAPTUM[f"{net}/x"], CAPTUM[f"{net}/target"].astype(np.int64)


# (golden file, key, the written model's feeds from the golden's arrays, options the model is built with)
GOLDEN_CASES = [
    (CAPTUM, "cnn/smoothgrad", lambda a: {"lrp/noise": a["noise"]}, {}),
    (CAPTUM, "mlp/smoothgrad_sq", lambda a: {"lrp/noise": a["noise"]}, {}),
    (CAPTUM, "cnn/vargrad", lambda a: {"lrp/noise": a["noise"]}, {}),
    (MORE, "cnn/gradient_shap", lambda a: {"lrp/noise": a["noise"], "lrp/baseline_indices": a["baseline_indices"],
                                           "lrp/alphas": a["alphas"], "lrp/baselines": a["baselines"]},
     {"stdevs": 0.1}),
    (MORE, "mlp/expected_gradients", lambda a: {"lrp/baseline_indices": a["baseline_indices"],
                                                "lrp/alphas": a["alphas"]}, "background"),
    (MORE, "cnn/grad_cam_0", lambda a: {}, {}),
    (MORE, "cnn/grad_cam_1", lambda a: {}, {}),
    (CAPTUM, "cnn/occlusion_2", lambda a: {}, {}),
    (CAPTUM, "mlp/occlusion_1", lambda a: {}, {}),
]


@pytest.mark.parametrize("data,key,feeds,build", GOLDEN_CASES, ids=[c[1] for c in GOLDEN_CASES])
def test_written_model_is_captums(data, key, feeds, build):
    net = key.split("/")[0]
    method, options, arrays, ref = _golden(data, key)
    x, t = _xt(net)
    baseline_input = "lrp/baselines" in feeds(arrays)
    if build == "background":
        build = {"baselines": arrays["baselines"]}
    written = method_model(str(METHODS / f"{net}.onnx"), method, baseline_input, **options, **build)
    fed = {k: v.astype(np.float32 if v.dtype.kind == "f" else np.int64) for k, v in feeds(arrays).items()}
    inputs = [i.name for i in onnx.load_from_string(written).graph.input]
    assert inputs[:2] == ["x", "lrp/target"] and set(inputs[2:]) == set(fed) <= set(METHOD_INPUTS.get(method, ()))
    got = _run(written, {"x": x, "lrp/target": t, **fed})
    assert got["lrp/relevance/x"].shape == ref.shape and got["lrp/relevance/x"].dtype == np.float32
    if method == "occlusion":  # exact up to float rounding
        assert_close(got["lrp/relevance/x"], ref, rtol=1e-5, atol=1e-6)
    else:
        assert rel_l2(got["lrp/relevance/x"], ref) <= 1e-5
    np.testing.assert_array_equal(got["lrp/target_used"], t)


def _attributor_case(method, options, feeds, given):
    x, t = _xt("cnn")
    got = _run(method_model(CNN, method, **options), {"x": x, "lrp/target": t, **feeds})
    ref = Attributor(CNN, method, **options, **given).attribute(x, t)
    return got, ref


def test_smoothgrad_over_integrated_gradients_and_gradient_x_input():
    rng = np.random.default_rng(1)
    noise = rng.normal(0, 0.2, (3, 2, 3, 8, 8)).astype(np.float32)
    for base, base_options in (("integrated-gradients", {"n_steps": 4, "baselines": 0.1}),
                               ("gradient-x-input", {})):
        options = {"base": base, "base_options": base_options, "nt_type": "smoothgrad_sq"}
        got, ref = _attributor_case("smoothgrad", options, {"lrp/noise": noise}, {"noise": noise})
        assert rel_l2(got["lrp/relevance/x"], ref) <= 1e-5


def test_rise_masks_as_input_and_as_constant():
    rng = np.random.default_rng(2)
    masks = (rng.random((9, 8, 8)) < 0.5).astype(np.float32)
    got, ref = _attributor_case("rise", {"probability": 0.5, "baselines": 0.2}, {"lrp/masks": masks},
                                {"masks": masks})
    assert got["lrp/relevance/x"].shape == (2, 1, 8, 8)
    assert_close(got["lrp/relevance/x"], ref, rtol=1e-6)
    got, ref = _attributor_case("rise", {"masks": masks, "probability": 0.5}, {}, {})
    assert_close(got["lrp/relevance/x"], ref, rtol=1e-6)
    got, ref = _attributor_case("rise", {"seed": 5, "n_masks": 12, "cells": 3}, {}, {})  # drawn as the Attributor
    assert_close(got["lrp/relevance/x"], ref, rtol=1e-6)
    x, _ = _xt("cnn")  # the model's outputs at the input, the arg-max target when -1
    plain = _run(CNN, {"x": x})["y"]
    out = _run(method_model(CNN, "rise", masks=masks), {"x": x, "lrp/target": np.full(2, -1, np.int64)})
    assert_close(out["y"], plain, rtol=1e-6)
    np.testing.assert_array_equal(out["lrp/target_used"], plain.argmax(1))


def test_seeded_noise_in_the_graph():
    """RandomNormalLike(seed) in the graph: with stdevs 1e-30 every sample is the input (in float32), SmoothGrad
    the gradient; with stdevs 0 (no normal drawn: onnxruntime aborts on a scale of 0) too."""
    x, t = _xt("mlp")
    ref = Attributor(MLP, "gradient").attribute(x, t)
    for stdevs in (1e-30, 0.0):
        got = _run(method_model(MLP, "smoothgrad", seed=3, stdevs=stdevs, nt_samples=4), {"x": x, "lrp/target": t})
        assert rel_l2(got["lrp/relevance/x"], ref) <= 1e-6
    noisy = _run(method_model(MLP, "vargrad", seed=3, stdevs=0.5, nt_samples=4), {"x": x, "lrp/target": t})
    v = noisy["lrp/relevance/x"]
    assert np.all(np.isfinite(v)) and np.all(v >= -1e-12 * np.abs(v).max()) and np.any(v > 0)


def test_seeded_draws_in_the_graph_are_the_attributors_given_them():
    """Expected Gradients with seed=: the draws made in the graph (read back as extra outputs) lie in range, and
    the attribution is the Attributor's given those draws."""
    x, t = _xt("mlp")
    background = np.random.default_rng(4).normal(0, 1, (5, 10)).astype(np.float32)
    proto = onnx.load_from_string(method_model(MLP, "expected-gradients", baselines=background, seed=7,
                                               n_samples=6))
    names = ["lrp/method/expected_gradients/alphas", "lrp/method/expected_gradients/baseline_indices"]
    proto.graph.output.extend(onnx.helper.make_empty_tensor_value_info(n) for n in names)
    got = _run(proto.SerializeToString(), {"x": x, "lrp/target": t})
    alphas, index = got[names[0]], got[names[1]]
    assert alphas.shape == index.shape == (6, 3) and np.all((alphas >= 0) & (alphas < 1))
    assert np.all((index >= 0) & (index < 5)) and len(np.unique(index)) > 1
    ref = Attributor(MLP, "expected-gradients", baselines=background, alphas=alphas.astype(np.float64),
                     baseline_indices=index).attribute(x, t)
    assert rel_l2(got["lrp/relevance/x"], ref) <= 1e-5


def test_external_data_written_beside(tmp_path):
    proto = onnx.load(CNN)
    onnx.save_model(proto, tmp_path / "m.onnx", save_as_external_data=True, location="m.onnx.data",
                    size_threshold=0)
    model, out = str(tmp_path / "m.onnx"), tmp_path / "occ.onnx"
    before = (tmp_path / "m.onnx.data").read_bytes()
    result = CliRunner().invoke(main, ["rewrite", model, "-o", str(out), "--method", "occlusion",
                                       "--sliding-window-shapes", "3,3,3", "--strides", "1,2,2"])
    assert result.exit_code == 0, result.output
    assert "occ.onnx.data" in result.stdout and (tmp_path / "occ.onnx.data").exists()
    x, t = _xt("cnn")
    got = _run(out, {"x": x, "lrp/target": t})["lrp/relevance/x"]
    ref = Attributor(model, "occlusion", sliding_window_shapes=(3, 3, 3), strides=(1, 2, 2)).attribute(x, t)
    assert_close(got, ref, rtol=1e-5, atol=1e-6)
    names, large = save_method_model(model, tmp_path / "ig.onnx", "integrated-gradients", n_steps=3)
    assert large and names == ["x", "lrp/target"] and (tmp_path / "ig.onnx.data").exists()
    bad = CliRunner().invoke(main, ["rewrite", model, "-o", model, "--method", "gradient"])
    assert bad.exit_code == 2 and bad.stderr.count("\n") == 1 and "is the input model" in bad.stderr
    assert (tmp_path / "m.onnx.data").read_bytes() == before


@pytest.mark.parametrize("args,words", [
    (["--method", "rise", "--n-steps", "3"], "--n-steps is for --method integrated-gradients"),
    (["--method", "grad-cam", "--layer", "/conv2/Conv_output_0", "--baseline-input"], "not grad-cam"),
    (["--method", "smoothgrad", "--base", "occlusion"], "base 'occlusion' cannot be smoothed"),
    (["--method", "occlusion", "--sliding-window-shapes", "1,1,1", "--memory-budget", "1"],
     "192 windows of one item"),
    (["--method", "gradient-shap", "--baseline-input", "--baselines", "0.5"], "do not give them too"),
    (["--method", "occlusion", "--sliding-window-shapes", "4,8,8"], "larger than the input"),
])
def test_refusals_one_line(tmp_path, args, words):
    out = tmp_path / "m.onnx"
    result = CliRunner().invoke(main, ["rewrite", CNN, "-o", str(out), *args])
    assert result.exit_code == 2 and result.stderr.count("\n") == 1 and words in result.stderr, result.stderr
    assert not out.exists()


def test_draws_given_as_options_refused():
    with pytest.raises(InputError, match="lrp/alphas"):
        method_model(MLP, "expected-gradients", baselines=np.zeros((2, 10), np.float32), alphas=np.ones(3))


PARITY = np.load(METHODS / "parity_models.npz")
_FED = {"noise": "lrp/noise", "baseline_indices": "lrp/baseline_indices", "alphas": "lrp/alphas"}


@pytest.mark.parametrize("key", ["resnet/grad_cam_1", "resnet/gradient_shap", "bert/ig_riemann_trapezoid",
                                 "lstm/smoothgrad", "plain_cnn/zennit_occlusion", "plain_cnn/zennit_smoothgrad_epf"])
def test_larger_models_match_captum_and_zennit(key):
    """A ResNet-shaped network with BatchNorm, a BERT-shaped classifier at its embeddings (LayerNorm, GELU), an
    LSTM, and zennit's Occlusion and SmoothGrad of EpsilonPlusFlat (an LRP composite's relevance model at the noisy
    rows): the written file against the stored captum / zennit result."""
    net = key.split("/")[0]
    method, options, arrays, ref = _golden(PARITY, key)
    x, t = PARITY[f"{net}/x"].astype(np.float32), PARITY[f"{net}/target"].astype(np.int64)
    feeds = {_FED[k]: v.astype(np.int64 if v.dtype.kind in "iu" else np.float32) for k, v in arrays.items()
             if k in _FED}
    given = {k: v.astype(np.float32) for k, v in arrays.items() if k not in _FED}
    if method == "integrated-gradients":
        feeds["lrp/baselines"] = given.pop("baselines")
    if method == "gradient-shap":
        options = {**options, "stdevs": 0.1}  # the noise is fed: an input
    written = method_model(str(METHODS / f"{net}.onnx"), method, "lrp/baselines" in feeds, **options, **given)
    got = _run(written, {"x": x, "lrp/target": t, **feeds})["lrp/relevance/x"]
    assert rel_l2(got, ref) <= (2e-5 if method == "occlusion" else 1e-5)
