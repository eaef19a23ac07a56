"""The way in to the methods (issue 36): ``Explainer(model, method=...)`` returns an Explanation whose relevance is
the method's attribution (== captum's stored golden, == the Attributor's), ``explain --method`` writes the same
arrays as the API, ``method=`` also takes a composite name, and the refusals are one line (exit 2 on the command
line). Runs from the committed goldens (tests/goldens/methods): no torch."""
from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from onnx_lrp import Explainer, InputError, UnsupportedError
from onnx_lrp.cli.main import main
from onnx_lrp.methods import Attributor
from util import GOLDENS, assert_cli_refuses, f32_tol, make_model, node, rel_l2, to_bytes

METHODS = GOLDENS / "methods"
DATA = np.load(METHODS / "captum.npz")
INDEX = json.loads(str(DATA["index"]))
CNN = str(METHODS / "cnn.onnx")
X, TARGET = DATA["cnn/x"], DATA["cnn/target"]


def _case(key):
    case = INDEX[key]
    return case["method"], {**case["options"], **{n: DATA[f"{key}/{n}"] for n in case["arrays"]}}


@pytest.fixture(scope="module")
def ig():
    method, options = _case("cnn/ig_riemann_trapezoid")
    return Explainer(CNN, method=method, **options), options


def test_explainer_method_is_captums_integrated_gradients(ig):
    ex, options = ig
    e = ex.explain(X, target=TARGET)
    ref = DATA["cnn/ig_riemann_trapezoid/ref"]
    assert e.relevance.shape == X.shape and e.relevance.dtype == np.float32
    assert rel_l2(e.relevance, ref) <= 1e-5
    np.testing.assert_array_equal(e.relevance, Attributor(CNN, "integrated-gradients", **options).attribute(X, TARGET))
    np.testing.assert_array_equal(e.target, TARGET)
    y = e.outputs[e.explained_output]
    np.testing.assert_array_equal(e.explained_value, y[np.arange(len(X)), TARGET])


def test_one_item_without_batch_axis_and_argmax():
    ex = Explainer(CNN, method="integrated-gradients", n_steps=8, baselines=0.0)
    whole = ex.explain(X)
    one = ex.explain(X[1])
    assert not one.batched and one.relevance.shape == X.shape[1:]
    assert int(one.target) == int(np.argmax(whole.outputs[whole.explained_output][1]))
    np.testing.assert_allclose(one.relevance, whole.relevance[1], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("key", ["cnn/saliency_abs", "cnn/ixg", "cnn/occlusion_1"])
def test_other_methods_through_the_explainer(key):
    method, options = _case(key)
    got = Explainer(CNN, method=method, **options).explain(X, target=TARGET).relevance
    ref = DATA[f"{key}/ref"].astype(np.float64)
    if method == "occlusion":
        np.testing.assert_allclose(got, ref, rtol=0, atol=np.abs(ref).max() * 4e-6)
    else:
        assert rel_l2(got, ref) <= 1e-5


def test_method_takes_a_composite_name():
    by_method = Explainer(CNN, method="epsilon")
    assert type(by_method) is Explainer and by_method.composite_name == "epsilon"
    np.testing.assert_array_equal(by_method.explain(X, target=TARGET).relevance,
                                  Explainer(CNN, composite="epsilon").explain(X, target=TARGET).relevance)


def test_cli_writes_what_the_api_returns(ig, tmp_path):
    ex, options = ig
    np.save(tmp_path / "x.npy", X)
    np.save(tmp_path / "b.npy", options["baselines"])
    out = tmp_path / "ig.npz"
    result = CliRunner().invoke(main, ["explain", CNN, str(tmp_path / "x.npy"), "--method", "integrated-gradients",
                                       "--n-steps", str(options["n_steps"]), "--integration", options["integration"],
                                       "--baselines", str(tmp_path / "b.npy"), "--target",
                                       ",".join(map(str, TARGET)), "-o", str(out), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["method"] == "integrated-gradients"
    saved = np.load(out)
    api = ex.explain(X, target=TARGET)
    np.testing.assert_array_equal(saved["relevance"], api.relevance)
    np.testing.assert_array_equal(saved["targets"], TARGET)


def _refused(args, tmp_path, *words):
    np.save(tmp_path / "x.npy", X)
    assert_cli_refuses(["explain", CNN, tmp_path / "x.npy", "-o", tmp_path / "r.npy", *args], tmp_path, *words)


@pytest.mark.parametrize("args,words", [
    (["--n-steps", "4"], ["--n-steps", "--method"]),
    (["--method", "gradient", "--n-steps", "4"], ["--n-steps", "integrated-gradients"]),
    (["--method", "occlusion", "--sliding-window-shapes", "3,9,9"], ["larger than the input", "3 x 8 x 8"]),
    (["--method", "integrated-gradients", "--start", "one-hot"], ["--start one-hot", "LRP"]),
    (["--method", "integrated-gradients", "-c", "epsilon"], ["--composite", "LRP"]),
    (["--method", "gradient", "--epsilon", "0.1"], ["epsilon", "LRP"]),
    (["--method", "occlusion", "--sliding-window-shapes", "3,x"], ["--sliding-window-shapes"]),
])
def test_cli_refusals_one_line(args, words, tmp_path):
    _refused(args, tmp_path, *words)


def test_api_refusals():
    with pytest.raises(InputError, match="takes no composite"):
        Explainer(CNN, "epsilon", method="integrated-gradients")
    with pytest.raises(InputError, match="n_step"):
        Explainer(CNN, method="gradient", n_steps=3)


def _argmax_model() -> bytes:
    """y = (x W) * argmax(x V): the output reaches x through an ArgMax."""
    rng = np.random.default_rng(0)
    return to_bytes(make_model(
        [node("MatMul", ["x", "W"], "a"), node("MatMul", ["x", "V"], "b"),
         node("ArgMax", ["b"], "k", name="pick", axis=1, keepdims=1), node("Cast", ["k"], "kf", to=1),
         node("Mul", ["a", "kf"], "y")],
        {"x": ["N", 4]}, ["y"], {"W": rng.normal(size=(4, 3)).astype(np.float32),
                                 "V": rng.normal(size=(4, 2)).astype(np.float32)}))


def _ids_model() -> bytes:
    """Token ids -> an embedding -> a mean -> logits: an int64 input."""
    rng = np.random.default_rng(1)
    return to_bytes(make_model(
        [node("Gather", ["E", "ids"], "e", axis=0), node("ReduceMean", ["e"], "m", axes=[1], keepdims=0),
         node("MatMul", ["m", "W"], "y")],
        {"ids": (["N", 3], np.int64)}, ["y"], {"E": rng.normal(size=(10, 4)).astype(np.float32),
                                               "W": rng.normal(size=(4, 2)).astype(np.float32)}))


def test_gradient_through_argmax_refused_naming_the_node(tmp_path):
    path = tmp_path / "argmax.onnx"
    path.write_bytes(_argmax_model())
    with pytest.raises(UnsupportedError) as exc:
        Explainer(str(path), method="integrated-gradients")
    text = str(exc.value)
    assert "pick" in text and "ArgMax" in text and "\n" not in text.strip()
    np.save(tmp_path / "x.npy", np.ones((1, 4), np.float32))
    result = CliRunner().invoke(main, ["explain", str(path), str(tmp_path / "x.npy"), "--method", "gradient"])
    assert result.exit_code == 2 and "pick" in result.stderr and result.stderr.count("\n") == 1, result.stderr


def test_integrated_gradients_of_token_ids_refused(tmp_path):
    path = tmp_path / "ids.onnx"
    path.write_bytes(_ids_model())
    with pytest.raises(InputError) as exc:
        Explainer(str(path), method="integrated-gradients")
    assert "'ids'" in str(exc.value) and "int64" in str(exc.value) and "\n" not in str(exc.value)


def test_snapshot_and_check_pin_a_methods_attributions(ig, tmp_path):
    """snapshot --method stores the method's attributions (== the API's) and its options; check recomputes them
    (exit 0), and a changed attribution is relevance drift (exit 1)."""
    ex, options = ig
    np.save(tmp_path / "x.npy", X)
    snap = tmp_path / "snap.npz"
    result = CliRunner().invoke(main, ["snapshot", CNN, str(tmp_path / "x.npy"), "-o", str(snap), "--method",
                                       "occlusion", "--sliding-window-shapes", "3,2,2", "--strides", "2"])
    assert result.exit_code == 0, result.output
    stored = dict(np.load(snap))
    api = Explainer(CNN, method="occlusion", sliding_window_shapes=(3, 2, 2), strides=2).explain(X)
    np.testing.assert_array_equal(stored["relevance/x"], api.relevance)
    assert CliRunner().invoke(main, ["check", CNN, str(snap)]).exit_code == 0
    stored["relevance/x"] = stored["relevance/x"] * np.float32(-1)
    np.savez(tmp_path / "drifted.npz", **stored)
    result = CliRunner().invoke(main, ["check", CNN, str(tmp_path / "drifted.npz")])
    assert result.exit_code == 1 and "relevance" in result.stdout, result.output


def test_dataset_engine_writes_the_methods_attributions(ig, tmp_path):
    ex, options = ig
    np.save(tmp_path / "x.npy", X)
    out = tmp_path / "out"
    args = ["explain", CNN, str(tmp_path / "x.npy"), "--out-dir", str(out), "--method", "integrated-gradients",
            "--n-steps", "8"]
    assert CliRunner().invoke(main, args).exit_code == 0
    from onnx_lrp.dataset import read_shards

    shards = read_shards(out)
    api = Explainer(CNN, method="integrated-gradients", n_steps=8).explain(X)
    np.testing.assert_allclose(shards["relevance"], api.relevance, rtol=1e-6, atol=f32_tol(api.relevance))
    np.testing.assert_array_equal(shards["targets"], api.target)
    result = CliRunner().invoke(main, args[:-1] + ["4"])  # other options: not a resume of this run
    assert result.exit_code == 2 and "another composite" in result.stderr, result.stderr
