"""``rewrite --method`` on models with several inputs: the written file, run in plain onnxruntime, takes the model's
inputs (integer / bool ones fed through to every stacked copy, as explain --method holds them) and returns one
``lrp/relevance/<input>`` per float input. Checked against captum 0.9's stored results (BERT at ``inputs_embeds``
with its padding attention mask: tests/goldens/methods/real_methods.npz; a model with two float inputs:
two_inputs.npz; <= 1e-5 relative L2, occlusion to float rounding) and against ``Explainer(method=...)`` / the
Attributor on the same model (RISE, SmoothGrad over a composite). No torch: the goldens are committed."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import onnx_lrp
from onnx_lrp.methods import Attributor
from onnx_lrp.methods.ingraph import method_model
from test_methods_real_exports import _case, model_bytes
from util import GOLDENS, assert_cli_refuses, cli, make_model, node, rel_l2, stored_options, to_bytes

TWO_MODEL = str(GOLDENS / "methods" / "two_inputs.onnx")
TWO = np.load(GOLDENS / "methods" / "two_inputs.npz")
U, V, T2 = TWO["u"].astype(np.float32), TWO["v"].astype(np.float32), TWO["target"].astype(np.int64)


def _run(model: bytes, feeds: dict) -> dict:
    s = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in s.get_outputs()], s.run(None, feeds)))


def _inputs(model: bytes) -> list:
    return [i.name for i in onnx.load_from_string(model).graph.input]


@pytest.fixture(scope="module")
def bert() -> bytes:
    return model_bytes("bert")


# (golden key, the written model's extra feeds from the case's options (popped: fed, not built in))
BERT_CASES = [("bert/saliency", lambda o: {}), ("bert/ig_gausslegendre", lambda o: {}),
              ("bert/smoothgrad", lambda o: {"lrp/noise": o.pop("noise")}), ("bert/occlusion_0", lambda o: {})]


@pytest.mark.parametrize("key,fed", BERT_CASES, ids=[c[0] for c in BERT_CASES])
def test_bert_with_its_mask_held_is_captums(bert, key, fed):
    _, method, options, inputs, target, ref, tol = _case(key)
    extra = fed(options)
    written = method_model(bert, method, **options)
    assert _inputs(written) == ["inputs_embeds", "attention_mask", "lrp/target", *extra]
    got = _run(written, {**inputs, "lrp/target": target.astype(np.int64), **extra})
    attribution = got["lrp/relevance/inputs_embeds"]
    assert attribution.shape == ref.shape and attribution.dtype == np.float32
    assert not any(k.startswith("lrp/relevance/attention_mask") for k in got)
    if method == "occlusion":  # the windows built in the graph over the symbolic sequence axis
        np.testing.assert_allclose(attribution, ref, rtol=0, atol=tol)
    else:
        assert rel_l2(attribution, ref) <= tol
    np.testing.assert_array_equal(got["lrp/target_used"], target)
    plain = _run(bert, inputs)["logits"]
    np.testing.assert_allclose(got["logits"], plain, rtol=1e-5, atol=1e-6)


def test_bert_rise_holds_the_mask_as_the_explainer(bert):
    """RISE with the masks fed (lrp/masks) equals Explainer(method="rise") given them; a different mask changes
    the result as it changes the Explainer's (the mask is fed through, not baked in)."""
    _, _, _, inputs, target, _, _ = _case("bert/occlusion_0")
    masks = (np.random.default_rng(3).random((6, 32)) < 0.5).astype(np.float32)
    written = method_model(bert, "rise", probability=0.5)
    got = _run(written, {**inputs, "lrp/target": target, "lrp/masks": masks})["lrp/relevance/inputs_embeds"]
    ref = onnx_lrp.Explainer(bert, method="rise", masks=masks, probability=0.5).explain(inputs, target=target)
    np.testing.assert_allclose(got, ref.relevance, rtol=1e-5, atol=np.abs(ref.relevance).max() * 1e-6)
    other = {**inputs, "attention_mask": np.ones_like(inputs["attention_mask"])}
    moved = _run(written, {**other, "lrp/target": target, "lrp/masks": masks})["lrp/relevance/inputs_embeds"]
    ref = onnx_lrp.Explainer(bert, method="rise", masks=masks, probability=0.5).explain(other, target=target)
    atol = np.abs(ref.relevance).max() * 1e-6
    np.testing.assert_allclose(moved, ref.relevance, rtol=1e-5, atol=atol)
    assert np.abs(moved[1] - got[1]).max() > 100 * atol  # the second item was padded: unpadding it changes it


def _f32(a):
    return np.asarray(a, np.float32)


def test_two_float_inputs_give_one_attribution_each_as_captum():
    """saliency (no extra input), IG with the baselines as inputs lrp/baselines/<input>, SmoothGrad with the noise
    as a constant, GradientSHAP with its draws and noise fed (lrp/noise/<input>): captum's stored result and the
    Explainer's for each input."""
    ig = stored_options(TWO, "ig")
    shap = stored_options(TWO, "gradient_shap")
    cases = {
        "saliency": ("gradient", {}, False, {}),
        "ig": ("integrated-gradients", {"n_steps": ig["n_steps"]}, True,
               {f"lrp/baselines/{k}": _f32(np.broadcast_to(b, a.shape)) for k, b, a in
                zip("uv", ig["baselines"], (U, V))}),
        "smoothgrad": ("smoothgrad", stored_options(TWO, "smoothgrad"), False, {}),
        "gradient_shap": ("gradient-shap", {"baselines": shap["baselines"], "stdevs": 0.1}, False,
                          {"lrp/noise/u": _f32(shap["noise"][0]), "lrp/noise/v": _f32(shap["noise"][1]),
                           "lrp/baseline_indices": shap["baseline_indices"].astype(np.int64),
                           "lrp/alphas": _f32(shap["alphas"])}),
    }
    for case, (method, options, baseline_input, fed) in cases.items():
        written = method_model(TWO_MODEL, method, baseline_input, **options)
        assert _inputs(written)[:3] == ["u", "v", "lrp/target"] and set(_inputs(written)[3:]) == set(fed), case
        got = _run(written, {"u": U, "v": V, "lrp/target": T2, **fed})
        ex = onnx_lrp.Explainer(TWO_MODEL, method=method, **stored_options(TWO, case)).explain(
            {"u": U, "v": V}, target=T2)
        for k in "uv":
            attribution = got[f"lrp/relevance/{k}"]
            assert attribution.shape == TWO[f"{case}/ref/{k}"].shape, (case, k)
            assert rel_l2(attribution, TWO[f"{case}/ref/{k}"]) <= 1e-5, (case, k)
            assert rel_l2(attribution, ex.relevance[k]) <= 1e-5, (case, k)


def test_gradient_x_input_and_vargrad_on_two_inputs_are_the_explainers():
    noise = (np.random.default_rng(5).normal(0, 0.3, (4,) + U.shape).astype(np.float32),
             np.random.default_rng(6).normal(0, 0.3, (4,) + V.shape).astype(np.float32))
    for method, options, fed in (("gradient-x-input", {}, {}),
                                 ("vargrad", {"nt_samples": 4}, {"lrp/noise/u": noise[0], "lrp/noise/v": noise[1]})):
        got = _run(method_model(TWO_MODEL, method, **options), {"u": U, "v": V, "lrp/target": T2, **fed})
        given = {"noise": noise} if fed else {}
        ref = onnx_lrp.Explainer(TWO_MODEL, method=method, **given, **options).explain(
            (U, V), target=T2).relevance
        for k in "uv":
            assert rel_l2(got[f"lrp/relevance/{k}"], ref[k]) <= 1e-5, (method, k)


N, S, D, C = 2, 5, 4, 3
W = np.random.default_rng(0).standard_normal((D, C)).astype(np.float32)
MASK = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], np.int64)
X = np.random.default_rng(1).standard_normal((N, S, D)).astype(np.float32)


def masked() -> bytes:
    """y = sum_t (x * mask)[:, t] @ W + 0.1: the integer mask the model's first input."""
    nodes = [node("Cast", ["mask"], "m", to=1), node("Unsqueeze", ["m", "two"], "mu"), node("Mul", ["x", "mu"], "h"),
             node("ReduceSum", ["h", "one"], "s", keepdims=0), node("MatMul", ["s", "W"], "z"),
             node("Add", ["z", "b"], "y")]
    return to_bytes(make_model(nodes, {"mask": (["N", S], np.int64), "x": ["N", S, D]}, ["y"],
                               {"W": W, "b": np.full(C, 0.1, np.float32), "one": np.array([1], np.int64),
                                "two": np.array([2], np.int64)}))


def test_smoothgrad_over_a_composite_holds_the_mask():
    """SmoothGrad over LRP-epsilon in the graph, the mask held: the Attributor's with the same noise."""
    model = masked()
    noise = np.random.default_rng(2).normal(0, 0.5, (3, N, S, D)).astype(np.float32)
    written = method_model(model, "smoothgrad", base="epsilon", nt_samples=3)
    assert _inputs(written) == ["mask", "x", "lrp/target", "lrp/noise"]
    got = _run(written, {"mask": MASK, "x": X, "lrp/target": np.array([0, 2]), "lrp/noise": noise})
    ref = Attributor(model, "smoothgrad", base="epsilon", noise=noise, nt_samples=3).attribute(
        {"mask": MASK, "x": X}, np.array([0, 2]))
    assert rel_l2(got["lrp/relevance/x"], ref["x"]) <= 1e-5
    assert np.all(got["lrp/relevance/x"][1, 3:] == 0)  # the padded steps: the mask reached every noisy copy


def test_occlusion_over_two_float_inputs_is_captums(tmp_path):
    """Each float input occluded in turn with its own window, the other as given (captum's semantics), all the
    windows in one batched forward: captum's stored result to float rounding, the Explainer's exactly; the command
    line writes it and names the per-input parts of SmoothGrad; RISE over two float inputs is refused in one line."""
    options = {"sliding_window_shapes": ((2,), (1, 3)), "strides": ((1,), (1, 2)), "baselines": (0.1, -0.2)}
    got = _run(method_model(TWO_MODEL, "occlusion", **options), {"u": U, "v": V, "lrp/target": T2})
    ex = onnx_lrp.Explainer(TWO_MODEL, method="occlusion", **options).explain((U, V), target=T2).relevance
    for k in "uv":
        ref = TWO[f"occlusion/ref/{k}"]
        np.testing.assert_allclose(got[f"lrp/relevance/{k}"], ref, rtol=0, atol=np.abs(ref).max() * 4e-6)
        np.testing.assert_allclose(got[f"lrp/relevance/{k}"], ex[k], rtol=1e-6, atol=np.abs(ref).max() * 1e-7)
    out = tmp_path / "r.onnx"
    assert_cli_refuses(["rewrite", TWO_MODEL, "--method", "rise", "--n-masks", "4", "-o", out], tmp_path,
                       "rewrite --method rise perturbs one float input, the integer ones held; the model has 2 (u, v)")
    r = cli("rewrite", TWO_MODEL, "--method", "smoothgrad", "--nt-samples", "2", "-o", tmp_path / "s.onnx")
    assert r.exit_code == 0, r.output
    assert "lrp/noise/u (samples x N x an item's shape), lrp/noise/v" in r.stdout
    r = cli("rewrite", TWO_MODEL, "--method", "occlusion", "--sliding-window-shapes", "2;1,3", "--strides", "1;1,2",
            "-o", tmp_path / "o.onnx")
    assert r.exit_code == 0, r.output
    cli_got = _run((tmp_path / "o.onnx").read_bytes(), {"u": U, "v": V, "lrp/target": T2})
    ref = onnx_lrp.Explainer(TWO_MODEL, method="occlusion", sliding_window_shapes=((2,), (1, 3)),
                             strides=((1,), (1, 2))).explain((U, V), target=T2).relevance
    np.testing.assert_allclose(cli_got["lrp/relevance/v"], ref["v"], rtol=1e-6, atol=np.abs(ref["v"]).max() * 1e-7)


def test_seeded_noise_and_background_inputs_on_two_inputs():
    """SmoothGrad drawn in the graph (seed=) with stdevs 1e-30 or 0 is the gradient of each input; Expected Gradients with
    the background set as inputs lrp/baselines/<input> is the Explainer's given the same set and draws."""
    grad = onnx_lrp.Explainer(TWO_MODEL, method="gradient").explain((U, V), target=T2).relevance
    for stdevs in (1e-30, 0.0):  # a normal drawn over the packed inputs (1e-30: each sample is the input), none
        got = _run(method_model(TWO_MODEL, "smoothgrad", seed=3, stdevs=stdevs, nt_samples=2),
                   {"u": U, "v": V, "lrp/target": T2})
        for k in "uv":
            assert rel_l2(got[f"lrp/relevance/{k}"], grad[k]) <= 1e-6
    rng = np.random.default_rng(7)
    background = (rng.normal(size=(3, 4)).astype(np.float32), rng.normal(size=(3, 2, 5)).astype(np.float32))
    index, alphas = rng.integers(0, 3, (4, 2)), rng.random((4, 2))
    written = method_model(TWO_MODEL, "expected-gradients", True, n_samples=4)
    assert _inputs(written)[3:] == ["lrp/baselines/u", "lrp/baselines/v", "lrp/baseline_indices", "lrp/alphas"]
    got = _run(written, {"u": U, "v": V, "lrp/target": T2, "lrp/baselines/u": background[0],
                         "lrp/baselines/v": background[1], "lrp/baseline_indices": index,
                         "lrp/alphas": alphas.astype(np.float32)})
    ref = onnx_lrp.Explainer(TWO_MODEL, method="expected-gradients", baselines=background, n_samples=4,
                             baseline_indices=index, alphas=alphas.astype(np.float32)).explain((U, V), target=T2)
    for k in "uv":
        assert rel_l2(got[f"lrp/relevance/{k}"], ref.relevance[k]) <= 1e-5


def conv_with_mask() -> bytes:
    """act = relu(conv(x)) (N x 3 x 4 x 4), its columns masked by an integer mask (N x 4), averaged, then a linear
    head: Grad-CAM at act depends on the mask."""
    rng = np.random.default_rng(4)
    nodes = [node("Conv", ["x", "Wc"], "c", pads=[1, 1, 1, 1]), node("Relu", ["c"], "act"),
             node("Cast", ["mask"], "m", to=1), node("Unsqueeze", ["m", "axes"], "mu"),
             node("Mul", ["act", "mu"], "h"), node("GlobalAveragePool", ["h"], "p"), node("Flatten", ["p"], "f"),
             node("MatMul", ["f", "Wl"], "y")]
    return to_bytes(make_model(nodes, {"x": ["N", 2, 4, 4], "mask": (["N", 4], np.int64)}, ["y"],
                               {"Wc": rng.standard_normal((3, 2, 3, 3)).astype(np.float32),
                                "Wl": rng.standard_normal((3, 3)).astype(np.float32),
                                "axes": np.array([1, 2], np.int64)}))


def test_grad_cam_with_a_held_mask_is_the_explainers():
    model = conv_with_mask()
    x = np.random.default_rng(5).standard_normal((2, 2, 4, 4)).astype(np.float32)
    mask = np.array([[1, 1, 1, 1], [1, 0, 1, 0]], np.int64)
    written = method_model(model, "grad-cam", layer="act")
    assert _inputs(written) == ["x", "mask", "lrp/target"]
    got = _run(written, {"x": x, "mask": mask, "lrp/target": np.array([0, 2])})["lrp/relevance/x"]
    ref = onnx_lrp.Explainer(model, method="grad-cam", layer="act").explain({"x": x, "mask": mask}, target=[0, 2])
    assert got.shape == (2, 1, 4, 4)
    np.testing.assert_allclose(got, ref.relevance, rtol=1e-5, atol=np.abs(ref.relevance).max() * 1e-6)
    assert rel_l2(got[1], _run(written, {"x": x, "mask": np.ones_like(mask),
                                         "lrp/target": np.array([0, 2])})["lrp/relevance/x"][1]) > 1e-2
