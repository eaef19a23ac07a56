"""onnx_lrp.methods on the parity models of issue 36 against captum 0.9 and zennit 0.5.1, from the stored goldens
(tests/goldens/methods/parity_models.npz and the models' ONNX exports, written by scripts/make_captum_goldens.py
models): a torchvision-ResNet18-shaped network with BatchNorm (gradient, gradient x input, Integrated Gradients,
SmoothGrad, GradientSHAP, Grad-CAM at three stages, occlusion), a BERT-shaped sequence classifier attributed at
its embeddings (LayerNorm and GELU with their true gradients; the same gradient methods, token occlusion), an LSTM
(the same, through its true gradient in time; a bidirectional one refused in one line naming the node), and zennit's
SmoothGrad of EpsilonPlusFlat, SmoothGrad, IntegratedGradients and Occlusion on a plain CNN with the same noise.
Gradient methods within 1e-5 relative L2, occlusion equal up to float32 rounding of the output differences; one
live captum check when torch is present."""
from __future__ import annotations

import json

import numpy as np
import pytest

from onnx_lrp import UnsupportedError
from onnx_lrp.methods import Attributor, attribute
from util import GOLDENS as ALL_GOLDENS, stored_options

GOLDENS = ALL_GOLDENS / "methods"
DATA = np.load(GOLDENS / "parity_models.npz")
INDEX = json.loads(str(DATA["index"]))
TOL = 1e-5


def _f32(a):
    return a.astype(np.float32) if a.dtype == np.float16 else a


def _rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.mark.parametrize("key", sorted(INDEX))
def test_matches_reference(key):
    net = key.split("/")[0]
    case = INDEX[key]
    options = {**case["options"], **{name: _f32(DATA[f"{key}/{name}"]) for name in case["arrays"]}}
    x, target, ref = _f32(DATA[f"{net}/x"]), DATA[f"{net}/target"], DATA[f"{key}/ref"].astype(np.float64)
    got = Attributor(str(GOLDENS / f"{net}.onnx"), case["method"], **options).attribute(x, target)
    assert got.shape == ref.shape and got.dtype == np.float32
    if case["method"] == "occlusion":
        np.testing.assert_allclose(got, ref, rtol=0, atol=np.abs(ref).max() * 4e-6)
    else:
        assert _rel(got, ref) <= TOL


def test_goldens_cover_the_models_and_methods():
    methods = {}
    for key, case in INDEX.items():
        methods.setdefault(key.split("/")[0], set()).add(case["method"])
    gradient = {"gradient", "gradient-x-input", "integrated-gradients", "smoothgrad", "gradient-shap", "occlusion"}
    assert methods["resnet"] == gradient | {"grad-cam"}
    assert methods["bert"] == gradient
    assert methods["lstm"] == gradient
    assert {k for k in INDEX if k.startswith("plain_cnn/zennit")} == {
        "plain_cnn/zennit_smoothgrad_epf", "plain_cnn/zennit_smoothgrad", "plain_cnn/zennit_ig",
        "plain_cnn/zennit_occlusion"}


def test_bidirectional_lstm_gradient_refused_naming_the_node():
    """The LSTM's true gradient is written for the forward direction: a bidirectional one is refused in one line
    naming the node (occlusion still explains it)."""
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    w, r = rng.normal(size=(2, 24, 4)).astype(np.float32), rng.normal(size=(2, 24, 6)).astype(np.float32)
    nodes = [helper.make_node("LSTM", ["x", "W", "R"], ["y"], hidden_size=6, direction="bidirectional", name="bilstm"),
             helper.make_node("ReduceMean", ["y"], ["y_mean"], axes=[0, 1], keepdims=0, name="mean")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, "N", 4])],
                              [helper.make_tensor_value_info("y_mean", TensorProto.FLOAT, ["N", 6])],
                              [numpy_helper.from_array(w, "W"), numpy_helper.from_array(r, "R")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    with pytest.raises(UnsupportedError) as exc:
        Attributor(model, "integrated-gradients")
    message = str(exc.value)
    assert "[bilstm]" in message and "bidirectional" in message and "occlusion" in message and "\n" not in message


def test_live_resnet_against_captum():
    """The ResNet's Integrated Gradients and Grad-CAM live against captum on the torch twin."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("torchvision")
    captum_attr = pytest.importorskip("captum.attr")
    from captum_nets import resnet_small
    net = resnet_small(52)
    x, t = _f32(DATA["resnet/x"]), DATA["resnet/target"]
    X, T = torch.tensor(x), torch.tensor(t)
    ref = captum_attr.IntegratedGradients(net).attribute(X, baselines=0.2, target=T, n_steps=8).detach().numpy()
    got = attribute(str(GOLDENS / "resnet.onnx"), x, "integrated-gradients", target=t, baselines=0.2, n_steps=8)
    assert _rel(got, ref) <= TOL
    layer = INDEX["resnet/grad_cam_0"]["options"]["layer"]
    cam = captum_attr.LayerGradCam(net, net[6]).attribute(X, target=T)
    ref = captum_attr.LayerAttribution.interpolate(cam, x.shape[2:]).detach().numpy()
    assert _rel(attribute(str(GOLDENS / "resnet.onnx"), x, "grad-cam", target=t, layer=layer), ref) <= TOL


TWO = np.load(GOLDENS / "two_inputs.npz")
TWO_CASES = {"saliency": "gradient", "ig": "integrated-gradients", "smoothgrad": "smoothgrad",
             "gradient_shap": "gradient-shap", "occlusion": "occlusion"}
#: the occlusion options scripts/make_captum_goldens.py gave captum: one window, strides and baseline per input
TWO_OCCLUSION = {"sliding_window_shapes": ((2,), (1, 3)), "strides": ((1,), (1, 2)), "baselines": (0.1, -0.2)}


@pytest.mark.parametrize("case", sorted(TWO_CASES))
def test_two_inputs_attributed_as_captum(case):
    """A model with two float inputs: every input attributed at once, a tuple in and out (a dict in, a dict out),
    per-input baselines and noise (occlusion: windows, strides and baselines per input), as captum's."""
    u, v, t = _f32(TWO["u"]), _f32(TWO["v"]), TWO["target"]
    options = TWO_OCCLUSION if case == "occlusion" else stored_options(TWO, case)
    attr = Attributor(str(GOLDENS / "two_inputs.onnx"), TWO_CASES[case], **options)
    got = attr.attribute((u, v), t)
    assert isinstance(got, tuple) and [g.shape for g in got] == [u.shape, v.shape]
    for g, name in zip(got, "uv"):
        ref = TWO[f"{case}/ref/{name}"]
        if case == "occlusion":
            np.testing.assert_allclose(g, ref, rtol=0, atol=np.abs(ref).max() * 4e-6)
        else:
            assert _rel(g, ref) <= TOL
    if case in ("saliency", "occlusion"):
        as_dict = attr.attribute({"v": v, "u": u}, t)
        assert sorted(as_dict) == ["u", "v"] and np.array_equal(as_dict["u"], got[0])
        one = attr.attribute((u[1], v[1]), t[1])
        np.testing.assert_allclose(one[1], got[1][1], rtol=1e-6, atol=np.abs(got[1]).max() * 4e-6)
