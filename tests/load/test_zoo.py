"""The classic ONNX model zoo shipped in the onnx wheel (onnx/backend/test/data/light): IR 3, opset 9, every
initializer also listed as a graph input, weights made by ConstantOfShape, LRN, Sum, opset-9 Softmax.

* every model is explained: its forward output equals the expected output shipped beside it (for the input the
  onnx backend runner feeds: ``arange(n) / n``), the relevance is finite;
* on the models without LRN (piecewise-linear but for BatchNorm, folded), LRP-epsilon with a negligible epsilon
  is gradient x input: for random u, ``sum(R * u)`` equals the directional derivative of the explained logit along
  ``x * u``, by central differences on the *original* model in onnxruntime (an independent reference).

SqueezeNet, ShuffleNet and Inception v1 run in CI (~10 s); the other six (8-144 M parameters) are slow
(ONNX_LRP_SLOW=1).
"""
from __future__ import annotations

import os

import numpy as np
import onnx
import onnx.numpy_helper as nh
import pytest

import onnx_lrp

from util import assert_close, run

LIGHT = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
FAST = ["squeezenet", "shufflenet", "inception_v1"]
SLOW = ["inception_v2", "resnet50", "densenet121", "bvlc_alexnet", "zfnet512", "vgg19"]
NO_LRN = {"squeezenet", "shufflenet", "inception_v2", "resnet50", "densenet121", "vgg19"}


def _param(names):
    return [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in names]


def _proto(name):
    path = os.path.join(LIGHT, f"light_{name}.onnx")
    if not os.path.exists(path):
        pytest.skip("this onnx wheel ships no light models")
    return path, onnx.load(path)


def _data_input(proto):
    inits = {t.name for t in proto.graph.initializer}
    (x,) = [v for v in proto.graph.input if v.name not in inits]
    return x.name, tuple(d.dim_value or 1 for d in x.type.tensor_type.shape.dim)


def _logits_model(proto):
    """The original model (IR 3 as shipped) with the Softmax's input as its only output."""
    m = onnx.ModelProto()
    m.CopyFrom(proto)
    (sm,) = [n for n in m.graph.node if n.op_type == "Softmax"] or [None]
    name = sm.input[0] if sm is not None else m.graph.output[0].name
    del m.graph.output[:]
    m.graph.output.extend([onnx.helper.make_empty_tensor_value_info(name)])
    return m


@pytest.mark.parametrize("name", _param(FAST + SLOW))
def test_light_model_explained(name):
    path, proto = _proto(name)
    assert proto.ir_version <= 3 and len(proto.graph.input) > 1  # the idiom under test
    x_name, shape = _data_input(proto)
    n = int(np.prod(shape))
    x = (np.arange(n).reshape(shape) / n).astype(np.float32)  # onnx.backend.test.runner's dummy input
    ex = onnx_lrp.Explainer(path, composite="epsilon-plus-flat")
    assert [i.name for i in ex.inputs] == [x_name]
    res = ex.explain(x)
    expected = nh.to_array(onnx.load_tensor(os.path.join(LIGHT, f"light_{name}_output_0.pb")))
    assert_close(res.outputs[ex.explained_output], expected, rtol=1e-3, atol=1e-7)
    assert res.relevance.shape == shape and np.isfinite(res.relevance).all()
    assert np.abs(res.relevance).sum() > 0


@pytest.mark.parametrize("name", _param([n for n in FAST + SLOW if n in NO_LRN]))
def test_light_model_lrp0_is_gradient_times_input(name):
    path, proto = _proto(name)
    x_name, shape = _data_input(proto)
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(np.float32)
    ex = onnx_lrp.Explainer(path, composite="epsilon", epsilon=1e-9)
    res = ex.explain(x)
    t = int(res.target[0])
    logits = _logits_model(proto).SerializeToString()

    def f(v):
        return float(np.float64(run(logits, {x_name: v.astype(np.float32)})[0].reshape(-1)[t]))

    f0 = f(x)
    assert np.isfinite(res.relevance).all()
    left = np.zeros(shape)
    left[..., : shape[-1] // 2] = 1.0
    # directions x * u with u >= 0 (all ones: sum R = <grad, x>; the left half; random weights): signed random u
    # would cancel to ~f / sqrt(n), below what central differences of a float32 forward resolve
    for k, u in enumerate([np.ones(shape), left, rng.uniform(0.0, 2.0, shape)]):
        h = 1e-2
        fd = (f(x + h * x * u) - f(x - h * x * u)) / (2 * h)  # <grad f, x * u>
        lrp = float(np.sum(res.relevance.astype(np.float64) * u))
        assert abs(lrp - fd) <= 1e-2 * abs(fd) + 1e-3 * abs(f0), (k, lrp, fd, f0)


def test_initializer_inputs_and_negative_dims_on_a_hand_made_ir3_model():
    """The two input idioms of old and Paddle exporters on one small model: every initializer also listed as a
    graph input (IR 3), and a dynamic batch written as dim_value -1. LRP-0 on the bias-free ReLU net is
    gradient x input, computed here in numpy; a batch of 3 is explained at once."""
    rng = np.random.default_rng(3)
    w1, w2 = rng.standard_normal((6, 4)).astype(np.float32), rng.standard_normal((3, 6)).astype(np.float32)
    h = onnx.helper
    x_info = h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [-1, 4])
    inits = [nh.from_array(np.ascontiguousarray(w1.T), "w1"), nh.from_array(np.ascontiguousarray(w2.T), "w2")]
    graph = h.make_graph([h.make_node("MatMul", ["x", "w1"], ["a"]), h.make_node("Relu", ["a"], ["r"]),
                          h.make_node("MatMul", ["r", "w2"], ["y"])], "ir3", [x_info] + [
        h.make_tensor_value_info(t.name, onnx.TensorProto.FLOAT, list(t.dims)) for t in inits],
        [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [-1, 3])], initializer=inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 9)])
    model.ir_version = 3
    ex = onnx_lrp.Explainer(model.SerializeToString(), composite="epsilon", epsilon=1e-9)
    assert [(i.name, i.dims) for i in ex.inputs] == [("x", (None, 4))]
    x = rng.standard_normal((3, 4)).astype(np.float32)
    res = ex.explain(x, target=[0, 1, 2])
    a = x @ w1.T
    grad = ((a > 0)[:, None, :] * w2[[0, 1, 2]][:, None, :] @ w1)[:, 0]  # d y_t / d x per item
    assert_close(res.relevance, x * grad, rtol=1e-4, atol=1e-6)
    assert len(model.graph.input) == 3 and model.graph.input[0].type.tensor_type.shape.dim[0].dim_value == -1
