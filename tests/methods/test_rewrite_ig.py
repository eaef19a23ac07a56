"""``rewrite --method``: one ONNX file that computes the prediction and the attribution in one run of plain
onnxruntime (Integrated Gradients' steps stacked along the batch axis inside the graph). The file run in
onnxruntime == the Attributor's result (<= 1e-6 relative L2) == captum's stored golden (<= 1e-5); its outputs are
the plain model's. Runs from the committed goldens (tests/goldens/methods): no torch."""
from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort
import pytest
from click.testing import CliRunner

from onnx_lrp import InputError
from onnx_lrp.cli.main import main
from onnx_lrp.methods import Attributor
from onnx_lrp.methods.ingraph import method_model
from util import GOLDENS, rel_l2

METHODS = GOLDENS / "methods"
DATA = np.load(METHODS / "captum.npz")
INDEX = json.loads(str(DATA["index"]))


def _session(path_or_bytes):
    return ort.InferenceSession(path_or_bytes if isinstance(path_or_bytes, bytes) else str(path_or_bytes),
                                providers=["CPUExecutionProvider"])


def _run(session, feeds) -> dict:
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, feeds)))


def _case(key):
    case = INDEX[key]
    return {**case["options"], **{n: DATA[f"{key}/{n}"] for n in case["arrays"]}}


@pytest.mark.parametrize("net", ["cnn", "mlp"])
def test_rewritten_ig_file_is_captums_and_the_attributors(net, tmp_path):
    key = f"{net}/ig_gausslegendre"
    options = _case(key)
    x, target = DATA[f"{net}/x"], DATA[f"{net}/target"].astype(np.int64)
    model, out = METHODS / f"{net}.onnx", tmp_path / "ig.onnx"
    result = CliRunner().invoke(main, ["rewrite", str(model), "-o", str(out), "--method", "integrated-gradients",
                                       "--n-steps", str(options["n_steps"]), "--integration",
                                       options["integration"], "--baseline-input"])
    assert result.exit_code == 0, result.output
    session = _session(out)
    assert [i.name for i in session.get_inputs()] == ["x", "lrp/target", "lrp/baselines"]
    got = _run(session, {"x": x, "lrp/target": target, "lrp/baselines": options["baselines"]})
    ours = Attributor(str(model), "integrated-gradients", **options).attribute(x, target)
    assert rel_l2(got["lrp/relevance/x"], ours) <= 1e-6
    assert rel_l2(got["lrp/relevance/x"], DATA[f"{key}/ref"]) <= 1e-5
    np.testing.assert_array_equal(got["lrp/target_used"], target)
    plain = _run(_session(model), {"x": x})
    assert got["y"].shape == plain["y"].shape
    np.testing.assert_allclose(got["y"], plain["y"], rtol=1e-6, atol=1e-6)


def test_constant_baseline_and_argmax_target():
    x = DATA["mlp/x"]
    model = str(METHODS / "mlp.onnx")
    data = method_model(model, "integrated-gradients", n_steps=16, integration="riemann_trapezoid", baselines=0.25)
    got = _run(_session(data), {"x": x, "lrp/target": np.full(len(x), -1, np.int64)})
    plain = _run(_session(model), {"x": x})["y"]
    np.testing.assert_array_equal(got["lrp/target_used"], plain.argmax(1))
    ours = Attributor(model, "integrated-gradients", n_steps=16, integration="riemann_trapezoid",
                      baselines=0.25).attribute(x)
    assert rel_l2(got["lrp/relevance/x"], ours) <= 1e-6
    # completeness (trapezoid, 16 steps on a smooth MLP): the attribution sums to about f(x) - f(baseline)
    at_base = _run(_session(model), {"x": np.full_like(x, 0.25)})["y"]
    t = plain.argmax(1)
    gap = plain[np.arange(len(x)), t] - at_base[np.arange(len(x)), t]
    np.testing.assert_allclose(got["lrp/relevance/x"].sum(1), gap, rtol=0.05, atol=1e-3)


@pytest.mark.parametrize("key", ["cnn/saliency_abs", "mlp/ixg"])
def test_gradient_methods_in_the_graph(key):
    net = key.split("/")[0]
    case = INDEX[key]
    x, target = DATA[f"{net}/x"], DATA[f"{net}/target"].astype(np.int64)
    data = method_model(str(METHODS / f"{net}.onnx"), case["method"], **case["options"])
    got = _run(_session(data), {"x": x, "lrp/target": target})["lrp/relevance/x"]
    assert rel_l2(got, DATA[f"{key}/ref"]) <= 1e-5


def test_refusals(tmp_path):
    model = str(METHODS / "cnn.onnx")
    with pytest.raises(InputError, match="192 windows .* exceed the memory budget"):
        method_model(model, "occlusion", sliding_window_shapes=(1, 1, 1), memory_budget=2**20)
    with pytest.raises(InputError, match="do not broadcast to one item"):
        method_model(model, "integrated-gradients", baselines=np.zeros((2, 3, 8, 8), np.float32))
    for args, word in ((["--method", "gradient", "-c", "epsilon"], "--composite"),
                       (["--baseline-input"], "--method integrated-gradients"),
                       (["--method", "gradient", "--n-steps", "3"], "--n-steps")):
        result = CliRunner().invoke(main, ["rewrite", model, "-o", str(tmp_path / "m.onnx"), *args])
        err = result.stderr
        assert result.exit_code == 2 and err.count("\n") == 1 and word in err, err
        assert not (tmp_path / "m.onnx").exists()
