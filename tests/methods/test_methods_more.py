"""onnx_lrp.methods' expected gradients / GradientSHAP, Grad-CAM and RISE: against captum 0.9's stored results
(tests/goldens/methods/captum_more.npz, written by scripts/make_captum_goldens.py with captum's own random draws
stored and fed back), RISE against a numpy oracle of its formula given the masks (the model's outputs from
onnxruntime's own runs of the original model, one masked input at a time), one live captum check when torch is
present, and the refusals, one line each."""
from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort
import pytest

from onnx_lrp import InputError, LrpError
from onnx_lrp.methods import Attributor, attribute
from onnx_lrp.methods.rise import draw_masks
from onnx_lrp.methods.options import RiseOptions
from util import GOLDENS as ALL_GOLDENS

GOLDENS = ALL_GOLDENS / "methods"
DATA = np.load(GOLDENS / "captum_more.npz")
INDEX = json.loads(str(DATA["index"]))
TOL = 1e-5
CNN = str(GOLDENS / "cnn.onnx")
MLP = str(GOLDENS / "mlp.onnx")


def _rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def _options(key):
    case = INDEX[key]
    return case["method"], {**case["options"], **{name: DATA[f"{key}/{name}"] for name in case["arrays"]}}


@pytest.mark.parametrize("key", sorted(INDEX))
def test_matches_captum_stored(key):
    net = key.split("/")[0]
    method, options = _options(key)
    x, target, ref = DATA[f"{net}/x"], DATA[f"{net}/target"], DATA[f"{key}/ref"]
    got = Attributor(str(GOLDENS / f"{net}.onnx"), method, **options).attribute(x, target)
    assert got.shape == ref.shape and got.dtype == np.float32
    assert _rel(got, ref) <= TOL


def test_goldens_cover_the_new_methods():
    assert {c["method"] for c in INDEX.values()} == {"gradient-shap", "expected-gradients", "grad-cam"}
    assert {c["options"]["interpolate_mode"] for c in INDEX.values() if c["method"] == "grad-cam"} == \
        {"nearest", "bilinear"}


def test_expected_gradients_one_baseline_and_fixed_alpha_is_a_gradient_x_difference():
    """One background row b and alpha 1 at every draw: the gradient at x times (x - b), what gradient-x-input
    gives at x - b shifted: checked against gradient(x) * (x - b)."""
    x = DATA["mlp/x"]
    b = np.full((1,) + x.shape[1:], 0.3, np.float32)
    t = DATA["mlp/target"]
    got = attribute(MLP, x, "expected-gradients", target=t, baselines=b, alphas=np.ones(3))
    g = attribute(MLP, x, "gradient", target=t)
    np.testing.assert_allclose(got, g * (x - 0.3), rtol=1e-5, atol=1e-7)


def test_expected_gradients_seeded_repeats_and_differs_by_seed():
    x, t = DATA["mlp/x"], DATA["mlp/target"]
    bg = np.random.default_rng(0).normal(size=(4, 10)).astype(np.float32)
    a = Attributor(MLP, "expected-gradients", baselines=bg, n_samples=6, seed=3)
    one, two = a.attribute(x, t), a.attribute(x, t)
    np.testing.assert_array_equal(one, two)
    other = attribute(MLP, x, "expected-gradients", target=t, baselines=bg, n_samples=6, seed=4)
    assert _rel(other, one) > 1e-3


def _oracle_rise(model, x, t, masks, p, baseline=0.0):
    """S = sum_i f(x * M_i + b (1 - M_i))[t] M_i / (N p), each masked item run alone in onnxruntime."""
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    m = masks.reshape((masks.shape[0],) + (1,) * (x.ndim - masks.ndim) + masks.shape[1:])
    out = np.zeros((len(x),) + m.shape[1:])
    for j in range(len(x)):
        for i in range(len(m)):
            xi = (x[j] * m[i] + baseline * (1 - m[i])).astype(np.float32)
            out[j] += float(sess.run(None, {name: xi[None]})[0][0, t[j]]) * m[i]
    return out / (len(m) * p)


@pytest.mark.parametrize("net,mask_shape", [("cnn", (8, 8)), ("cnn", (3, 8, 8)), ("mlp", (10,))])
def test_rise_is_its_formula_given_the_masks(net, mask_shape):
    x, t = DATA[f"{net}/x"], DATA[f"{net}/target"]
    model = str(GOLDENS / f"{net}.onnx")
    masks = np.random.default_rng(7).random((9,) + mask_shape)
    got = Attributor(model, "rise", masks=masks, probability=0.4, baselines=0.1,
                     internal_batch_size=4).attribute(x, t)  # 4 rows a run: chunks cut through the masks
    ref = _oracle_rise(model, x, t, masks, 0.4, baseline=0.1)
    assert got.shape == ref.shape == (len(x),) + (1,) * (x.ndim - 1 - len(mask_shape)) + mask_shape
    np.testing.assert_allclose(got, ref, rtol=2e-6, atol=np.abs(ref).max() * 4e-6)


def test_rise_drawn_masks_as_the_paper_draws_them():
    masks = draw_masks((8, 8), RiseOptions(n_masks=400, probability=0.3, cells=4, seed=5))
    assert masks.shape == (400, 8, 8) and masks.min() >= 0 and masks.max() <= 1
    np.testing.assert_allclose(masks.mean(), 0.3, atol=0.03)  # E[M] = p: the normalisation's premise
    assert len(np.unique(masks)) > 2  # bilinear upsampling: smooth masks
    x, t = DATA["cnn/x"], DATA["cnn/target"]
    a = attribute(CNN, x, "rise", target=t, n_masks=20, cells=4, seed=5)
    np.testing.assert_array_equal(a, attribute(CNN, x, "rise", target=t, n_masks=20, cells=4, seed=5))
    whole = attribute(CNN, x, "rise", target=t, n_masks=3, probability=1.0, seed=1)  # every cell kept: f(x)
    sess = ort.InferenceSession(CNN, providers=["CPUExecutionProvider"])
    fx = sess.run(None, {"x": x})[0][np.arange(len(x)), t]
    np.testing.assert_allclose(whole, np.broadcast_to(fx.reshape(-1, 1, 1, 1), whole.shape), rtol=1e-5)


def test_refusals_one_line():
    x = DATA["cnn/x"]
    cases = [
        (lambda: Attributor(CNN, "expected-gradients"), "needs baselines="),
        (lambda: attribute(CNN, x, "gradient-shap", baselines=np.zeros((2, 3, 4, 4), np.float32)),
         "background set"),
        (lambda: Attributor(CNN, "gradient-shap", baselines=np.zeros((2, 3, 8, 8)), n_samples=3, alphas=np.ones(2)),
         "samples disagree"),
        (lambda: Attributor(CNN, "gradient-shap", baselines=np.zeros((2, 3, 8, 8)), alphas=np.full(2, 1.5)),
         "alphas must lie in [0, 1]"),
        (lambda: Attributor(CNN, "grad-cam"), "needs layer="),
        (lambda: Attributor(CNN, "grad-cam", layer="nope"), "'nope' is not a tensor"),
        (lambda: attribute(CNN, x, "grad-cam", layer="/Flatten_output_0"), "not N x C x spatial"),
        (lambda: Attributor(CNN, "grad-cam", layer="/conv2/Conv_output_0", interpolate_mode="cubic"),
         "interpolate_mode must be"),
        (lambda: attribute(CNN, x, "rise", masks=np.ones((2, 5, 5))), "masks have shape"),
        (lambda: Attributor(CNN, "rise", probability=0.0), "probability must be"),
        (lambda: Attributor(CNN, "rise", masks=np.full((2, 8, 8), 2.0)), "masks must lie in [0, 1]"),
    ]
    for call, words in cases:
        with pytest.raises(LrpError) as exc:
            call()
        assert isinstance(exc.value, InputError)
        assert words in str(exc.value) and "\n" not in str(exc.value), str(exc.value)


def test_live_against_captum():
    """One live check each (expected gradients with noise, Grad-CAM) on the stored models' torch twins."""
    torch = pytest.importorskip("torch")
    captum_attr = pytest.importorskip("captum.attr")
    from captum_nets import seeded_cnn
    cnn = seeded_cnn()
    x, t = DATA["cnn/x"], DATA["cnn/target"]
    bg = np.random.default_rng(8).normal(size=(3,) + x.shape[1:]).astype(np.float32)
    torch.manual_seed(9)
    np.random.seed(9)
    ref = captum_attr.GradientShap(cnn).attribute(torch.tensor(x), baselines=torch.tensor(bg), n_samples=3,
                                                  stdevs=0.1, target=torch.tensor(t)).detach().numpy()
    torch.manual_seed(9)
    noise = torch.normal(0, torch.tensor(0.1).repeat((len(x) * 3,) + x.shape[1:])).numpy()
    np.random.seed(9)
    index, alphas = np.random.choice(3, 3 * len(x)), np.random.uniform(0.0, 1.0, 3 * len(x))
    got = attribute(CNN, x, "gradient-shap", target=t, baselines=bg,
                    noise=noise.reshape((len(x), 3) + x.shape[1:]).swapaxes(0, 1),
                    baseline_indices=index.reshape(len(x), 3).T, alphas=alphas.reshape(len(x), 3).T)
    assert _rel(got, ref) <= TOL
    cam = captum_attr.LayerGradCam(cnn, cnn.conv2).attribute(torch.tensor(x), target=torch.tensor(t))
    ref = captum_attr.LayerAttribution.interpolate(cam, (8, 8)).detach().numpy()
    got = attribute(CNN, x, "grad-cam", target=t, layer="/conv2/Conv_output_0")
    assert _rel(got, ref) <= TOL


def _conv_gap_model():
    """x -> Conv -> Identity ("ident") -> Relu ("r") -> GlobalAveragePool -> Flatten -> MatMul F: y."""
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    w, f = rng.normal(size=(4, 3, 3, 3)).astype(np.float32), rng.normal(size=(4, 2)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "W"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Identity", ["c"], ["ident"], name="id"),
             helper.make_node("Relu", ["ident"], ["r"], name="relu"),
             helper.make_node("GlobalAveragePool", ["r"], ["p"], name="gap"),
             helper.make_node("Flatten", ["p"], ["flat"], name="flatten"),
             helper.make_node("MatMul", ["flat", "F"], ["y"], name="mm")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 6, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])],
                              [numpy_helper.from_array(w, "W"), numpy_helper.from_array(f, "F")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model.SerializeToString(), f


def test_grad_cam_numpy_oracle_and_folded_layer_refused():
    """After a global average pool and a linear head the gradient at r is F[c, t] / (H W) everywhere: Grad-CAM is
    sum_c F[c, t] / (H W) * r_c (r from onnxruntime); a tensor the loader folds away (an Identity's output) is
    refused in one line naming it."""
    model, f = _conv_gap_model()
    x = np.random.default_rng(3).normal(size=(2, 3, 6, 6)).astype(np.float32)
    t = np.array([0, 1])
    import onnx
    m = onnx.load_from_string(model)
    m.graph.output.extend([onnx.helper.make_tensor_value_info("r", onnx.TensorProto.FLOAT, None)])
    probe = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    r = probe.run(["r"], {"x": x})[0].astype(np.float64)
    ref = np.einsum("nc,nchw->nhw", f[:, t].T / 36.0, r)[:, None]
    got = attribute(model, x, "grad-cam", target=t, layer="r", interpolate_mode="none")
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-7)
    with pytest.raises(InputError) as exc:
        Attributor(model, "grad-cam", layer="ident")
    assert "'ident' is not in the model as the methods load it" in str(exc.value) and "\n" not in str(exc.value)


def _masked_model():
    """y = tanh((x * mask) W): a float input x (N x 4) and an integer mask (N x 4), as an embeddings + attention
    mask export."""
    from onnx import TensorProto, helper, numpy_helper
    w = np.random.default_rng(4).normal(size=(4, 3)).astype(np.float32)
    nodes = [helper.make_node("Cast", ["mask"], ["m"], to=TensorProto.FLOAT, name="cast"),
             helper.make_node("Mul", ["x", "m"], ["xm"], name="masked"),
             helper.make_node("MatMul", ["xm", "W"], ["z"], name="mm"),
             helper.make_node("Tanh", ["z"], ["y"], name="tanh")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4]),
                                           helper.make_tensor_value_info("mask", TensorProto.INT64, ["N", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
                              [numpy_helper.from_array(w, "W")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString(), w


def test_integer_inputs_held_as_given():
    """An integer input beside the float one (a mask) is fed as given to every stacked row of its item and not
    attributed (captum's additional_forward_args): the gradient is W[:, t] mask (1 - tanh(z)^2), numpy's; chunks
    of 3 rows that cut through the items give the same Integrated Gradients."""
    model, w = _masked_model()
    rng = np.random.default_rng(5)
    x = rng.normal(size=(3, 4)).astype(np.float32)
    mask = np.array([[1, 1, 0, 1], [1, 0, 0, 0], [0, 1, 1, 1]])
    t = np.array([0, 2, 1])
    z = (x * mask).astype(np.float64) @ w
    ref = w[:, t].T * mask * (1 - np.tanh(z[np.arange(3), t]) ** 2)[:, None]
    got = attribute(model, {"x": x, "mask": mask}, "gradient", target=t)
    assert sorted(got) == ["x"]
    np.testing.assert_allclose(got["x"], ref, rtol=1e-5, atol=1e-7)
    one = attribute(model, (x, mask), "integrated-gradients", target=t, n_steps=16)[0]
    chunked = attribute(model, (x, mask), "integrated-gradients", target=t, n_steps=16, internal_batch_size=5)[0]
    np.testing.assert_allclose(chunked, one, rtol=1e-6, atol=1e-8)
    assert np.all(one[mask == 0] == 0)
    zt = z[np.arange(3), t]
    np.testing.assert_allclose(one.sum(1), np.tanh(zt), rtol=2e-3, atol=1e-5)  # completeness from baseline 0
