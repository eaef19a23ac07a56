"""onnx_lrp.methods on the real torch classes of issue 36 against captum 0.9, from the stored goldens
(tests/goldens/methods/real_*, written by scripts/make_real_method_goldens.py): torchvision's resnet18 with BatchNorm
(3 x 64 x 64; exported by torch.onnx's TorchScript exporter, opset 17, and by its dynamo exporter, opset 18),
transformers' BertForSequenceClassification attributed at ``inputs_embeds`` with a padding attention mask and an
nn.LSTM classifier (TorchScript exporter). Every gradient method within 1e-5 relative L2 of captum's float32 result,
or 3x captum's own float32 error where that is larger (to float64; to captum on inputs a few float32 steps away);
vargrad against captum in float64; occlusion equal up to the float32 rounding of the outputs; through the Attributor
and through ``Explainer(model, method=...)``. ResNet18's big weights are not stored: each is a :func:`unit` draw
times a stored scale per output channel, put back here."""
from __future__ import annotations

import json
from functools import lru_cache

import numpy as np
import pytest

from util import GOLDENS as ALL_GOLDENS, f32_tol

GOLDENS = ALL_GOLDENS / "methods"
TOL = 1e-5


def unit(seed: int, shape) -> np.ndarray:
    """Uniform float32 values in [-1, 1) on a 2^-23 grid, from a counter-based generator (splitmix64 of the entry's
    index and ``seed``): the same on every platform and numpy version."""
    n = int(np.prod(shape))
    with np.errstate(over="ignore"):
        z = np.arange(n, dtype=np.uint64) + np.uint64(seed) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z ^= z >> np.uint64(31)
    return ((z >> np.uint64(40)).astype(np.float32) * np.float32(2.0 ** -23) - np.float32(1)).reshape(shape)


@lru_cache(maxsize=1)
def _data():
    data = np.load(GOLDENS / "real_methods.npz")
    return data, json.loads(str(data["index"]))


#: the cases run by default (CI's time): through the Attributor every BERT and LSTM case and two of ResNet18's
#: (each builds the relevance model of its 11.7 M weights, ~1.5 s), through the Explainer one per method; every
#: case both ways with ONNX_LRP_SLOW=1
DEFAULT = {"attributor": {"bert/", "lstm/", "resnet18/gradient_shap", "resnet18/grad_cam_1"},
           "explainer": {"bert/ig_gausslegendre", "bert/smoothgrad_sq", "bert/expected_gradients", "lstm/saliency",
                         "lstm/ixg", "lstm/vargrad", "lstm/gradient_shap", "lstm/occlusion_1", "resnet18/occlusion_0"}}


def _cases(path: str) -> list:
    keys = sorted(k for k in _data()[1] if "/" in k)
    return [k if any(k.startswith(d) for d in DEFAULT[path]) else pytest.param(k, marks=pytest.mark.slow)
            for k in keys]


def _f32(a):
    return a.astype(np.float32) if a.dtype == np.float16 else a


def _rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@lru_cache(maxsize=None)
def model_bytes(net: str) -> bytes:
    """The stored export with its drawn weights put back."""
    import onnx
    from onnx import numpy_helper

    data, index = _data()
    model = onnx.load(GOLDENS / f"real_{net}.onnx")
    for name, spec in index[net]["drawn"].items():
        scale = data[f"{net}/drawn/{name}"]
        w = unit(spec["seed"], spec["shape"]) * scale.reshape((-1,) + (1,) * (len(spec["shape"]) - 1))
        model.graph.initializer.append(numpy_helper.from_array(w, name))
    return model.SerializeToString()


def _case(key):
    data, index = _data()
    net, case = key.split("/")[0], index[key]
    src = index[net].get("same_as", net)  # the dynamo export: the TorchScript export's inputs and references
    options = {**case["options"], **{name: _f32(data[stored]) for name, stored in case["arrays"].items()}}
    x = _f32(data[f"{src}/x"])
    feeds = {name: data[f"{src}/feed/{name}"] for name in index[net]["feeds"]}
    inputs = {index[net]["inputs"][0]: x, **feeds} if feeds else x
    # 3x captum's own float32 error: to float64, and to captum on inputs a few float32 steps away (a ReLU whose input
    # is 0 within float32 rounding at a point of the path flips there, in captum as between torch's and onnxruntime's
    # kernels); vargrad (E[g^2] - E[g]^2 cancels in float32) against captum in float64
    tol = TOL if case["ref64"] else max(TOL, 3 * case["ulp_distance"], 3 * case["f64_distance"])
    if case["method"] == "occlusion":  # the float32 rounding of the outputs whose differences it sums
        tol = np.abs(data[case["ref"]]).max() * 4e-6 + f32_tol(data[f"{src}/logits"], 8)
    return net, case["method"], options, inputs, data[f"{src}/target"], data[case["ref"]], tol


def _check(method, got, ref, tol):
    assert got.shape == ref.shape and got.dtype == np.float32
    if method == "occlusion":
        np.testing.assert_allclose(got, ref, rtol=0, atol=tol)
    else:
        assert _rel(got, ref) <= tol, _rel(got, ref)


def _one(result, net):
    return result[_data()[1][net]["inputs"][0]] if isinstance(result, dict) else result


@pytest.mark.parametrize("key", _cases("attributor"))
def test_attributor_matches_captum(key):
    from onnx_lrp.methods import Attributor

    net, method, options, inputs, target, ref, tol = _case(key)
    got = Attributor(model_bytes(net), method, **options).attribute(inputs, target)
    _check(method, _one(got, net), ref, tol)


@pytest.mark.parametrize("key", _cases("explainer"))
def test_explainer_matches_captum(key):
    from onnx_lrp import Explainer

    net, method, options, inputs, target, ref, tol = _case(key)
    e = Explainer(model_bytes(net), method=method, **options).explain(inputs, target=target)
    _check(method, _one(e.relevance, net), ref, tol)
    assert np.array_equal(e.target, target)


def test_goldens_cover_the_models_and_methods():
    """Every method of the issue on each of the three real models; Grad-CAM at two ResNet stages."""
    index = _data()[1]
    gradient = {"gradient", "gradient-x-input", "integrated-gradients", "smoothgrad", "vargrad", "gradient-shap",
                "expected-gradients", "occlusion"}
    for net in ("resnet18", "bert", "lstm"):
        methods = {c["method"] for k, c in index.items() if k.startswith(f"{net}/")}
        assert methods == gradient | ({"grad-cam"} if net == "resnet18" else set()), net
    assert sum(k.startswith("resnet18/grad_cam") for k in index) == 2
    assert {c["method"] for k, c in index.items() if k.startswith("resnet18_dynamo/")} == {
        "gradient", "integrated-gradients", "gradient-shap", "vargrad", "grad-cam", "occlusion"}
    for net in ("resnet18", "resnet18_dynamo"):  # 20 convolutions (their BatchNorms folded in) and the head
        assert len(index[net]["drawn"]) == 21


def test_a_window_per_input_for_a_model_with_a_mask_refused_in_one_line():
    """BERT with its attention mask: occlusion holds the integer mask as given (captum's additional forward
    argument), so a window for the mask as well is one too many: refused in one line naming the occluded input."""
    from onnx_lrp import InputError
    from onnx_lrp.methods import Attributor

    net, _, options, inputs, target, _, _ = _case("bert/occlusion_0")
    attr = Attributor(model_bytes(net), "occlusion", sliding_window_shapes=((1, 32), (1,)), strides=((1, 32), (1,)))
    with pytest.raises(InputError) as exc:
        attr.attribute(inputs, target)
    assert "per occluded input (inputs_embeds: the float inputs" in str(exc.value) and "\n" not in str(exc.value)
